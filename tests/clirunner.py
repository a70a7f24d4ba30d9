"""The CLI run in this process: ``main`` with stdout and stderr captured, and the check that bad
input came back as one ``error:`` line (exit 2, no traceback); the studies the robustness tests
run through it; and a ``tcf-search`` process that kills itself at an exact point of its study.
Shared by the robustness tests."""

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

KILL_AT = "TCF_TEST_KILL_AT"  # the journal append after which a self_killing command dies
# The command, SIGKILLed by itself right after its journal append number $TCF_TEST_KILL_AT (0:
# before it does anything). The journal is all a killed run leaves, so this is what a kill
# anywhere between two appends leaves, at a point fixed by the study's progress whatever the
# speed of the machine or of the process watching it.
_KILLED_AT = f"""
import os, runpy, signal
from search import storage
limit, done, append = int(os.environ["{KILL_AT}"]), [0], storage.JournalFile.append_logs
def counted(self, logs):
    append(self, logs)
    done[0] += 1
    if done[0] >= limit:
        os.kill(os.getpid(), signal.SIGKILL)
storage.JournalFile.append_logs = counted
if limit == 0:
    os.kill(os.getpid(), signal.SIGKILL)
runpy.run_module("tcf_search", run_name="__main__")
"""


def self_killing(command: list[str]) -> list[str]:
    """``[python, "-m", "tcf_search", ARGS...]`` as the command that dies at ``$KILL_AT``."""
    assert command[1:3] == ["-m", "tcf_search"], command
    return [command[0], "-c", _KILLED_AT, *command[3:]]


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
