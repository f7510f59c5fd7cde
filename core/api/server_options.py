"""The HTTP-side settings of ``spyglass serve``, importable without the HTTP stack or the engine."""

from dataclasses import dataclass, field


@dataclass(slots=True)
class ServerOptions:
    """HTTP-side settings of ``spyglass serve``.

    ``api_key`` None means the API is open. ``max_queued_requests`` bounds the engine requests
    (prompts x ``n`` of every call) that wait for their first token before new calls get a 429.
    ``served_model_name`` None means the engine's model name. ``allowed_origins`` enables CORS for
    those origins (``*`` for any); empty means no CORS headers at all. ``engine_process`` runs the
    engine in a child process of its own (`EngineProcess`) instead of a thread of the server's;
    None does so when the engine runs on CUDA (`engine_placement.in_own_process`).
    ``allow_runtime_lora`` opens ``/v1/load_lora_adapter`` and ``/v1/unload_lora_adapter``.
    ``reasoning_parser`` names the plugin format that splits chat and Responses answers into
    reasoning and content (``deepseek_r1``, ``qwen3``, ``mistral``); None leaves answers whole.
    ``tool_call_parser`` names the plugin format that splits answers into content and tool calls
    when a request leaves the choice to the model (built in: ``hermes``, ``llama3_json``, ``mistral``, ``qwen3_coder``,
    ``pythonic``, ``phi4_mini_json``).
    ``allowed_media_domains`` are the hosts whose http(s) image URLs the server fetches (``*``
    for any; empty: none, only ``data:`` URLs), each within ``media_fetch_timeout`` seconds and
    ``max_media_bytes`` bytes. ``trust_request_chat_template`` lets requests bring a chat template
    of their own (vLLM's option; templates run sandboxed, but they are code).
    ``responses_store_size`` is how many Responses API responses the server keeps in memory for
    ``previous_response_id`` and ``GET /v1/responses/{id}`` (the oldest dropped first; 0 keeps
    none). ``response_id_tag`` (a `kept_ids.safe_tag`), set on each replica behind the router,
    names the server in the ids of the responses it makes, so that the router sends what follows
    a response to the replica that keeps it; empty for a server of its own.
    ``chat_completions_store_size`` is how many chat completions made with ``store: true`` the
    server keeps for ``GET /v1/chat/completions`` (the oldest dropped first; 0 keeps none).
    ``conversations_store_size`` is how many conversations (``POST /v1/conversations``) it keeps
    (the least recently used dropped first; 0 keeps none). ``batches_store_size`` is how many
    files (batch inputs and results) and how many batches (``POST /v1/batches``) it keeps, each
    (the oldest dropped first; 0 keeps none).
    """

    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    metrics_require_key: bool = False
    max_body_bytes: int = 4 << 20
    max_queued_requests: int = 1024
    shutdown_timeout: float = 30.0
    served_model_name: str | None = None
    allowed_origins: list[str] = field(default_factory=list)
    engine_process: bool | None = None
    allow_runtime_lora: bool = False
    reasoning_parser: str | None = None
    tool_call_parser: str = "hermes"
    allowed_media_domains: list[str] = field(default_factory=list)
    media_fetch_timeout: float = 10.0
    max_media_bytes: int = 20 << 20
    trust_request_chat_template: bool = False
    responses_store_size: int = 256
    response_id_tag: str = ""
    chat_completions_store_size: int = 256
    conversations_store_size: int = 256
    batches_store_size: int = 64
