"""Tags in text that grows token by token: how much of a text's end may still become a tag."""

from dataclasses import dataclass


def partial_suffix(text: str, tag: str) -> int:
    """The length of the longest end of ``text`` that begins ``tag`` (0 when none does): the
    text a stream holds back until the next tokens tell whether the tag is written."""
    for size in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-size:]):
            return size
    return 0


@dataclass(frozen=True, slots=True)
class TagSplit:
    """Text cut at a tag: ``before`` it (sure not to be the tag), and ``after`` it when ``found``;
    when not found, ``after`` is the end of the text that may still become the tag, to hold."""

    before: str
    after: str
    found: bool


def split_at_tag(text: str, tag: str) -> TagSplit:
    """``text`` cut at the first ``tag``, or, without one, before the end that may begin it."""
    at = text.find(tag)
    if at >= 0:
        return TagSplit(text[:at], text[at + len(tag) :], True)
    keep = len(text) - partial_suffix(text, tag)
    return TagSplit(text[:keep], text[keep:], False)
