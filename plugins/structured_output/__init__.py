"""Structured outputs on llguidance: JSON schemas, any JSON object, regular expressions, choices and grammars.

Registered per engine (the entry point names the class): each engine's instance builds llguidance's
view of its tokenizer once, when its first constrained request arrives (about a second for a
50k-token vocabulary; engines that never see one never pay it), and keeps every distinct spec's
grammar, validated, in a cache, so a schema is compiled once however many requests use it.
Masks of a step's constrained requests are computed in parallel by llguidance's executor, in Rust,
without a Python loop over requests. Why llguidance rather than xgrammar: docs/structured_outputs.md.

JSON may hold any whitespace between its tokens, as vLLM's, but at most
``--plugin-option json_max_whitespace`` characters (64) between two of them: given unbounded
whitespace a weak model can write it until its tokens run out. ``--plugin-option
json_whitespace=compact`` allows only ``", "`` and ``": "`` between items and after keys (vLLM's
``disable_any_whitespace``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from functools import lru_cache
from typing import TYPE_CHECKING

import llguidance

# masks arrive as tensors; the plugin itself (and `spyglass plugins`) loads without torch
if TYPE_CHECKING:
    import torch

from spyglass.core.plugin_api import (
    EngineConfig,
    EngineInfo,
    PluginContext,
    StructuredOutput,
    TokenConstraint,
    Tokenizer,
    hookimpl,
)
from spyglass.plugins.structured_output.structural_tag import structural_tag_rules
from spyglass.telemetry import metrics as m
from spyglass.telemetry import settings as telemetry_settings

_GRAMMAR_CACHE_SIZE = 256
JSON_WHITESPACE = ("flexible", "compact")
"""The values of ``--plugin-option json_whitespace``."""
_COMPACT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
"""llguidance's JSON options for ``json_whitespace=compact``."""
DEFAULT_MAX_WHITESPACE = 64
"""The most whitespace characters flexible JSON holds between two tokens: room for a deeply
indented line, none for a model that would write nothing else."""


def json_options(
    whitespace: str = "flexible", max_whitespace: int = DEFAULT_MAX_WHITESPACE
) -> dict:
    """llguidance's JSON options (a schema's ``x-guidance``) for ``json_whitespace`` and
    ``json_max_whitespace``."""
    if whitespace == "compact":
        return _COMPACT
    pattern = rf"[\x20\x0A\x0D\x09]{{1,{max_whitespace}}}"
    return {"whitespace_flexible": True, "whitespace_pattern": pattern}


class LLGuidanceConstraint(TokenConstraint):
    """One request's llguidance matcher."""

    backend = "llguidance"

    def __init__(self, matcher: llguidance.LLMatcher, executor: llguidance.LLExecutor):
        self.matcher = matcher
        self.executor = executor

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        # Straight into the tensor's memory. (llguidance.torch does the same, but importing it loads
        # torch's compiler stack for one decorator: seconds on every engine start.)
        target = bitmask[row]
        self.matcher.unsafe_compute_mask_ptr(
            target.data_ptr(), target.numel() * target.element_size()
        )

    def accept(self, token_id: int) -> bool:
        return self.matcher.consume_token(token_id)

    def rollback(self, num_tokens: int) -> None:
        self.matcher.rollback(num_tokens)

    def refusal(self) -> str | None:
        return self.matcher.get_error() if self.matcher.is_error() else None

    def num_valid(self, token_ids: Sequence[int]) -> int:
        return self.matcher.validate_tokens(list(token_ids))

    @classmethod
    def fill_bitmasks(cls, constraints, bitmask: torch.Tensor, rows: Sequence[int]) -> None:
        pairs = [
            (constraint.matcher, row) for constraint, row in zip(constraints, rows, strict=True)
        ]
        words = bitmask.shape[1]
        constraints[0].executor.unsafe_compute_mask_ptr(
            pairs, bitmask.data_ptr(), words * 4, bitmask.shape[0]
        )


