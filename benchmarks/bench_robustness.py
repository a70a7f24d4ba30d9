"""Figures for robustness (issue 7): run ``python benchmarks/bench_robustness.py [--quick]``.

1. Inputs fuzzed: study files (``tcf-search run``), CSVs (``tcf-search predict``) and export
   option text (rendered, written and run with stub launchers) — fresh random examples of the
   properties in tests/test_robust_fuzz_*.py and tests/test_robust_output.py, counted per kind,
   with the number of properties that failed (must be 0).
2. Kills survived: ``tcf-search run`` SIGKILLed at random points of its progress (journal
   operations appended, as tests/test_robust_interrupt.py chooses them) and resumed from its folder;
   completed trials lost and duplicated (must be 0), and whether the final best and the trial
   sequence equal an uninterrupted run with the same seed.
3. Worker kills: the controlling process of a 4-worker run killed alone; workers left running
   (must be 0), layouts judged twice (must be 0) and the exact trial count after resuming.
4. Faults (issue 19): tests/test_robust_policy_*.py — devices, FIFOs, symlinks and folders as
   outputs, a tmpfs disk-full run (where this machine can mount one), torn journal records,
   FIFOs and devices as inputs, reruns, hostile names, signals mid-write: cases held / skipped.
5. Hostile shared files (issue 39), one module each (``benchmarks/robust_*.py``): generated
   launcher files of every format with code in every text field, YAML alias bombs and oversized
   work, hosts starting together on each storage and a database killed mid-run, copied hostile
   result folders through ``report``.

Every section returns its counts; the last lines add them up: inputs tried, faults injected,
tracebacks, damage (code that ran, a file written outside its folder, a payload live in a page),
trials lost and trials recorded twice.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from types import ModuleType

Counts = dict[str, int]
KEYS = ("inputs", "faults", "tracebacks", "damage", "lost", "duplicates")
SECTIONS = ("robust_exports", "robust_bounds", "robust_storage", "robust_report")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from search.pipeline import RunOptions, run_study  # noqa: E402
from search.study import load_study  # noqa: E402

FUZZ_FILES = ["tests/test_robust_fuzz_study.py", "tests/test_robust_fuzz_csv.py",
              "tests/test_robust_output.py", "tests/test_robust_fuzz_inputs.py"]


def heading(text: str) -> None:
    print(f"\n## {text}\n")


def interrupt_helpers() -> ModuleType:
    """tests/test_robust_interrupt.py's kill loop and storage readers (one code path)."""
    if str(ROOT / "tests") not in sys.path:
        sys.path.insert(0, str(ROOT / "tests"))  # its helpers (clirunner), as pytest finds them
    spec = importlib.util.spec_from_file_location(
        "robust_interrupt", ROOT / "tests" / "test_robust_interrupt.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def fuzz(examples: int) -> Counts:
    heading(f"Inputs fuzzed ({examples} fresh examples per property)")
    with tempfile.TemporaryDirectory() as tmp:
        counts = Path(tmp) / "counts.txt"
        env = {**os.environ, "TCF_FUZZ_EXAMPLES": str(examples), "TCF_FUZZ_COUNT": str(counts),
               "PYTHONPATH": str(ROOT)}
        t0 = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                               "-W", "ignore::DeprecationWarning", *FUZZ_FILES],
                              cwd=ROOT, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        kinds = Counter(counts.read_text().split()) if counts.exists() else Counter()
    summary = ("every property held" if done.returncode == 0
               else f"pytest exited {done.returncode}")
    for kind, label in [("study", "study files through `tcf-search run`"),
                        ("csv", "CSVs through `tcf-search predict`"),
                        ("export", "export option texts rendered, written and run"),
                        ("export-set", "`export --set KEY=VALUE` texts"),
                        ("compare", "`compare --with` changes"),
                        ("explain", "`explain --plan` texts"),
                        ("plan", "mutated plan files through explain and export"),
                        ("hf", "mutated HF config.json files through `run`")]:
        print(f"- {kinds[kind]:,} {label}")
    print(f"- {sum(kinds.values()):,} inputs in all, {wall:.0f} s: {summary}")
    if done.returncode != 0:
        failed = [ln for ln in done.stdout.splitlines() if ln.startswith("FAILED")]
        print("- FAILED properties:\n  " + "\n  ".join(failed or [done.stdout[-2000:]]))
    failed_count = sum(1 for ln in done.stdout.splitlines() if ln.startswith("FAILED"))
    return {"inputs": sum(kinds.values()),
            "tracebacks": failed_count or int(done.returncode != 0)}


