"""Span attributes for a request, in the GenAI, OpenInference and Langfuse conventions at once."""

import json
import re
from datetime import UTC, datetime

from spyglass.core.plugin_api import FinishReason, Request
from spyglass.plugins.tracing.message_tools import genai_parts, tool_message_attributes
from spyglass.plugins.tracing.pooling_attributes import (
    pooling_finish_attributes,
    pooling_input_attributes,
    pooling_request_attributes,
)
from spyglass.telemetry.request_context import info_of, operation_name

PROVIDER = "spyglass"


def invocation_parameters(request: Request) -> dict:
    """The sampling parameters a reader of the trace needs, without defaults that say nothing."""
    p = request.sampling_params
    params = {"max_tokens": request.max_tokens, "temperature": p.temperature, "top_p": p.top_p}
    optional = {
        "top_k": p.top_k or None,
        "min_p": p.min_p or None,
        "seed": p.seed,
        "frequency_penalty": p.frequency_penalty or None,
        "presence_penalty": p.presence_penalty or None,
        "repetition_penalty": p.repetition_penalty if p.repetition_penalty != 1.0 else None,
        "stop": list(p.stop) or None,
        "n": p.n if p.n != 1 else None,
        "logprobs": p.logprobs,
        "prompt_logprobs": p.prompt_logprobs,
        "min_tokens": p.min_tokens or None,
        "stop_token_ids": list(p.stop_token_ids) or None,
        # Counts, not the lists: either may hold thousands of entries.
        "num_allowed_token_ids": None if p.allowed_token_ids is None else len(p.allowed_token_ids),
        "num_bad_words": len(p.bad_words) or None,
        # A predicted output's length only: its text is the user's.
        "num_prediction_tokens": None if p.prediction is None else len(p.prediction),
        "include_stop_str_in_output": p.include_stop_str_in_output or None,
        "skip_special_tokens": False if not p.skip_special_tokens else None,
        "truncate_prompt_tokens": p.truncate_prompt_tokens,
        "priority": p.priority or None,  # its place in a priority policy's queue
        # Whether a salt kept the prefix cache apart (why a repeated prompt missed), not the salt.
        "cache_salted": True if p.cache_salt is not None else None,
    }
    params.update({k: v for k, v in optional.items() if v is not None})
    return params


def request_attributes(request: Request, model: str) -> dict:
    """What is known when the request arrives.

    Besides the sampling parameters it reads the keys the HTTP API puts in ``request.attributes``:
    ``operation``, ``stream``, ``user``, ``request_model`` (the model the client named),
    ``api_request_id`` (the response id the client sees), ``tenant``, ``session_id``,
    ``prompt_cache_key`` (OpenAI's: the family of prompts the client says share a prefix),
    ``previous_response_id`` (the Responses API's: the kept response this call continues),
    ``background`` (the Responses API's: no client connection waits on the answer),
    ``service_tier`` (OpenAI's processing tier: GenAI's ``openai.request.service_tier``),
    ``truncated_items`` (the Responses API's: input items ``truncation: "auto"`` dropped),
    ``thinking_budget`` (Anthropic's ``budget_tokens``: the most tokens the answer may think),
    ``metadata`` (the call's, as OpenInference's ``metadata``: JSON) and
    ``preprocess_seconds`` (the call's handling before the engine had it), and the
    HTTP request's id, session header and server address from the context the API captured.
    """
    p = request.sampling_params
    extra = request.attributes
    http = info_of(request)
    attrs = {
        "gen_ai.operation.name": operation_name(request),
        "gen_ai.provider.name": PROVIDER,
        "gen_ai.request.model": extra.get("request_model") or model,
        "gen_ai.response.model": request.lora_name or model,
        "gen_ai.response.id": extra.get("api_request_id") or request.req_id,
        "gen_ai.request.max_tokens": request.max_tokens,
        "gen_ai.request.temperature": p.temperature,
        "gen_ai.request.top_p": p.top_p,
        "gen_ai.usage.input_tokens": request.num_prompt_tokens,
        "openinference.span.kind": "LLM",
        "llm.model_name": model,
        "llm.provider": PROVIDER,
        "llm.invocation_parameters": json.dumps(invocation_parameters(request)),
        "llm.token_count.prompt": request.num_prompt_tokens,
        "spyglass.request.id": request.req_id,
    }
    optional = {
        "gen_ai.request.top_k": p.top_k or None,
        "gen_ai.request.seed": p.seed,
        "gen_ai.request.frequency_penalty": p.frequency_penalty or None,
        "gen_ai.request.presence_penalty": p.presence_penalty or None,
        "gen_ai.request.stop_sequences": list(p.stop) or None,
        "gen_ai.request.choice.count": p.n if p.n != 1 else None,
        "gen_ai.request.stream": extra.get("stream"),
        "server.address": http.server_address if http else None,
        "server.port": http.server_port if http else None,
        "session.id": session_id(request),
        "spyglass.http.request_id": http.request_id if http else None,
        "user.id": extra.get("user"),
        "metadata": metadata_json(request),
        "spyglass.tenant": extra.get("tenant"),
        "spyglass.request.prompt_cache_key": extra.get("prompt_cache_key"),
        "spyglass.request.previous_response_id": extra.get("previous_response_id"),
        "gen_ai.conversation.id": extra.get("conversation_id"),
        "spyglass.request.background": extra.get("background"),
        "spyglass.request.stored": extra.get("stored"),
        "spyglass.request.batch_id": extra.get("batch_id"),
        "spyglass.request.fill_in_middle": extra.get("fill_in_middle"),
        "openai.request.service_tier": extra.get("service_tier"),
        "spyglass.request.truncated_items": extra.get("truncated_items"),
        "spyglass.request.thinking_budget": extra.get("thinking_budget"),
        "spyglass.lora.name": request.lora_name,
        "spyglass.request.images": sum(image.clip is None for image in request.images) or None,
        "spyglass.request.videos": sum(image.clip is not None for image in request.images) or None,
        # Their prompt tokens (tiles and markers): what the images and videos cost the prefill.
        "spyglass.request.image_tokens": sum(image.length for image in request.images) or None,
        # The HTTP call's work before the engine had it (template, tokens, images).
        "spyglass.request.preprocess_seconds": extra.get("preprocess_seconds"),
    }
    attrs.update({k: v for k, v in optional.items() if v is not None})
    attrs.update(response_format_attributes(request))
    attrs.update(tool_attributes(extra.get("tools") or ()))
    if p.pooling is not None:
        return pooling_request_attributes(attrs, request, model)
    return attrs


