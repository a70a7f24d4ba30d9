"""Values in generated files, each written through its format's own quoting (STYLE.md: generated
files are code). A study, a plan file or an option is data from whoever wrote it: its text reaches
a ``.py`` only as a ``repr`` literal, a ``.toml`` only as an escaped basic string, a ``.yaml`` or
``.json`` only through ``yaml.safe_dump``/``json.dumps`` of the whole document, a shell script
only as ``shell.word``, and a comment only as one line no character of which can end it.

A Python file carries no input text in comments at all: PEP 263 reads an encoding from a comment
on the first two lines, so a study named ``x coding: utf-7 +AAo-...`` would re-decode the rest of
the file into code when torchtitan imports it. Its docstrings are ``repr`` literals instead.
"""

from __future__ import annotations

import json
import keyword
import math
import numbers
from typing import Any

from .options import ExportError


def _number(value: Any, where: str) -> str:
    if isinstance(value, numbers.Integral):
        return repr(int(value))  # int(): a numpy integer's repr is a call, not a literal
    if not math.isfinite(value):
        raise ExportError(f"{where} must be a finite number, but got {value!r}")
    return repr(float(value))


def python(value: Any, where: str = "value") -> str:
    """A Python literal of ``value`` (None, bool, a number, text, or a list of them). ``repr``
    of a str quotes and escapes every quote, backslash and non-printable character, so the
    literal ends where Python reads it to end."""
    if value is None or isinstance(value, bool):
        return repr(value)
    if isinstance(value, str):
        return repr(str(value))
    if isinstance(value, numbers.Real):
        return _number(value, where)
    if isinstance(value, list):
        return "[" + ", ".join(python(v, where) for v in value) + "]"
    raise ExportError(f"{where} must be text, a number or a list of them, but got "
                      f"{type(value).__name__}")


def identifier_path(text: str) -> bool:
    """``text`` is a dotted Python name (``torchtitan.models.llama3``): no keyword, no space."""
    return bool(text) and all(part.isidentifier() and part.isascii()
                              and not keyword.iskeyword(part) for part in text.split("."))


_TOML_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f",
                 "\r": "\\r"}


def toml_string(text: str) -> str:
    """A TOML basic string: quotes, backslashes and every non-printable character escaped (the
    control characters and DEL must be, TOML 1.0 "String"; the line and paragraph separators and
    other invisible ones are, so the file reads as it parses). A lone surrogate, which no UTF-8
    file can hold, is left for the writer to refuse."""
    out = []
    for c in text:
        if c in _TOML_ESCAPES:
            out.append(_TOML_ESCAPES[c])
        elif c.isprintable() or 0xD800 <= ord(c) <= 0xDFFF:
            out.append(c)
        else:
            out.append(f"\\u{ord(c):04X}" if ord(c) <= 0xFFFF else f"\\U{ord(c):08X}")
    return '"' + "".join(out) + '"'


def toml(value: Any, where: str = "value") -> str:
    """A TOML value: a bool, a number, text or an array of them."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return toml_string(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml(v, where) for v in value) + "]"
    if isinstance(value, numbers.Real):
        return _number(value, where)
    raise ExportError(f"{where} must be text, a number or a list of them, but got "
                      f"{type(value).__name__}")


def json_text(doc: Any) -> str:
    """A JSON document as strict readers take it (no NaN or Infinity, which ``json.dumps`` writes
    by default and the JSON grammar lacks)."""
    try:
        return json.dumps(doc, indent=2, allow_nan=False) + "\n"
    except ValueError as exc:
        raise ExportError(f"a JSON config must hold finite numbers only: {exc}") from None


def comment(text: str) -> str:
    """``text`` for one ``#`` comment line of a shell, YAML or TOML file: every character that
    is not printable (newlines, CR, the Unicode line and paragraph separators, NEL, vertical tab,
    form feed, other controls) becomes '?', so nothing after it can leave the comment."""
    return "".join(c if c.isprintable() else "?" for c in text)
