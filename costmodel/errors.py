"""The one root of the project's errors: bad user input, stated as the rule and the values.

Every package raises a subclass (``SpecError`` here, ``CatalogError``, ``StudyError``,
``ExportRefused`` ...); the command line catches :class:`TcfError` alone and prints its message
as one line with exit code 2. Internal invariants are ``assert``s, never a ``TcfError``.
"""

from __future__ import annotations

import numbers


class TcfError(ValueError):
    """Bad input to tcf-search; the message names the field and the rule it breaks."""


class SpecError(TcfError):
    """A model, cluster, plan or training description breaks a rule; the message names it."""


def require_positive(owner: str, **values: int | float) -> None:
    for name, value in values.items():
        # A number (not text, not a bool), and far from overflow: times and rates multiply a
        # few of these, and inf or nan would rank as best. Integers stay exact as floats.
        limit = 2**53 if isinstance(value, numbers.Integral) else 1e30
        if (not isinstance(value, numbers.Real) or isinstance(value, bool)
                or not 0 < value < limit):
            raise SpecError(f"{owner}.{name} must be a number in (0, 1e30) (integers < 2**53), "
                            f"but got {name}={value!r}")


def require_nonnegative(owner: str, **values: object) -> None:
    """Each value a real number in [0, 1e30): 0 is allowed (a field not catalogued, a figure not
    measured)."""
    for name, value in values.items():
        if (not isinstance(value, numbers.Real) or isinstance(value, bool)
                or not 0 <= float(value) < 1e30):
            raise SpecError(f"{owner}.{name} must be a number in [0, 1e30), "
                            f"but got {name}={value!r}")
