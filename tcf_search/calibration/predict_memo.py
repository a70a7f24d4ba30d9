"""Predictions ``predict`` has made, found again: by the cells a row's prediction was read from,
or by the case they made (``RowMemo``), the most recent of each kept."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator, Mapping
from typing import Any

from search.inputs import Case


class _Reads(Mapping[str, object]):
    """A row that records which cells were read (every one, once it is iterated)."""

    def __init__(self, cells: dict[str, object]) -> None:
        self._cells, self.names = cells, dict[str, None]()

    def __getitem__(self, key: str) -> object:
        self.names[key] = None
        return self._cells[key]

    def __iter__(self) -> Iterator[str]:
        self.names.update(dict.fromkeys(self._cells))
        return iter(self._cells)

    def __len__(self) -> int:
        return len(self._cells)


Key = tuple[tuple[str, ...], tuple[object, ...]]
Result = dict[str, object]  # a row's output cells


class _Recent(OrderedDict[Any, Any]):
    """A dict of at most ``limit`` entries: the least recently used go first."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit

    def get_recent(self, key: Any) -> Any:
        value = self.get(key)
        if value is not None:
            self.move_to_end(key)
        return value

    def keep(self, key: Any, value: Any) -> None:
        self[key] = value
        self.move_to_end(key)
        while len(self) > self.limit:
            self.popitem(last=False)


class RowMemo:
    """Predictions already made, found two ways. A row's prediction is a function of the cells
    ``case_from_row`` reads (which cells depends on their values, so each set read is kept): a
    row that agrees with an earlier one on such a set is found by its cells alone. Rows whose
    cells differ but make the same :class:`Case` (free text in ``notes`` that names no fabric)
    are found by the case. The ``limit`` most recent of each are kept."""

    def __init__(self, limit: int = 10_000) -> None:
        self._shapes: dict[tuple[str, ...], None] = {}
        self._by_cells = _Recent(limit)  # Key -> Result, or a Case still being predicted
        self.by_case = _Recent(limit)  # Case -> Result

    def find(self, cells: dict[str, object]) -> tuple[Key | None, Result | Case | None]:
        for names in self._shapes:
            key = (names, tuple(map(cells.get, names)))
            found = self._by_cells.get_recent(key)
            if found is not None:
                return key, found
        return None, None

    def put(self, reads: _Reads, value: Result | Case) -> Key:
        """Keep ``value`` under the cells ``reads`` recorded; their key."""
        names = tuple(reads.names)
        self._shapes.setdefault(names, None)
        key = (names, tuple(reads.get(n) for n in names))
        self._by_cells.keep(key, value)
        return key

    def set(self, key: Key, result: Result) -> None:
        self._by_cells.keep(key, result)
