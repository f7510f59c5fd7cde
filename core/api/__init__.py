"""The OpenAI-compatible HTTP API: a Litestar app around `AsyncEngine`, served by ``spyglass serve``."""
