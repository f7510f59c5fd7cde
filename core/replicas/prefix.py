"""Which replica holds a prompt's prefix: chained hashes over fixed-size blocks of the prompt's text.

The ingress has no tokenizer, so it names the *text* of a request's prompt the way the prefix
cache names token blocks (`spyglass.plugins.prefix_cache`): block ``i`` is a hash of block
``i-1``'s name and its characters, so equal names mean equal text from the very start. The
router remembers which replica each name was last sent to (`PrefixTable`); a replica that
received a block of text has, unless it evicted them since, the KV blocks of its tokens.
"""

import hashlib
from collections import OrderedDict
from collections.abc import Collection
from typing import NamedTuple

import msgspec

BLOCK_CHARS = (
    256  # about 64 tokens of English: coarse enough to be cheap, fine enough for system prompts
)
_NAMESPACE_END = "\x1d"  # after the model's name, then after the cache salt
_SEPARATOR = (
    "\x1e"  # between messages, so that moving text from one message to the next changes the names
)


def _text(content) -> str:
    """The text of a message's ``content``: a string, or the ``text`` of its parts (images etc. ignored)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return ""


def routing_blocks(body: bytes) -> tuple[int, ...]:
    """The names the router matches a request body by: its prompt's prefix blocks (`routing_text`).

    With OpenAI's ``prompt_cache_key`` the key's own name comes first and the blocks chain from it,
    so requests that share a key go where the key went before, however short their prompts, and
    equal prompts under other keys are routed apart (as OpenAI combines the key with the prefix).
    """
    request = json_object(body)
    key = request.get("prompt_cache_key")
    if not isinstance(key, str) or not key:
        return prefix_blocks(routing_text(request))
    seed = hashlib.blake2b(f"prompt_cache_key{_NAMESPACE_END}{key}".encode(), digest_size=8)
    return (
        int.from_bytes(seed.digest(), "little"),
        *prefix_blocks(routing_text(request), seed=seed.digest()),
    )


def json_object(body: bytes) -> dict:
    """A JSON object body, decoded; ``{}`` for anything else."""
    try:
        request = msgspec.json.decode(body)
    except msgspec.DecodeError:
        return {}
    return request if isinstance(request, dict) else {}


def routing_text(request: dict) -> str:
    """The prompt of a decoded OpenAI or Anthropic request body, flattened to text; empty for anything else.

    Chat messages (and Anthropic's ``system``) become ``role: text`` in order; a completion's
    ``prompt`` (an embeddings or Responses call's ``input``) is used as is (the first one of a
    list; token ids as decimal text). A body that
    names a ``model`` (a LoRA adapter's keys and values are its own) or a ``cache_salt`` (its blocks
    are its salt's) starts with them, so such requests share names only with their own kind.
    """
    text = _prompt_text(request)
    model, salt = (request.get(key) for key in ("model", "cache_salt"))
    model, salt = (part if isinstance(part, str) else "" for part in (model, salt))
    if text and (model or salt):
        return f"{model}{_NAMESPACE_END}{salt}{_NAMESPACE_END}{text}"
    return text


def _prompt_text(request: dict) -> str:
    """`routing_text` of a decoded body, without its namespace."""
    parts = []
    if request.get("system") is not None:
        parts.append("system: " + _text(request["system"]))
    messages = request.get("messages")
    if isinstance(messages, list):
        parts += [
            f"{m.get('role', '')}: {_text(m.get('content'))}"
            for m in messages
            if isinstance(m, dict)
        ]
        return _SEPARATOR.join(parts)
    prompt = request.get("prompt", request.get("input"))
    if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
        prompt = prompt[0]
    if isinstance(prompt, list):
        return ",".join(str(token) for token in prompt)
    return prompt if isinstance(prompt, str) else ""


def prefix_blocks(text: str, block_chars: int = BLOCK_CHARS, seed: bytes = b"") -> tuple[int, ...]:
    """The chained 64-bit names of the full ``block_chars`` blocks of ``text`` (a partial last block
    has none), the first one chained from ``seed``."""
    names = []
    parent = seed
    for start in range(0, len(text) - block_chars + 1, block_chars):
        parent = hashlib.blake2b(
            parent + text[start : start + block_chars].encode(), digest_size=8
        ).digest()
        names.append(int.from_bytes(parent, "little"))
    return tuple(names)


class PrefixMatch(NamedTuple):
    """The replica that was sent the longest run of a request's leading blocks, and how many blocks that is."""

    replica: str
    num_blocks: int


class PrefixTable:
    """Block name -> the replica it was last routed to, least recently used names evicted past ``capacity``.

    Contract: `match` only ever answers a replica among the ``live`` ones it is given, so a dead
    replica's entries cost nothing but memory until they are evicted or `forget` drops them.
    """

    def __init__(self, capacity: int = 1 << 16):
        self.capacity = capacity
        self._owners: OrderedDict[int, str] = OrderedDict()

    def __len__(self) -> int:
        return len(self._owners)

    def match(self, blocks: tuple[int, ...], live: Collection[str]) -> PrefixMatch | None:
        """The live replica holding the deepest of ``blocks``' leading run of known names, or None."""
        best = None
        for index, name in enumerate(blocks):
            owner = self._owners.get(name)
            if owner is None:
                break
            if owner in live:
                best = PrefixMatch(owner, index + 1)
        return best

    def insert(self, blocks: tuple[int, ...], replica: str) -> None:
        """Record that ``replica`` was sent (and will cache) every block in ``blocks``."""
        for name in blocks:
            self._owners[name] = replica
            self._owners.move_to_end(name)
        while len(self._owners) > self.capacity:
            self._owners.popitem(last=False)

    def forget(self, replica: str) -> None:
        """Drop every entry of ``replica`` (it died: its KV cache went with it)."""
        for name in [name for name, owner in self._owners.items() if owner == replica]:
            del self._owners[name]
