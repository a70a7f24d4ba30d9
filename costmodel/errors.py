"""The one root of the project's errors: bad user input, stated as the rule and the values.

Every package raises a subclass (``SpecError`` here, ``CatalogError``, ``StudyError``,
``ExportRefused`` ...); the command line catches :class:`TcfError` alone and prints its message
as one line with exit code 2. Internal invariants are ``assert``s, never a ``TcfError``.
"""

from __future__ import annotations


class TcfError(ValueError):
    """Bad input to tcf-search; the message names the field and the rule it breaks."""