def grammar_text(spec: StructuredOutput, json_whitespace: dict | None = None) -> str:
    """llguidance's grammar for ``spec`` (its JSON's whitespace as ``json_whitespace``, llguidance's
    options from `json_options`; flexible and bounded when None), after its ``reasoning`` rules
    when it has some; ``ValueError`` when the spec is malformed."""
    json_whitespace = json_whitespace or json_options()
    if spec.kind == "structural_tag":
        rules = structural_tag_rules(spec.value, lambda schema: _spaced(schema, json_whitespace))
        if spec.after_reasoning is None:
            return f"start: st_text\n{rules}"
        return "\n".join(
            ["start: reasoning answer", spec.after_reasoning, "answer: st_text", rules]
        )
    if spec.after_reasoning is not None:
        return "\n".join(
            [
                "start: reasoning answer",
                spec.after_reasoning,
                f"answer: {_answer_rule(spec, json_whitespace)}",
            ]
        )
    if spec.kind in ("json_object", "json_schema"):
        return llguidance.grammar_from("json_schema", json.dumps(_schema(spec, json_whitespace)))
    if spec.kind == "choice":
        _check_choices(spec)
        return llguidance.grammar_from("choice", json.dumps(spec.value))
    if not isinstance(spec.value, str) or not spec.value:
        raise ValueError(f"{spec.kind} must be a non-empty string")
    return llguidance.grammar_from("regex" if spec.kind == "regex" else "grammar", spec.value)


def _schema(spec: StructuredOutput, json_whitespace: dict) -> dict:
    """The JSON schema of a ``json_object`` or ``json_schema`` spec, llguidance's whitespace
    options in it."""
    schema = {"type": "object"} if spec.kind == "json_object" else spec.value
    if not isinstance(schema, dict):
        raise ValueError("the JSON schema must be an object")
    return _spaced(schema, json_whitespace)


def _spaced(schema: dict, json_whitespace: dict) -> dict:
    """``schema`` with llguidance's whitespace options: compact ones over the schema's own
    ``x-guidance``, flexible ones under it (a schema may set its own pattern)."""
    own = schema.get("x-guidance", {})
    if json_whitespace.get("whitespace_flexible"):
        return {**schema, "x-guidance": {**json_whitespace, **own}}
    return {**schema, "x-guidance": {**own, **json_whitespace}}


def _answer_rule(spec: StructuredOutput, json_whitespace: dict) -> str:
    """The body of a Lark rule holding the answer to ``spec`` (not a ``grammar``)."""
    if spec.kind in ("json_object", "json_schema"):
        return f"%json {json.dumps(_schema(spec, json_whitespace))}"
    if spec.kind == "choice":
        _check_choices(spec)
        return " | ".join(json.dumps(choice, ensure_ascii=False) for choice in spec.value)
    if not isinstance(spec.value, str) or not spec.value:
        raise ValueError(f"{spec.kind} must be a non-empty string")
    return "/" + spec.value.replace("/", "\\/") + "/"


def _check_choices(spec: StructuredOutput) -> None:
    if (
        not isinstance(spec.value, list)
        or not spec.value
        or not all(isinstance(c, str) for c in spec.value)
    ):
        raise ValueError("choice must be a non-empty list of strings")


