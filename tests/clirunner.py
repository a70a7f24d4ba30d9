"""The CLI run in this process: ``main`` with stdout and stderr captured, and the check that bad
input came back as one ``error:`` line (exit 2, no traceback); and the studies the robustness
tests run through it. Shared by the robustness tests."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

from tcf_search.cli import main

ROOT = Path(__file__).resolve().parents[1]
TINY = (ROOT / "studies" / "tiny-cpu.yaml").read_text()
# 377 parallel layouts (units): trials are not capped by the space
MOE = ("name: moe\nmodel: {preset: mixtral-8x7b}\n"
       "training: {seq_len: 8192, global_batch: 1024}\n"
       "cluster: {gpu: h100-sxm-80gb, nodes: 128}\n"
       "search_space: {cp: auto, ep: auto}\nsearch: {seed: 3, trials: 120}\n")


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
