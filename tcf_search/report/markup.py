"""The report's HTML, escaped by construction: every value reaches the page through :func:`html`.

:class:`Html` marks text that is already HTML. Only :func:`html` (a template written in this
code, each value escaped or formatted) and :func:`join` make one; anything else put into a
template — a name from ``result.json``, a note, a number's text — is escaped, attribute quotes
included. So a value from a copied result folder cannot open a tag, close an attribute or start a
script, whichever field it sits in. ``tests/test_robust_report_hostile.py`` holds the report's
modules to this: templates are string literals, no f-string builds HTML.
"""

from __future__ import annotations

import html as _html
import string
from collections.abc import Iterable
from typing import Any, LiteralString


class Html(str):
    """Text that is HTML already (a template's output, or a renderer's that escapes its own
    text): put into a template as it is."""

    __slots__ = ()


class _Escaping(string.Formatter):
    def format_field(self, value: Any, format_spec: str) -> str:
        if isinstance(value, Html):
            if format_spec:
                raise ValueError("HTML takes no format spec")
            return value
        if not isinstance(value, str | int | float):
            raise TypeError(f"only text, numbers and Html go into the page, not "
                            f"{type(value).__name__}")
        return _html.escape(format(value, format_spec), quote=True)


_FORMATTER = _Escaping()


def html(template: LiteralString, /, *args: Any, **kwargs: Any) -> Html:
    """``template.format(*args, **kwargs)`` with every value escaped (an :class:`Html` as it
    is); a format spec formats a number as a number (``{:,.0f}``) before it is escaped."""
    return Html(_FORMATTER.vformat(template, args, kwargs))


def join(parts: Iterable[Html | str], sep: LiteralString = "") -> Html:
    """The parts one after another (``sep`` between), any that is not :class:`Html` escaped."""
    return Html(sep.join(p if isinstance(p, Html) else _html.escape(p, quote=True)
                         for p in parts))


def fragment(text: str) -> Html:
    """HTML a renderer made that escapes its own text: the explain section, which is rich's
    ``export_html`` of text whose markup characters were escaped
    (``tcf_search.explain.render``)."""
    return Html(text)