class StructuredOutputPlugin:
    """The built-in structured-output backend of one engine."""

    def __init__(self, context: PluginContext | None = None) -> None:
        self._tokenizer: llguidance.LLTokenizer | None = None
        self._executor: llguidance.LLExecutor | None = None
        self._compile = lru_cache(maxsize=_GRAMMAR_CACHE_SIZE)(self._compile_uncached)
        self._telemetry = telemetry_settings.resolve(context.telemetry if context else None)
        self._series: m.EngineSeries | None = None
        self._compile_seconds = None  # the engine's histogram child, while it runs with metrics on
        options = context.config.plugin_options if context else {}
        whitespace = options.get("json_whitespace", "flexible")
        if whitespace not in JSON_WHITESPACE:
            raise ValueError(
                f"--plugin-option json_whitespace must be one of {JSON_WHITESPACE}, got {whitespace!r}"
            )
        max_whitespace = str(options.get("json_max_whitespace", DEFAULT_MAX_WHITESPACE))
        if not max_whitespace.isdigit() or not 0 < int(max_whitespace) <= 4096:
            raise ValueError(
                "--plugin-option json_max_whitespace must be a whole number from 1 to 4096, "
                f"got {max_whitespace!r}"
            )
        self._json_whitespace = json_options(whitespace, int(max_whitespace))

    @hookimpl
    def spyglass_engine_started(self, info: EngineInfo, config: EngineConfig) -> None:
        """Export this engine's grammar compile times (``spyglass:structured_output_compile_seconds``)."""
        if self._telemetry.metrics:
            self._series = m.EngineSeries(
                self._telemetry.served_model_name or info.model_name, info.engine_id
            )
            self._compile_seconds = self._series.labels(m.STRUCTURED_OUTPUT_COMPILE_TIME)

    @hookimpl
    def spyglass_engine_stopped(self, info: EngineInfo) -> None:
        """Drop the engine's series."""
        if self._series is not None:
            self._series.remove()
            self._series = self._compile_seconds = None

    def _compile_uncached(self, kind: str, value_json: str, after_reasoning: str | None) -> str:
        start = time.perf_counter()
        spec = StructuredOutput(kind, json.loads(value_json), after_reasoning)
        grammar = grammar_text(spec, self._json_whitespace)
        error = llguidance.LLMatcher.validate_grammar(grammar, self._tokenizer)
        if self._compile_seconds is not None:
            self._compile_seconds.observe(time.perf_counter() - start)
        if error and not error.startswith("WARNING"):
            raise ValueError(error)
        return grammar

    @hookimpl
    def spyglass_token_constraint(
        self, spec: StructuredOutput, tokenizer: Tokenizer, vocab_size: int
    ) -> TokenConstraint | None:
        """A fresh matcher for ``spec``, from the cached grammar."""
        if self._tokenizer is None:
            self._tokenizer = llguidance.LLTokenizer(
                tokenizer.backend.to_str(),
                n_vocab=vocab_size,
                eos_token=list(tokenizer.eos_token_ids),
            )
            self._executor = llguidance.LLExecutor(num_threads=2)
        # Keys keep their order: a schema's property order is the order the JSON is generated in.
        grammar = self._compile(spec.kind, json.dumps(spec.value), spec.after_reasoning)
        matcher = llguidance.LLMatcher(self._tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise ValueError(matcher.get_error())
        # Each choice, and the text the grammar forces from the start, must be spelled by tokens
        # the matcher then accepts: a vocabulary missing a byte token (a GGUF's, say) cannot
        # write some characters, and a grammar that needed one would end in a dead end.
        if spec.kind == "choice":
            for choice in spec.value:
                if tokenizer.decode(tokenizer.encode(choice, False)) != choice:
                    raise ValueError(f"this model's vocabulary cannot spell the choice {choice!r}")
        forced = matcher.compute_ff_tokens()
        if matcher.validate_tokens(forced) < len(forced):
            raise ValueError(
                f"this model's vocabulary cannot spell the text it forces ({matcher.compute_ff_bytes()!r})"
            )
        _check_first_token(matcher, set(tokenizer.eos_token_ids))
        return LLGuidanceConstraint(matcher, self._executor)


def _check_first_token(matcher: llguidance.LLMatcher, eos_token_ids: set[int]) -> None:
    """Consume a token the first mask allows, on a copy of the matcher: llguidance's limits on a
    grammar's size (a regex's repetitions, a parser row's items) show when a token is consumed,
    not when it compiles, and a grammar beyond them is a ``ValueError`` here (a 400 when the
    request is added), not a generation that fails at its first token (a 500). A copy, as a
    grammar with a token budget cannot roll a token back."""
    scratch = matcher.deep_copy()
    token = next(_allowed(scratch.compute_bitmask(), eos_token_ids), None)
    if token is not None and not scratch.consume_token(token):
        raise ValueError(scratch.get_error() or "the grammar refuses the first token it allows")


def _allowed(mask: bytes, skipped: set[int]):
    """The token ids ``mask`` (a little-endian bitmask) allows, but ``skipped``, in order."""
    for index, byte in enumerate(mask):
        for bit in range(8) if byte else ():
            token = index * 8 + bit
            if byte >> bit & 1 and token not in skipped:
                yield token