def kills(count: int) -> Counts:
    heading(f"SIGKILL at random points of the study's progress, {count} times, resumed each time")
    h = interrupt_helpers()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        study = h.study_file(folder)
        out = folder / "killed"
        t0 = time.perf_counter()
        seen = h.kill_and_resume(study, out, count, seed=int(time.time()), tmp=folder)
        subprocess.run(h.command(study, out), cwd=ROOT, env=h.env(), check=True,
                       capture_output=True)
        final = h.completed(out)
        lost = sum(1 for n, v in seen.items() if final.get(n) != v)
        numbers = [t.number for t in h.trials(out)]
        units = [final[n][0] for n in sorted(final)]
        reference = run_study(load_study(study), RunOptions(out_dir=folder / "whole",
                                                            trials=h.TRIALS))
        ref = h.completed(folder / "whole")
        same_sequence = units == [ref[n][0] for n in sorted(ref)]
        best = max(v for _, v in final.values())
        assert reference.best is not None
        wall = time.perf_counter() - t0
    print(f"- kills survived: {count} (each landed while the command ran); {len(seen)} of "
          f"{h.TRIALS} trials done before the last resume")
    print(f"- trials lost: {lost}; duplicated trial numbers: {len(numbers) - len(set(numbers))}; "
          f"layouts judged twice: {len(units) - len(set(units))}; final complete: {len(final)}")
    print(f"- same trial sequence as an uninterrupted run: {same_sequence}; same best: "
          f"{best == reference.best.values[0]} ({best:,.1f} tok/s/GPU); {wall:.0f} s")
    return {"faults": count, "lost": lost, "duplicates": len(numbers) - len(set(numbers))
            + len(units) - len(set(units))}


def worker_kills(rounds: int, workers: int = 4, target: int = 200) -> Counts:
    import psutil

    heading(f"The controller of a {workers}-worker run SIGKILLed alone, {rounds} times")
    h = interrupt_helpers()
    orphans = lost = 0
    twice = 0
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        study = h.study_file(folder)
        out = folder / "workers"
        cmd = h.command(study, out, target, "--workers", str(workers))
        for _ in range(rounds):
            before = h.completed(out)
            proc = subprocess.Popen(cmd, cwd=ROOT, env=h.env(), stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL, start_new_session=True)
            deadline = time.monotonic() + 60
            kids: list[psutil.Process] = []
            while len(kids) < workers and proc.poll() is None and time.monotonic() < deadline:
                kids = psutil.Process(proc.pid).children(recursive=True)
                time.sleep(0.02)
            time.sleep(0.5)
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
            time.sleep(0.5)
            orphans += sum(1 for k in kids if k.is_running()
                           and k.status() != psutil.STATUS_ZOMBIE)
            now = h.completed(out)
            lost += sum(1 for n, v in before.items() if now.get(n) != v)
        subprocess.run(cmd, cwd=ROOT, env=h.env(), check=True, capture_output=True)
        final = h.completed(out)
        units = [t.user_attrs["unit"] for t in h.trials(out) if t.state.name == "COMPLETE"]
        twice = len(units) - len(set(units))
    print(f"- workers left running after their controller died: {orphans}")
    print(f"- trials lost: {lost}; layouts judged twice: {twice}; complete after resuming: "
          f"{len(final)} of {target}")
    return {"faults": rounds, "lost": lost + target - len(final), "duplicates": twice,
            "damage": orphans}


def faults() -> Counts:
    heading("Faults: outputs, full disk, torn journal, hostile inputs and names, signals")
    t0 = time.perf_counter()
    cases = [str(p) for p in sorted((ROOT / "tests").glob("test_robust_policy_*.py"))]
    done = subprocess.run([sys.executable, "-m", "pytest", "-rs", "-p", "no:cacheprovider", *cases],
                          cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    tail = done.stdout.strip().splitlines()
    counts = [ln for ln in tail if " passed" in ln or " failed" in ln]
    result = counts[-1].strip("= ") if counts else (tail or [done.stderr[-400:]])[-1]
    print(f"- {result}: exit {done.returncode} ({time.perf_counter() - t0:.0f} s)")
    for line in tail:
        if line.startswith("SKIPPED"):
            print(f"  - {line}")
    held = sum(int(n) for n, word in
               (part.split()[:2] for part in result.split(",") if part.strip()[:1].isdigit())
               if word.startswith("passed"))
    return {"faults": held, "tracebacks": int(done.returncode != 0)}


def hostile(quick: bool) -> list[Counts]:
    """The issue-39 sections, each in its own module beside this file."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    return [importlib.import_module(name).section(quick) for name in SECTIONS]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer examples and kills")
    args = parser.parse_args()
    print("# Robustness figures")
    counts = [fuzz(100 if args.quick else 400), kills(10 if args.quick else 20),
              worker_kills(2 if args.quick else 5), faults(), *hostile(args.quick)]
    heading("Totals")
    total = {k: sum(c.get(k, 0) for c in counts) for k in KEYS}
    print(f"- inputs {total['inputs']:,}, faults {total['faults']:,}, tracebacks "
          f"{total['tracebacks']}, damage {total['damage']}, lost {total['lost']}, duplicates "
          f"{total['duplicates']}")


if __name__ == "__main__":
    main()
