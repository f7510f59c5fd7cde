"""Structural tags (vLLM's and xgrammar's ``structural_tag`` response format) as llguidance rules.

A spec ``{"structures": [{"begin", "schema", "end"}, ...], "triggers": [...]}`` lets the model
write any text until it writes a trigger; from there it must finish one of the structures whose
``begin`` starts with that trigger (the rest of ``begin``, JSON obeying ``schema``, then ``end``),
and then any text again. Text outside the structures never holds a trigger: the text before each
structure is a lazy lexeme that ends at the first trigger, and the text after the last one excludes
them. A tool-calling format with free text around its calls (Llama's ``<function=name>{...}</function>``)
is the use.
"""

import json

# Rust regex (llguidance's) metacharacters, escaped in a literal; `<` and `>` are not (escaped,
# they are word boundaries), nor is `/`'s escape needed but for the Lark delimiter.
_REGEX_SPECIAL = set("\\.+*?()|[]{}^$#&-~/")
_REGEX_CONTROL = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def structural_tag_rules(value: object, schema_of) -> str:
    """Lark rules defining ``st_text``, the text ``value`` (a structural-tag spec) allows;
    ``schema_of`` turns each structure's schema into the one the grammar holds (whitespace
    options). ``ValueError`` naming what is wrong with a malformed spec."""
    structures, triggers = _checked(value)
    rules = [
        "st_text: st_tagged* ST_END",
        "st_tagged: " + " | ".join(f"st_before_{i} st_body_{i}" for i in range(len(triggers))),
        "ST_TEXT: /(?s:.*)/",
        "ST_END: ST_TEXT & ~/(?s:.*)(?:"
        + "|".join(_regex_literal(t) for t in triggers)
        + ")(?s:.*)/",
    ]
    for i, trigger in enumerate(triggers):
        rules.append(f"st_before_{i}[lazy]: ST_TEXT {_string(trigger)}")
        bodies = [k for k, s in enumerate(structures) if s["begin"].startswith(trigger)]
        rules.append(f"st_body_{i}: " + " | ".join(f"st_struct_{i}_{k}" for k in bodies))
        for k in bodies:
            structure = structures[k]
            parts = [structure["begin"][len(trigger) :], None, structure["end"]]
            body = " ".join(
                _string(p) if p is not None else f"st_json_{k}" for p in parts if p != ""
            )
            rules.append(f"st_struct_{i}_{k}: {body}")
    for k, structure in enumerate(structures):
        rules.append(f"st_json_{k}: %json {json.dumps(schema_of(structure['schema']))}")
    return "\n".join(rules)


def _checked(value: object) -> tuple[list[dict], list[str]]:
    """The spec's structures and triggers, each trigger opening some structure and each structure
    opened by a trigger; ``ValueError`` otherwise."""
    if not isinstance(value, dict):
        raise ValueError("a structural tag must be an object with structures and triggers")
    structures, triggers = value.get("structures"), value.get("triggers")
    if not isinstance(structures, list) or not structures:
        raise ValueError("a structural tag needs a non-empty list of structures")
    if not isinstance(triggers, list) or not triggers:
        raise ValueError("a structural tag needs a non-empty list of triggers")
    if not all(isinstance(t, str) and t for t in triggers):
        raise ValueError("a structural tag's triggers must be non-empty strings")
    for structure in structures:
        if not isinstance(structure, dict) or not all(
            isinstance(structure.get(key), str) for key in ("begin", "end")
        ):
            raise ValueError("each structure needs begin and end strings and a schema")
        if not isinstance(structure.get("schema"), dict):
            raise ValueError("each structure's schema must be a JSON schema object")
        if not any(structure["begin"].startswith(t) for t in triggers):
            raise ValueError(f"structure {structure['begin']!r} begins with none of the triggers")
    for trigger in triggers:
        if not any(s["begin"].startswith(trigger) for s in structures):
            raise ValueError(f"trigger {trigger!r} begins none of the structures")
    return structures, list(dict.fromkeys(triggers))


def _string(text: str) -> str:
    """``text`` as a Lark string literal."""
    return json.dumps(text, ensure_ascii=False)


def _regex_literal(text: str) -> str:
    """``text`` matched literally inside a Lark regex."""
    return "".join(_REGEX_CONTROL.get(c, "\\" + c if c in _REGEX_SPECIAL else c) for c in text)
