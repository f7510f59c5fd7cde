"""The chat template an engine renders chats with when its operator names one (vLLM's
``--chat-template``): a file's, or the template itself."""

from pathlib import Path

import jinja2

from spyglass.core.tokenizer import Tokenizer, compile_chat_template


def with_chat_template(tokenizer: Tokenizer, option: str | None) -> Tokenizer:
    """``tokenizer`` rendering chats with the template ``option`` names: a file's (a path that
    exists), or ``option`` itself when it holds jinja (``{{`` or ``{%``); ``tokenizer`` as it is
    for None. ValueError naming the option when it is neither, or does not compile."""
    if option is None:
        return tokenizer
    path = Path(option).expanduser()
    if path.is_file():
        source = path.read_text()
    elif "{{" in option or "{%" in option:
        source = option
    else:
        raise ValueError(f"--chat-template {option!r} is neither a file nor a jinja template")
    try:
        compile_chat_template(source)
    except jinja2.TemplateSyntaxError as error:
        raise ValueError(f"--chat-template does not compile: {error}") from None
    return tokenizer.with_chat_template(source)
