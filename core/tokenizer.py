"""Text <-> token ids, and chat messages -> prompt text, for one model."""

import json
from collections.abc import Sequence
from datetime import datetime
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Any

import jinja2
import jinja2.meta
import tokenizers
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # Jinja's own tojson escapes HTML characters, which would change the prompt; HF's does not.
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _template_environment() -> ImmutableSandboxedEnvironment:
    # Same environment options as transformers, so templates render byte-identically. Templates come
    # from model files, i.e. untrusted input, hence the sandbox.
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


@lru_cache(maxsize=32)
def compile_chat_template(source: str) -> jinja2.Template:
    """``source`` compiled as transformers compiles chat templates, in a sandbox; the last few
    are kept (requests may bring their own). jinja2's TemplateSyntaxError where it is not one."""
    return _template_environment().from_string(source)


@lru_cache(maxsize=32)
def template_variables(source: str) -> frozenset[str]:
    """The variables a chat template reads that it does not set itself (``messages``,
    ``enable_thinking``, ...)."""
    env = _template_environment()
    return frozenset(jinja2.meta.find_undeclared_variables(env.parse(source)))


class Tokenizer:
    """A ``tokenizers.Tokenizer`` plus what the model files say about special tokens and chat formatting.

    BOS is handled here rather than by the backend's post-processor, so that every source
    (GGUF metadata, HF directories) behaves the same: ``encode`` never lets the backend add
    special tokens and prepends ``bos_token_id`` itself when ``add_bos_token`` is set.
    """

    def __init__(
        self,
        backend: tokenizers.Tokenizer,
        chat_template: str | None,
        bos_token_id: int | None,
        eos_token_ids: tuple[int, ...],
        add_bos_token: bool,
    ) -> None:
        self._backend = backend
        self._chat_template_source = chat_template
        self._bos_token_id = bos_token_id
        self._eos_token_ids = tuple(eos_token_ids)
        self._add_bos_token = add_bos_token

    def __reduce__(self):
        """Pickle what the constructor takes (the engine process sends its tokenizer to the server), no caches."""
        return (
            Tokenizer,
            (
                self._backend,
                self._chat_template_source,
                self._bos_token_id,
                self._eos_token_ids,
                self._add_bos_token,
            ),
        )

    def with_chat_template(self, chat_template: str) -> "Tokenizer":
        """This tokenizer rendering chats with ``chat_template`` (jinja source) instead."""
        return Tokenizer(
            self._backend,
            chat_template,
            self._bos_token_id,
            self._eos_token_ids,
            self._add_bos_token,
        )

    @property
    def backend(self) -> tokenizers.Tokenizer:
        """The wrapped ``tokenizers.Tokenizer``."""
        return self._backend

    @property
    def chat_template(self) -> str | None:
        """The jinja source of the chat template, or None when the model ships none."""
        return self._chat_template_source

    @property
    def vocab_size(self) -> int:
        """Number of token ids the tokenizer can produce, added tokens included."""
        return self._backend.get_vocab_size(with_added_tokens=True)

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        """Every id that ends a generation."""
        return self._eos_token_ids

    @property
    def bos_token_id(self) -> int | None:
        """The beginning-of-sequence id, or None when the model has none."""
        return self._bos_token_id

    @property
    def add_bos_token(self) -> bool:
        """Whether ``encode`` prepends BOS when asked to add special tokens."""
        return self._add_bos_token

    @cached_property
    def all_special_ids(self) -> tuple[int, ...]:
        """Ids of every special token (control tokens such as ``<|im_end|>``), sorted."""
        return tuple(
            sorted(i for i, tok in self._backend.get_added_tokens_decoder().items() if tok.special)
        )

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids for ``text``; special-token strings inside it map to their ids."""
        ids = self._backend.encode(text, add_special_tokens=False).ids
        if add_special_tokens and self._add_bos_token and self._bos_token_id is not None:
            return [self._bos_token_id, *ids]
        return ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Text for ``ids``."""
        return self._backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    @cached_property
    def _chat_template(self) -> jinja2.Template | None:
        if self._chat_template_source is None:
            return None
        return compile_chat_template(self._chat_template_source)

    def template_reads(self, variable: str) -> bool:
        """Whether the chat template reads ``variable`` (one it does not set itself)."""
        source = self._chat_template_source
        return source is not None and variable in template_variables(source)

    @property
    def template_takes_tools(self) -> bool:
        """Whether the chat template renders tool definitions (HF's ``tools`` variable) itself."""
        return self._chat_template_source is not None and "tools" in self._chat_template_source

    def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
        continue_final_message: bool = False,
        template_kwargs: dict[str, Any] | None = None,
        documents: list[dict[str, Any]] | None = None,
    ) -> str:
        """Render ``messages`` (``[{"role": ..., "content": ...}, ...]``) into prompt text with the model's template.

        ``tools`` (HF's format, ``[{"type": "function", "function": {...}}]``) is passed to templates
        that take it, ``documents`` (``[{"title": ..., "text": ...}]``, for retrieval-augmented
        templates) to every template, as transformers does; ``template_kwargs`` are further
        template variables (``enable_thinking``, say), which may not replace the ones set here.
        ``continue_final_message`` ends the prompt inside the last message, right after its
        content, so that the model carries on writing it (as transformers does). Raises
        ``ValueError`` when the model ships no chat template, and when the last message's content
        cannot be found in the rendered text.
        """
        template = self._chat_template
        if template is None:
            raise ValueError(
                "This model has no chat template, so chat messages cannot be formatted; "
                "send a plain text prompt (completions API) instead."
            )
        variables = {
            "messages": messages,
            "add_generation_prompt": add_generation_prompt,
            "tools": tools,
            "documents": documents,
            "bos_token": self._token_text(self._bos_token_id),
            "eos_token": self._token_text(self._eos_token_ids[0] if self._eos_token_ids else None),
        }
        if clashing := sorted(set(template_kwargs or {}) & set(variables)):
            raise ValueError(f"chat template variables cannot be replaced: {', '.join(clashing)}")
        text = template.render(**variables, **(template_kwargs or {}))
        if not continue_final_message:
            return text
        final = (messages[-1].get("content") or "") if messages else ""
        if isinstance(final, list):  # content parts: the text of the last one
            final = next(
                (p.get("text", "") for p in reversed(final) if p.get("type") == "text"), ""
            )
        # As written first (a trailing space the model should follow stays), then as templates
        # that trim messages render it.
        for content in (final, final.strip()):
            if content and (start := text.rfind(content)) >= 0:
                return text[: start + len(content)]
        raise ValueError("the last message's content must be non-empty text the template keeps")

    def _token_text(self, token_id: int | None) -> str:
        # Templates concatenate these, so a missing token has to render as "" rather than None.
        if token_id is None:
            return ""
        return self._backend.id_to_token(token_id) or ""

    @classmethod
    def from_hf_dir(cls, path: str | Path) -> "Tokenizer":
        """Load from a Hugging Face model directory (``tokenizer.json`` and friends)."""
        path = Path(path)
        tokenizer_file = path / "tokenizer.json"
        if not tokenizer_file.is_file():
            raise ValueError(
                f"{path} has no tokenizer.json; only fast (tokenizers-library) tokenizers are supported."
            )
        backend = tokenizers.Tokenizer.from_file(str(tokenizer_file))
        config = _read_json(path / "tokenizer_config.json")

        bos_token_id = _special_token_id(backend, config.get("bos_token"))
        eos_token_ids = _hf_eos_ids(path) or _as_id_tuple(
            _special_token_id(backend, config.get("eos_token"))
        )

        add_bos_token = config.get("add_bos_token")
        if add_bos_token is None:
            # Llama 3 style repos leave the flag out and let the post-processor add BOS; ask it.
            add_bos_token = bos_token_id is not None and backend.encode("").ids[:1] == [
                bos_token_id
            ]

        # A multimodal checkpoint keeps its processor's template beside the tokenizer's
        # (chat_template.jinja in transformers 5, chat_template.json before); that one wins.
        template_file, processor_file = path / "chat_template.jinja", path / "chat_template.json"
        if template_file.is_file():
            chat_template = template_file.read_text()
        elif processor_file.is_file():
            chat_template = _pick_template(_read_json(processor_file).get("chat_template"))
        else:
            chat_template = _pick_template(config.get("chat_template"))
        return cls(backend, chat_template, bos_token_id, eos_token_ids, bool(add_bos_token))


def _read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.is_file() else {}


def _special_token_id(
    backend: tokenizers.Tokenizer, token: str | dict[str, Any] | None
) -> int | None:
    # tokenizer_config.json spells special tokens either as a string or as a serialized AddedToken.
    if isinstance(token, dict):
        token = token.get("content")
    return None if token is None else backend.token_to_id(token)


def _as_id_tuple(value: int | list[int] | None) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, int):
        return (value,)
    return tuple(value)


def _hf_eos_ids(path: Path) -> tuple[int, ...]:
    # generation_config.json is what HF generate() stops on, and often lists more ids (e.g. <|eot_id|>).
    for name in ("generation_config.json", "config.json"):
        ids = _as_id_tuple(_read_json(path / name).get("eos_token_id"))
        if ids:
            return ids
    return ()


def _pick_template(value: str | list[dict[str, Any]] | None) -> str | None:
    # Some repos store several named templates; "default" is the one used for plain chat.
    if isinstance(value, list):
        named = {entry["name"]: entry["template"] for entry in value}
        return named.get("default")
    return value
