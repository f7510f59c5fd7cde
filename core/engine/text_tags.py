"""Tags in text that grows token by token: how much of a text's end may still become a tag."""


def partial_suffix(text: str, tag: str) -> int:
    """The length of the longest end of ``text`` that begins ``tag`` (0 when none does): the
    text a stream holds back until the next tokens tell whether the tag is written."""
    for size in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-size:]):
            return size
    return 0
