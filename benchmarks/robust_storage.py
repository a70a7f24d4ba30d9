"""Figures for a hostile storage (issue 39, items 3, 4, 7 and 8):
``python benchmarks/robust_storage.py [--quick]``.

1. Hosts that start together: rounds of 4 ``tcf-search run`` commands held at a barrier right
   before each opens one storage (tests/hosts.py): a fresh SQLite file, an existing SQLite study
   whose space is smaller than the trials asked (every host fills the queue and takes from it),
   one journal file (it serves one command: the others must be refused in one line), a fresh and
   an existing PostgreSQL database (``TCF_TEST_PG_URL``; skipped, saying why, without it).
2. A database or a process that dies: PostgreSQL cut inside a trial (connections refused, its
   backends terminated) at a random point of a 1- or 2-worker run; a run on SQLite SIGKILLed
   inside a trial. Then the same command again, on the storage restored.
3. Hostile storage paths: study files whose ``search.storage`` points out of the result folder
   (absolute, ``..``, ``%2e%2e``, a link out, a server URL, URL options), a copied result folder
   whose ``study.journal`` links out, a copied ``result.json`` naming a storage elsewhere
   (``validate``'s record), and ``nightly`` over a folder of such studies.

The counts (``section`` returns them): inputs = hostile storage inputs of part 3 (a study file,
a result folder or a nightly folder each); faults = processes started together on one storage
(4 per round of part 1) plus databases cut and processes killed (part 2); tracebacks = commands
whose output held a Python traceback; damage = files that appeared outside the result folder
(part 3), or a command of part 1 or 2 that crashed (an exit other than 0 or the one-line error
it is allowed); lost = COMPLETE trials held before a fault and not after the rerun; duplicates =
a trial number recorded twice, or a layout judged twice (in part 1, where hosts take turns to
claim layouts, ``search.optimize.run_trials``, none passes the count).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # tests/hosts.py and clirunner.py, as pytest finds them

import hosts  # noqa: E402
import optuna  # noqa: E402
from clirunner import cli  # noqa: E402
from optuna.trial import TrialState  # noqa: E402

HOSTS = 4
UNITS = 12  # parallel layouts of hosts.SMALL
KEYS = ("inputs", "faults", "tracebacks", "damage", "lost", "duplicates")


def _count() -> dict[str, int]:
    return dict.fromkeys(KEYS, 0)


def _tb(output: str) -> int:
    return int("Traceback" in output)


# ---- 1. hosts that start together -----------------------------------------------------------

def _round(kind: str, scratch: Path, url: str | None, counts: dict[str, int],
           extra: dict[str, int]) -> None:
    study = scratch / "small.yaml"
    study.write_text(hosts.SMALL)
    if kind == "journal":
        url = f"journal:{scratch / 'shared.journal'}"
    assert url is not None
    if kind.endswith("existing"):
        code, _, err = cli("run", str(study), "-o", str(scratch / "first"), "-q", "--storage",
                           url, "--trials", "1")
        assert code == 0, err
    ran = hosts.together([["run", str(study), "-o", str(scratch / f"host{i}"), "-q",
                           "--storage", url] for i in range(HOSTS)])
    counts["faults"] += HOSTS
    for code, output in ran:
        counts["tracebacks"] += _tb(output)
        refused = (kind == "journal" and code == 2 and output.count("\n") == 1
                   and "another tcf-search run" in output)
        if code != 0 and not refused:
            counts["damage"] += 1
            print(f"  - {kind}: exit {code}: {output.strip().splitlines()[-1:]}")
        extra["refused"] += refused
    if kind == "journal":
        from optuna.storages import JournalStorage

        from search.storage import JournalFile

        storage: Any = JournalStorage(JournalFile(url.removeprefix("journal:")))
    else:
        storage = url
    held = optuna.load_study(study_name="small", storage=storage).get_trials(
        deepcopy=False)
    complete = [t for t in held if t.state == TrialState.COMPLETE]
    units = [int(t.user_attrs["unit"]) for t in complete]
    counts["duplicates"] += len(held) - len({t.number for t in held})
    counts["duplicates"] += len(units) - len(set(units))  # a layout judged twice
    counts["lost"] += len(set(range(UNITS)) - set(units))  # a layout never judged
    extra["left"] += sum(t.state in (TrialState.WAITING, TrialState.RUNNING) for t in held)


def concurrent(rounds: dict[str, int], counts: dict[str, int]) -> None:
    print("\n## Hosts that start together (4 commands at a barrier before the storage)\n")
    missing = hosts.postgres_missing()
    for kind, n in rounds.items():
        if kind.startswith("postgresql") and missing:
            print(f"- {kind}: skipped ({missing})")
            continue
        extra = {"refused": 0, "left": 0}
        before = dict(counts)
        started = time.perf_counter()
        for _ in range(n):
            with tempfile.TemporaryDirectory(prefix="tcf-hosts-") as tmp:
                scratch = Path(tmp)
                if kind.startswith("postgresql"):
                    with hosts.fresh_database() as url:
                        _round(kind, scratch, url, counts, extra)
                else:
                    _round(kind, scratch, f"sqlite:///{scratch / 'shared.db'}", counts, extra)
        crashed = counts["damage"] - before["damage"]
        print(f"- {kind}: {n} rounds, {n * HOSTS} commands, crashed {crashed}, tracebacks "
              f"{counts['tracebacks'] - before['tracebacks']}, refused in one line "
              f"{extra['refused']}, trials left waiting/running {extra['left']}, layouts never "
              f"judged {counts['lost'] - before['lost']}, judged twice "
              f"{counts['duplicates'] - before['duplicates']} "
              f"({time.perf_counter() - started:.0f} s)")


# ---- 2. a database or a process that dies ----------------------------------------------------

def _die_and_resume(url: str, scratch: Path, fault: Callable[[], None], at: int, workers: int,
                    counts: dict[str, int], rng: random.Random,
                    after: Callable[[], None] = lambda: None, lost_line: bool = True) -> str:
    study = scratch / "small.yaml"
    study.write_text(hosts.SMALL)
    args = ["run", str(study), "-o", str(scratch / "out"), "-q", "--storage", url, "--trials",
            "10", "--workers", str(workers)]
    asked = rng.random() < 0.5  # as the trial starts, or inside it
    [(code, output)] = hosts.together([args], setup=hosts.at_judged(at, fault, asked=asked))
    after()
    counts["faults"] += 1
    counts["tracebacks"] += _tb(output)
    ok = (code == 1 and output.count("\n") == 1 and "lost the connection" in output
          if lost_line else code == -signal.SIGKILL)
    counts["damage"] += not ok
    held = {t.number: t.values for t in hosts.trials(url, "small")
            if t.state == TrialState.COMPLETE}
    code, _, err = cli(*args)
    counts["tracebacks"] += _tb(err)
    trials = hosts.trials(url, "small")
    now = {t.number: t.values for t in trials if t.state == TrialState.COMPLETE}
    counts["lost"] += sum(now.get(n) != v for n, v in held.items())
    units = [int(t.user_attrs["unit"]) for t in trials if t.state == TrialState.COMPLETE]
    counts["duplicates"] += (len(trials) - len({t.number for t in trials})
                             + len(units) - len(set(units)))
    done = hosts.result(scratch / "out")
    counts["damage"] += code != 0 or done["trials"] != 10
    return (f"{'as' if asked else 'inside'} trial {at}, {workers} worker(s): exit "
            f"{'as it should' if ok else 'WRONG'}, rerun exit {code}, {done['trials']}/10 "
            f"complete, {done['search']['recovered_trials']} dead trial(s) failed at once")


def deaths(cuts: int, kills: int, counts: dict[str, int], rng: random.Random) -> None:
    print("\n## A database or a process that dies inside a trial, then the same command\n")
    missing = hosts.postgres_missing()
    if missing:
        print(f"- PostgreSQL cut: skipped ({missing})")
    for _ in range(0 if missing else cuts):
        with tempfile.TemporaryDirectory(prefix="tcf-cut-") as tmp, \
                hosts.fresh_database() as url:
            line = _die_and_resume(url, Path(tmp), lambda u=url: hosts.cut(u),
                                   rng.randint(1, 5), rng.choice((1, 2)), counts, rng,
                                   after=lambda u=url: hosts.restore(u))
            print(f"- PostgreSQL cut {line}")
    for _ in range(kills):
        with tempfile.TemporaryDirectory(prefix="tcf-kill-") as tmp:
            url = f"sqlite:///{Path(tmp) / 'study.db'}"
            line = _die_and_resume(url, Path(tmp),
                                   lambda: os.kill(os.getpid(), signal.SIGKILL),
                                   rng.randint(1, 5), 1, counts, rng, lost_line=False)
            print(f"- SQLite SIGKILL {line}")


# ---- 3. hostile storage paths --------------------------------------------------------------

STUDY_STORAGES = [
    "journal:{out}/x.journal", "journal:../x.journal", "journal:../../x.journal",
    "journal:link/x.journal", "journal:sub/../../x.journal", "journal:/dev/null",
    "journal:", "journal:.tcf-search-files.json", "sqlite:///{out}/x.db", "sqlite:///../x.db",
    "sqlite:///%2e%2e/x.db", "sqlite:///link/x.db", "sqlite:///x.db?mode=rwc",
    "sqlite:///file:../x.db?uri=true", "sqlite+pysqlite:///{out}/y.db", "sqlite://",
    "postgresql://alice:pw@127.0.0.1:1/db", "postgresql://127.0.0.1:1/db?sslkeylogfile={out}/k",
    "mysql://root@127.0.0.1:1/db", "journal:sub/ok.journal", "sqlite:///sub/ok.db",
    "journal:%2e%2e/literal.journal"]


def _outside(sandbox: Path, result: Path) -> set[Path]:
    return {p for p in sandbox.rglob("*") if not p.is_relative_to(result)}


def _hostile_run(sandbox: Path, storage: str, counts: dict[str, int]) -> str:
    outside = sandbox / "outside"
    result = sandbox / "runs" / "x"
    result.mkdir(parents=True)
    (result / "link").symlink_to(outside)
    study = sandbox / "study.yaml"
    study.write_text(hosts.SMALL.replace(
        "search: {trials: 500}",
        f"search: {{trials: 2, storage: {json.dumps(storage.format(out=outside))}}}"))
    before = _outside(sandbox, result)
    cwd = os.getcwd()
    os.chdir(sandbox / "cwd")
    try:
        code, _, err = cli("run", str(study), "-o", str(result), "-q")
    finally:
        os.chdir(cwd)
    counts["tracebacks"] += _tb(err)
    written = _outside(sandbox, result) - before
    counts["damage"] += len(written)
    one_line = code == 2 and err.count("\n") == 1 and err.startswith("error: ")
    counts["damage"] += not (code == 0 or one_line)
    return "ran inside" if code == 0 else "refused" if one_line else f"exit {code}"


def hostile(counts: dict[str, int]) -> None:
    print("\n## Hostile storage paths (study files, a copied result folder, nightly)\n")
    outcomes: dict[str, int] = {}

    def sandbox(tmp: str) -> Path:
        box = Path(tmp)
        (box / "outside").mkdir()
        (box / "cwd").mkdir()
        return box

    for storage in STUDY_STORAGES:
        with tempfile.TemporaryDirectory(prefix="tcf-hostile-") as tmp:
            what = _hostile_run(sandbox(tmp), storage, counts)
        counts["inputs"] += 1
        outcomes[what] = outcomes.get(what, 0) + 1
    print(f"- study files: {len(STUDY_STORAGES)}, " + ", ".join(
        f"{k} {v}" for k, v in sorted(outcomes.items())))
    with tempfile.TemporaryDirectory(prefix="tcf-hostile-") as tmp:
        box = sandbox(tmp)
        folder = box / "copied"
        folder.mkdir()
        (folder / "study.journal").symlink_to(box / "outside" / "j")
        study = box / "small.yaml"
        study.write_text(hosts.SMALL)
        before = _outside(box, folder)
        code, _, err = cli("run", str(study), "-o", str(folder), "-q")
        counts["inputs"] += 1
        counts["tracebacks"] += _tb(err)
        counts["damage"] += len(_outside(box, folder) - before) + (code != 2)
        print(f"- a copied result folder whose study.journal links out: exit {code}")
    _validate_records(counts)
    _nightly(counts)


def _validate_records(counts: dict[str, int]) -> None:
    from tcf_search.validate.record import record_in_study

    named = ["sqlite:///{out}/evil.db", "sqlite:///../evil.db", "{out}/evil.journal",
             "postgresql://127.0.0.1:1/db?sslkeylogfile={out}/k", "sqlite:///link/evil.db"]
    recorded = 0
    for storage in named:
        with tempfile.TemporaryDirectory(prefix="tcf-hostile-") as tmp:
            box = Path(tmp)
            outside = box / "outside"
            outside.mkdir()
            folder = box / "copied"
            folder.mkdir()
            (folder / "link").symlink_to(outside)
            (folder / "result.json").write_text(json.dumps({"search": {
                "study_name": "x", "storage": storage.format(out=outside)}}))
            before = _outside(box, folder)
            cwd = os.getcwd()
            os.chdir(folder)
            try:
                note = record_in_study(folder, [], {})
            finally:
                os.chdir(cwd)
            recorded += note.startswith("study ")
            counts["inputs"] += 1
            counts["damage"] += len(_outside(box, folder) - before)
    print(f"- copied result.json naming a storage elsewhere (validate's record): {len(named)}, "
          f"recorded into {recorded}")


def _nightly(counts: dict[str, int]) -> None:
    with tempfile.TemporaryDirectory(prefix="tcf-hostile-") as tmp:
        box = Path(tmp)
        (box / "outside").mkdir()
        studies = box / "studies"
        studies.mkdir()
        for i, storage in enumerate(["journal:{out}/n.journal", "sqlite:///{out}/n.db",
                                     "journal:../../../n.journal"]):
            (studies / f"s{i}.yaml").write_text(hosts.SMALL.replace("name: small", f"name: s{i}")
                                                .replace("search: {trials: 500}", (
                f"search: {{trials: 2, storage: "
                f"{json.dumps(storage.format(out=box / 'outside'))}}}")))
        history = box / "history"
        before = _outside(box, history)
        code, out, err = cli("nightly", str(studies), "-o", str(history), "--no-report", "-q")
        counts["inputs"] += 1
        counts["tracebacks"] += _tb(out + err)
        counts["damage"] += len(_outside(box, history) - before)
        print(f"- nightly over 3 such studies: exit {code}, files outside its folder "
              f"{len(_outside(box, history) - before)}")


# ---- the section ----------------------------------------------------------------------------

def section(quick: bool) -> dict[str, int]:
    print("## Hostile storage: hosts that start together, a database that dies, storage paths")
    print("\ninputs: hostile storage inputs (part 3); faults: commands started together on one "
          "storage (4 a round) + databases cut + processes killed; damage: files written "
          "outside the result folder, or a command that crashed; lost: COMPLETE trials "
          "missing after the rerun, or layouts never judged; duplicates: a trial number "
          "twice, or a layout judged twice below the trial count")
    counts = _count()
    started = time.perf_counter()
    rng = random.Random(39)
    scale = 1 if quick else 3
    # a journal round is cheap (one command runs, three are refused at once)
    concurrent({"sqlite-fresh": 3 * scale, "sqlite-existing": 2 * scale,
                "journal": 10 * scale, "postgresql-fresh": 5 * scale,
                "postgresql-existing": 3 * scale}, counts)
    deaths(4 * scale, 4 * scale, counts, rng)
    hostile(counts)
    print(f"\n**{counts['inputs']} inputs, {counts['faults']} faults: {counts['tracebacks']} "
          f"tracebacks, {counts['damage']} damage, {counts['lost']} lost, "
          f"{counts['duplicates']} duplicates** ({time.perf_counter() - started:.0f} s)")
    return counts


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds (about 2 minutes)")
    section(parser.parse_args().quick)
