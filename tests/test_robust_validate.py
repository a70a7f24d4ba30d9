"""Failing validation runs, as a study's validation meets them: one plan crashes, the next hangs
past its timeout, the next runs out of memory — each is killed with its whole process group,
recorded with its reason, and the next plan still runs. And the harness itself may be stopped
(Ctrl-C, SIGTERM, SIGKILL) while ranks run: no rank outlives it.

tests/test_validate_harness.py covers one launch per fault; this covers a whole folder through
``tcf-search validate`` and the harness's own interruption.
"""

from __future__ import annotations

import csv
import dataclasses
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

pytest.importorskip("torch", reason="validation needs the optional torch extra "
                                    "(pip install -e '.[validate]')")

from search.inputs.study import load_study  # noqa: E402
from search.pipeline import RunOptions, run_study  # noqa: E402
from tcf_search.cli import main  # noqa: E402
from tcf_search.validate import runs  # noqa: E402
from tcf_search.validate.config import RunConfig, RunResult  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
FAULTS = ["crash", "hang", "oom"]
EXPECTED = {"crash": "crash", "hang": "timeout", "oom": "oom"}
# A rank that hangs, launched by a harness the test then stops.
HANGING = """
import sys
from pathlib import Path
from costmodel.specs import ModelSpec, Plan
from search.inputs.specs import training_spec
from tcf_search.validate.config import RunConfig
from tcf_search.validate.launch import launch
model = ModelSpec(name="t", layers=2, hidden=32, ffn_hidden=64, heads=4, kv_heads=2, vocab=128)
training = training_spec(framework="generic", precision="bf16", seq_len=16, global_batch=4)
cfg = RunConfig(model=model, plan=Plan(dp=2), training=training, fault="hang")
launch(cfg, timeout_s=120, work_dir=Path(sys.argv[1]))
"""


def group_members(pgid: int) -> list[psutil.Process]:
    """Live (not zombie) processes of a process group."""
    out = []
    for p in psutil.process_iter(["status"]):
        try:
            if os.getpgid(p.pid) == pgid and p.info["status"] != psutil.STATUS_ZOMBIE:
                out.append(p)
        except (ProcessLookupError, psutil.NoSuchProcess):
            continue
    return out


def wait_gone(pgid: int, limit_s: float = 60) -> list[psutil.Process]:
    """Until the group is gone (a safety net: its members are killed at once, or die with
    their parent by PR_SET_PDEATHSIG; the wait is only for the kernel to get there)."""
    deadline = time.monotonic() + limit_s
    while (alive := group_members(pgid)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return alive


@pytest.fixture(scope="module")
def result_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tiny-cpu's top plans, as a study writes them."""
    out = tmp_path_factory.mktemp("tiny")
    study = load_study(ROOT / "studies" / "tiny-cpu.yaml")
    run_study(study, RunOptions(out_dir=out, trials=20))
    assert len(list((out / "top").glob("rank-*.yaml"))) >= len(FAULTS)
    return out


def test_a_failing_plan_does_not_stop_the_others(result_folder: Path,
                                                 monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    launched: list[tuple[str, Path, RunResult]] = []
    timeouts: list[float] = []
    real_launch = runs.launch

    def faulty(cfg: RunConfig, *, timeout_s: float, work_dir: Path) -> RunResult:
        fault = FAULTS[len(launched) % len(FAULTS)]
        timeouts.append(timeout_s)
        # Only the hang meets the command's --timeout: a crash or an OOM ends by itself, and on
        # a busy machine two ranks importing torch can take longer than 4 s to get there.
        r = real_launch(dataclasses.replace(cfg, fault=fault),  # type: ignore[arg-type]
                        timeout_s=timeout_s if fault == "hang" else 300, work_dir=work_dir)
        launched.append((fault, work_dir, r))
        return r

    monkeypatch.setattr(runs, "launch", faulty)
    code = main(["validate", str(result_folder), "--top", str(len(FAULTS)), "--steps", "1",
                 "--warmup", "0", "--timeout", "4"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "Traceback" not in out + err
    assert len(launched) == len(FAULTS), "every plan ran, whatever the one before it did"
    assert timeouts == [4] * len(FAULTS), "--timeout reaches every launch"
    for fault, work, r in launched:
        assert r.outcome == EXPECTED[fault], (fault, r.error)
        assert r.error, "the reason is recorded"
        assert not wait_gone(int((work / "pgid").read_text())), f"{fault}: ranks survived"
    with (result_folder / "validation.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [r["outcome"] for r in rows] == [EXPECTED[f] for f in FAULTS]
    assert all(r["error"] for r in rows)
    for outcome in EXPECTED.values():
        assert outcome in out


@pytest.mark.parametrize("how", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL],
                         ids=["SIGINT", "SIGTERM", "SIGKILL"])
def test_no_rank_outlives_a_stopped_harness(tmp_path: Path, how: signal.Signals) -> None:
    """The ranks sit in a process group of their own, which a terminal's Ctrl-C does not reach:
    the harness kills it on the way out, and a harness killed outright takes them along."""
    script = tmp_path / "hang.py"
    script.write_text(HANGING)
    work = tmp_path / "work"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    harness = subprocess.Popen([sys.executable, str(script), str(work)], cwd=ROOT, env=env,
                               stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not (work / "pgid").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    pgid = int((work / "pgid").read_text())
    while len(group_members(pgid)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(group_members(pgid)) == 2, "both ranks started"
    harness.send_signal(how)
    harness.communicate(timeout=60)
    survivors = wait_gone(pgid)
    for p in survivors:  # do not leave them to the next test
        p.kill()
    assert not survivors, f"{len(survivors)} rank(s) outlived the harness"
