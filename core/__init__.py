"""The engine and its surfaces: requests, KV cache, scheduler, model runner, offline API, HTTP API, CLI."""