def response_format_attributes(request: Request) -> dict:
    """The structured-output constraint, if any: its kind, GenAI's ``gen_ai.output.type``, and its spec."""
    spec = request.sampling_params.structured_output
    if spec is None:
        return {}
    attrs = {
        "spyglass.response_format": spec.kind,
        "gen_ai.output.type": "json" if spec.kind in ("json_schema", "json_object") else "text",
    }
    if spec.value is not None:
        attrs["spyglass.response_format.spec"] = (
            spec.value if isinstance(spec.value, str) else json.dumps(spec.value)
        )
    if spec.after_reasoning is not None:  # the constraint holds once the model's thought ends
        attrs["spyglass.response_format.after_reasoning"] = True
    return attrs


def tool_attributes(tools) -> dict:
    """Tool definitions the request offered (the API passes them as OpenAI ``tools`` entries).

    OpenInference's ``llm.tools.{i}.tool.json_schema`` and GenAI's ``gen_ai.tool.definitions``.
    Definitions are the application's, not the user's text, so they are recorded without opt-in.
    """
    if not tools:
        return {}
    attrs = {f"llm.tools.{i}.tool.json_schema": json.dumps(tool) for i, tool in enumerate(tools)}
    attrs["gen_ai.tool.definitions"] = json.dumps(list(tools))
    return attrs


def metadata_json(request: Request) -> str | None:
    """The API call's ``metadata`` as JSON (OpenInference's ``metadata``), or None without any.
    The client's labels for the call, not its content: recorded without opt-in."""
    metadata = request.attributes.get("metadata")
    return json.dumps(metadata, sort_keys=True) if metadata else None


def session_id(request: Request) -> str | None:
    """The client's session: the ``X-Session-Id`` header, else ``session_id`` from the request's metadata."""
    http = info_of(request)
    return (http.session_id if http else None) or request.attributes.get("session_id")


def error_type(error: str | None) -> str:
    """The exception class named in an engine error message (``"... RuntimeError: boom"``), else ``error``."""
    match = re.search(r"\b([A-Z]\w*(?:Error|Exception|Interrupt|Exit))\b", error or "")
    return match.group(1) if match else "error"


