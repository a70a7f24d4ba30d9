"""The one way tcf-search reads YAML a user gives it, and the one way a message shows a value.

:func:`load_yaml` is ``yaml.safe_load`` (no tags that build Python objects) with one more rule:
YAML aliases may repeat at most :data:`MAX_ALIAS_NODES` nodes, counted as the file is composed,
before any value is built. A few nested aliases (``&a [*b, *b, ...]``, a "billion laughs") make
a 1 KB file stand for 10⁹ values: PyYAML shares them, but anything that walks the value (pydantic,
``repr`` in an error message, a framework's config loader) would expand it. An alias inside the
node it names (``&a [*a]``) is refused too. Every failure is one :class:`YamlInputError` line.

:func:`shown` is a value as a message quotes it: ``repr`` for what is small, cut to ``limit``
characters, and never the whole of a large value (``reprlib`` with bounds).
"""

from __future__ import annotations

import math
import re
import reprlib
from itertools import islice
from typing import Any

import yaml
from yaml.composer import Composer
from yaml.events import AliasEvent
from yaml.nodes import MappingNode, Node, SequenceNode

from costmodel.errors import TcfError

__all__ = ["MAX_ALIAS_NODES", "YamlInputError", "load_yaml", "shown"]

# What aliases may add to a document, in nodes (a shipped study has ~60 nodes, a plan file ~120):
# room for ``<<: *defaults`` merges and shared lists, far from what costs time or memory.
MAX_ALIAS_NODES = 10_000


class YamlInputError(TcfError):
    """A YAML input cannot be read: not YAML, or aliases that expand too far."""


class _AliasBomb(Exception):
    def __init__(self, rule: str, event: AliasEvent) -> None:
        mark = event.start_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        super().__init__(f"{rule} (got *{event.anchor}{where})")


class _BoundedLoader(yaml.SafeLoader):
    """``SafeLoader`` that counts, per document, the nodes its aliases stand for."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._sizes: dict[int, int] = {}  # id(node) -> nodes with its aliases written out
        self._added = 0

    def compose_document(self) -> Node | None:
        self._sizes, self._added = {}, 0
        return Composer.compose_document(self)  # type: ignore[no-any-return]

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        if self.check_event(AliasEvent):
            event = self.peek_event()
            target = self.anchors.get(event.anchor)  # type: ignore[attr-defined]
            if target is not None:  # else PyYAML says "found undefined alias"
                size = self._sizes.get(id(target))
                if size is None:
                    raise _AliasBomb("a YAML alias may not sit inside the node it names",
                                     event)
                self._added += size
                if self._added > MAX_ALIAS_NODES:
                    raise _AliasBomb(f"YAML aliases may stand for at most "
                                     f"{MAX_ALIAS_NODES:,} nodes (a \"billion laughs\" is "
                                     f"refused): write the values out", event)
            return Composer.compose_node(self, parent, index)  # type: ignore[no-any-return]
        node = Composer.compose_node(self, parent, index)
        if isinstance(node, SequenceNode):
            children: list[Node] = node.value
        elif isinstance(node, MappingNode):
            children = [n for pair in node.value for n in pair]
        else:
            children = []
        self._sizes[id(node)] = 1 + sum(self._sizes[id(c)] for c in children)
        return node


def load_yaml(text: str, what: str) -> Any:
    """The value of YAML ``text``; ``what`` (``study``, ``plan file``, ``--set lr``) leads the one
    line of a :class:`YamlInputError`: not YAML, a tag, aliases repeating too much, nesting
    deeper than the parser allows, an integer of over 4,300 digits."""
    loader = None
    try:
        loader = _BoundedLoader(text)  # the reader refuses non-printable characters here
        return loader.get_single_data()
    except _AliasBomb as exc:
        raise YamlInputError(f"{what}: {exc}") from None
    except yaml.YAMLError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise YamlInputError(f"{what}: not valid YAML ({first})") from None
    except RecursionError:
        raise YamlInputError(f"{what}: not valid YAML (nested too deeply)") from None
    except ValueError as exc:  # an integer of over 4,300 digits
        raise YamlInputError(f"{what}: not valid YAML ({str(exc).splitlines()[0][:100]})"
                             ) from None
    finally:
        if loader is not None:
            loader.dispose()


_BOUNDED = reprlib.Repr()
_BOUNDED.maxlevel = 3
_BOUNDED.maxstring = _BOUNDED.maxlong = _BOUNDED.maxother = 200
_SMALL_NODES = 200


def _small(value: Any) -> bool:
    """Whether ``value`` is a few hundred scalars at most (looked at no further than that)."""
    stack, seen = [value], 0
    while stack:
        v = stack.pop()
        seen += 1
        if seen > _SMALL_NODES or (isinstance(v, str | bytes) and len(v) > 100 * _SMALL_NODES):
            return False
        if isinstance(v, dict):
            stack.extend(islice((x for kv in v.items() for x in kv), 2 * _SMALL_NODES))
        elif isinstance(v, list | tuple | set | frozenset):
            stack.extend(islice(v, _SMALL_NODES + 1))
    return True


def shown(value: Any, limit: int = 60) -> str:
    """``repr(value)`` cut to ``limit`` characters (ending ``...``); a large or self-containing
    value is abbreviated before it is written out, so the cost never grows with its size."""
    text = repr(value) if _small(value) else _BOUNDED.repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


_EXPONENT = re.compile(r"[+]?\d+(\.\d*)?[eE][+-]?\d+")


def whole_number(value: Any) -> Any:
    """A count written as a float (``4e6``, ``4.0e6``; YAML 1.1 reads ``4e6`` as text) is taken
    when it is a whole number; ``4096.5`` is refused with the rule (pydantic's lax int would
    accept neither the text nor, from a float, say which rule)."""
    if isinstance(value, bool) or isinstance(value, int):
        return value
    number: float | None = None
    if isinstance(value, float):
        number = value
    elif isinstance(value, str) and _EXPONENT.fullmatch(value.strip()):
        number = float(value)
    if number is None:
        return value
    if not math.isfinite(number) or number != int(number):
        raise ValueError(f"must be a whole number (got {value!r})")
    return int(number)
