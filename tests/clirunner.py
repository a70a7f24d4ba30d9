"""The CLI run in this process: ``main`` with stdout and stderr captured, and the check that bad
input came back as one ``error:`` line (exit 2, no traceback). Shared by the robustness tests."""

from __future__ import annotations

import contextlib
import io

from tcf_search.cli import main


def cli(*args: str) -> tuple[int, str, str]:
    """Exit code, stdout and stderr of ``tcf-search ARGS``."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(args))
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
    return code, out.getvalue(), err.getvalue()


def one_line_error(code: int, err: str, *words: str) -> None:
    """Exit 2 and one ``error:`` line on stderr that holds every one of ``words``."""
    assert code == 2, f"exit {code}: {err[-600:]}"
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    for word in words:
        assert word in lines[0], (word, lines[0])