def input_content_attributes(request: Request, prompt_text: str) -> dict:
    """Prompt content (only when content tracing is on): chat messages if the API passed them, else the prompt."""
    attrs = {"input.value": prompt_text, "input.mime_type": "text/plain"}
    messages = request.attributes.get("messages")
    if messages:
        attrs["input.value"] = json.dumps(messages)
        attrs["input.mime_type"] = "application/json"
        for i, message in enumerate(messages):
            attrs[f"llm.input_messages.{i}.message.role"] = str(message.get("role", ""))
            attrs[f"llm.input_messages.{i}.message.content"] = _text(message.get("content"))
            attrs.update(_content_parts(i, message.get("content")))
            attrs.update(tool_message_attributes(i, message))
        genai = [
            {"role": m.get("role"), "parts": genai_parts(m, _text(m.get("content")))}
            for m in messages
        ]
    else:
        genai = [{"role": "user", "parts": [{"type": "text", "content": prompt_text}]}]
    attrs["gen_ai.input.messages"] = json.dumps(genai)
    if request.sampling_params.pooling is not None:
        attrs.update(pooling_input_attributes(request, prompt_text))
    return attrs


def output_content_attributes(text: str, reason: FinishReason) -> dict:
    """Completion content (only when content tracing is on)."""
    message = {
        "role": "assistant",
        "parts": [{"type": "text", "content": text}],
        "finish_reason": reason.value,
    }
    return {
        "output.value": text,
        "output.mime_type": "text/plain",
        "llm.output_messages.0.message.role": "assistant",
        "llm.output_messages.0.message.content": text,
        "gen_ai.output.messages": json.dumps([message]),
    }


def _content_parts(index: int, content) -> dict:
    """OpenInference's ``message.contents`` of a message whose content is a list of parts: each
    part's type (``text``, or ``image``: the API keeps no image bytes) and a text part's text."""
    if not isinstance(content, list):
        return {}
    attrs = {}
    for j, part in enumerate(p for p in content if isinstance(p, dict)):
        prefix = f"llm.input_messages.{index}.message.contents.{j}.message_content"
        attrs[f"{prefix}.type"] = str(part.get("type", ""))
        if part.get("type") == "text":
            attrs[f"{prefix}.text"] = str(part.get("text", ""))
    return attrs


def _text(content) -> str:
    """A message's content as text: OpenAI content parts are joined."""
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return "" if content is None else str(content)


def finish_attributes(request: Request, reason: FinishReason) -> dict:
    """Usage and timings, known when the request ends; latencies in seconds (vLLM's attribute names)."""
    times = request.times
    output_tokens = request.num_output_tokens
    attrs = {
        "gen_ai.response.finish_reasons": [reason.value],
        "gen_ai.usage.output_tokens": output_tokens,
        "gen_ai.usage.cache_read.input_tokens": request.num_cached_tokens,
        "llm.token_count.completion": output_tokens,
        "llm.token_count.total": request.num_prompt_tokens + output_tokens,
        "llm.token_count.prompt_details.cache_read": request.num_cached_tokens,
        "spyglass.num_preemptions": request.num_preemptions,
        "gen_ai.latency.e2e": times.finished - times.arrival,
    }
    if request.pooled is not None:
        attrs.update(pooling_finish_attributes(request))
    if request.num_draft_tokens:
        attrs["spyglass.spec.num_draft_tokens"] = request.num_draft_tokens
        attrs["spyglass.spec.num_accepted_tokens"] = request.num_accepted_tokens
        attrs["spyglass.spec.acceptance_rate"] = (
            request.num_accepted_tokens / request.num_draft_tokens
        )
        attrs["spyglass.spec.mean_accepted_length"] = (
            request.num_accepted_tokens / request.num_spec_steps
        )
    if times.first_scheduled:
        attrs["gen_ai.latency.time_in_queue"] = times.first_scheduled - times.arrival
    if times.first_token:
        attrs["gen_ai.latency.time_to_first_token"] = times.first_token - times.arrival
        attrs["gen_ai.response.time_to_first_chunk"] = times.first_token - times.arrival
        attrs["gen_ai.latency.time_in_model_prefill"] = times.first_token - times.first_scheduled
        attrs["gen_ai.latency.time_in_model_decode"] = times.last_token - times.first_token
        if output_tokens > 1:
            attrs["gen_ai.latency.time_per_output_token"] = (
                times.last_token - times.first_token
            ) / (output_tokens - 1)
    if reason is FinishReason.ABORT:
        attrs["error.type"] = (
            "abort"  # the client went away: marked, but not a server error (status unset)
        )
    return attrs


def iso_time(epoch_ns: int) -> str:
    """Epoch nanoseconds as an ISO 8601 UTC timestamp (Langfuse's completion start time)."""
    return datetime.fromtimestamp(epoch_ns / 1e9, tz=UTC).isoformat()
