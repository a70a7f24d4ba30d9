"""Optuna over the feasible set: samplers, resumable storage, worker processes.

Trial counts are exact: ``trials`` is the number of COMPLETE trials the study must hold. A run
counts what the storage already holds, fails trials left RUNNING by a killed run, and runs only
the remainder, split into fixed quotas over the workers. Each trial gets a sampler seeded from
the study seed and the number of trials completed before it, so a single-worker study resumed
after a kill samples exactly what an uninterrupted one would have.
"""

from __future__ import annotations

import dataclasses
import json
import multiprocessing as mp
import time
import warnings
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
from optuna.storages import BaseStorage, JournalStorage, RDBStorage
from optuna.storages.journal import JournalFileBackend
from optuna.trial import TrialState

from search.evaluate import Evaluator

STORAGE_FILE = "study.journal"
FINGERPRINT_ATTR = "tcf_search_fingerprint"
MAX_FAILURES = 20  # trials failing in a row (a bug, not bad luck) before a worker gives up

Progress = Callable[[int, int], None]


class SearchError(ValueError):
    """A search cannot run as asked (storage of another study, bad storage URL, ...)."""


@dataclass(frozen=True, slots=True)
class StorageSpec:
    """Where trials live: a journal file (default: ``study.journal`` in the output folder) or an
    RDB URL (``sqlite:///…``, ``postgresql://…``) shared by many hosts."""

    url: str | None = None
    journal: Path | None = None

    @classmethod
    def parse(cls, url: str | None, out_dir: Path) -> StorageSpec:
        if url is None:
            return cls(journal=out_dir / STORAGE_FILE)
        if url.startswith("journal:"):
            return cls(journal=Path(url.removeprefix("journal:")))
        if "://" not in url:
            raise SearchError(f"search.storage: must be journal:PATH or an RDB URL such as "
                              f"sqlite:///study.db or postgresql://host/db (got {url!r})")
        return cls(url=url)

    def open(self) -> BaseStorage:
        if self.journal is not None:
            self.journal.parent.mkdir(parents=True, exist_ok=True)
            return JournalStorage(JournalFile(str(self.journal)))
        assert self.url is not None
        try:
            # Heartbeats let any host fail the trials of a worker that died on another host.
            return RDBStorage(self.url, heartbeat_interval=30, grace_period=120)
        except Exception as exc:  # SQLAlchemy raises many types; the message says what
            raise SearchError(f"search.storage: cannot open {self.url!r}: "
                              f"{str(exc).splitlines()[0]}") from None

    def describe(self) -> str:
        return str(self.journal) if self.journal is not None else _redact(self.url or "")


def _redact(url: str) -> str:
    """An RDB URL without its password, for logs and result files."""
    head, sep, tail = url.partition("://")
    if "@" not in tail:
        return url
    cred, host = tail.rsplit("@", 1)
    return f"{head}{sep}{cred.split(':', 1)[0]}:***@{host}"


def make_sampler(kind: str, seed: int, objectives: int) -> optuna.samplers.BaseSampler:
    if kind == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if kind == "nsga2" or (kind == "auto" and objectives > 1):
        return optuna.samplers.NSGAIISampler(seed=seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.samplers.TPESampler(seed=seed, multivariate=True)


def trial_seed(seed: int, completed: int, worker: int) -> int:
    return (seed * 1_000_003 + completed * 7_919 + worker * 104_729) % 2**32


def reseed(sampler: optuna.samplers.BaseSampler, seed: int) -> None:
    """Seed a sampler's random state in place (``reseed_rng`` only draws a random seed). One
    long-lived sampler keeps TPE's incremental search-space cache; a fresh one per trial
    would recompute it over every past trial."""
    for part in (sampler, getattr(sampler, "_random_sampler", None)):
        state = getattr(part, "_rng", None)
        if state is not None:
            state.rng.seed(seed)


class JournalFile(JournalFileBackend):
    """Optuna's journal file without an fsync per append (~13 appends a trial, milliseconds
    each here). A killed process loses nothing: its writes are in the page cache. A power loss
    can drop the last trials; the journal reader skips a torn final line."""

    def append_logs(self, logs: list[dict[str, Any]]) -> None:
        text = "\n".join(json.dumps(log, separators=(",", ":")) for log in logs) + "\n"
        self._lock.acquire()
        try:
            with open(self._file_path, "ab") as f:
                f.write(text.encode("utf-8"))
        finally:
            self._lock.release()


def completed(study: optuna.Study) -> int:
    return len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)))


def open_study(ev: Evaluator, spec: StorageSpec, name: str, fingerprint: str) -> optuna.Study:
    """Create or resume the study; refuse storage that holds another study under this name."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = spec.open()
    directions = [optuna.study.StudyDirection[d.upper()] for d in ev.directions]
    study = optuna.create_study(storage=storage, study_name=name, load_if_exists=True,
                                directions=directions)
    held = study.user_attrs.get(FINGERPRINT_ATTR)
    if held is None:
        study.set_user_attr(FINGERPRINT_ATTR, fingerprint)
    elif held != fingerprint:
        raise SearchError(
            f"storage {spec.describe()} holds study {name!r} made from a different study "
            f"definition (fingerprint {held[:12]} vs {fingerprint[:12]}); use another output "
            f"folder (-o) or storage, or remove it")
    if [d.name.lower() for d in study.directions] != ev.directions:
        raise SearchError(f"storage {spec.describe()} holds study {name!r} with directions "
                          f"{[d.name.lower() for d in study.directions]}, not {ev.directions}")
    return study


def recover(study: optuna.Study, spec: StorageSpec) -> int:
    """Fail trials left RUNNING by a run that was killed; return how many.

    A journal file has one controller (this command), so every RUNNING trial is stale. An RDB
    may be shared by live workers on other hosts: only trials whose heartbeat stopped are.
    """
    if spec.journal is None:
        before = len(study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)))
        optuna.storages.fail_stale_trials(study)
        return before - len(study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)))
    stale = study.get_trials(deepcopy=False, states=(TrialState.RUNNING, TrialState.WAITING))
    running = [t for t in stale if t.state == TrialState.RUNNING]
    for t in running:
        study._storage.set_trial_state_values(t._trial_id, state=TrialState.FAIL)
    return len(running)


def objective(ev: Evaluator, trial: optuna.trial.BaseTrial,
              seen: Collection[int] = ()) -> tuple[float, ...]:
    """Sample the searched axes, repair to the nearest unit not in ``seen``, judge its best
    plan. The trial's params are the sample; its ``plan`` attribute is what was judged."""
    params = {axis: trial.suggest_categorical(axis, values) for axis, values in ev.choices.items()}
    unit, repaired = ev.nearest(params, seen)
    trial.set_user_attr("unit", unit)
    result = ev.evaluate(unit)
    trial.set_user_attr("plan", dataclasses.asdict(result.plan))
    trial.set_user_attr("metrics", result.metrics)
    trial.set_user_attr("search", {"repaired": repaired, "candidates": result.candidates})
    # <= 0 means the plan fits with the study's headroom (Optuna's constraint convention).
    trial.set_constraint("memory_gib", -result.metrics["memory_headroom_gib"])
    return result.values


def seen_units(study: optuna.Study) -> set[int]:
    """Units judged (or being judged) by the study's trials, from any worker or earlier run."""
    return {int(t.user_attrs["unit"]) for t in study.get_trials(
        deepcopy=False, states=(TrialState.COMPLETE, TrialState.RUNNING))
        if "unit" in t.user_attrs}


def run_trials(ev: Evaluator, study: optuna.Study, quota: int, *, sampler: str, seed: int,
               worker: int = 0, progress: Progress | None = None) -> int:
    """Run ``quota`` COMPLETE trials in this process (ask/tell)."""
    done = failures = 0
    study.sampler = make_sampler(sampler, seed, len(ev.directions))
    while done < quota:
        # The seed depends only on the history, so a resumed study samples what an
        # uninterrupted one would have.
        reseed(study.sampler, trial_seed(seed, completed(study), worker))
        trial = study.ask()
        try:
            values = objective(ev, trial, seen_units(study))
        except KeyboardInterrupt:
            study.tell(trial, state=TrialState.FAIL)
            raise
        except Exception as exc:  # never crash the study: record and go on
            trial.set_user_attr("error", f"{type(exc).__name__}: {exc}")
            study.tell(trial, state=TrialState.FAIL)
            failures += 1
            if failures >= MAX_FAILURES:
                raise SearchError(f"{failures} trials failed in a row; last: {exc}") from exc
            continue
        study.tell(trial, list(values))
        done += 1
        failures = 0
        if progress is not None:
            progress(done, quota)
    return done


def enqueue_all(ev: Evaluator, study: optuna.Study) -> None:
    """Brute force: one waiting trial per unit not yet judged or waiting (a trial failed by a
    killed run is enqueued again, unlike with ``skip_if_exists``)."""
    held = seen_units(study)
    waiting = [t.system_attrs.get("fixed_params", {}) for t in study.get_trials(
        deepcopy=False, states=(TrialState.WAITING,))]
    held |= {ev.nearest(p)[0] for p in waiting if set(p) == set(ev.choices)}
    for unit in range(ev.units):
        if unit not in held:
            study.enqueue_trial(ev.params_of(unit))


def _worker(ev: Evaluator, spec: StorageSpec, name: str, quota: int, sampler: str, seed: int,
            worker: int) -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.load_study(study_name=name, storage=spec.open())
    try:
        run_trials(ev, study, quota, sampler=sampler, seed=seed, worker=worker)
    except KeyboardInterrupt:
        pass


def quotas(remaining: int, workers: int) -> list[int]:
    base, extra = divmod(remaining, workers)
    return [base + (1 if w < extra else 0) for w in range(workers) if base or w < extra]


def run_workers(ev: Evaluator, study: optuna.Study, spec: StorageSpec, remaining: int, *,
                workers: int, sampler: str, seed: int, progress: Progress | None = None,
                poll_s: float = 0.5) -> None:
    """Run ``remaining`` trials over ``workers`` processes sharing the storage."""
    shares = quotas(remaining, workers)
    if len(shares) <= 1:
        run_trials(ev, study, remaining, sampler=sampler, seed=seed, progress=progress)
        return
    # fork: the workers inherit the evaluator (feasible set, CP-SAT cache) without pickling.
    ctx = mp.get_context("fork")
    start = completed(study)
    procs = [ctx.Process(target=_worker, args=(ev, spec, study.study_name, q, sampler, seed, w),
                         daemon=False)
             for w, q in enumerate(shares)]
    for p in procs:
        p.start()
    try:
        while any(p.is_alive() for p in procs):
            time.sleep(poll_s)
            if progress is not None:
                progress(completed(study) - start, remaining)
    finally:
        for p in procs:
            p.join()
    if progress is not None:
        progress(completed(study) - start, remaining)


def best_trials(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    """COMPLETE trials that satisfy their constraints."""
    out = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        if all(v <= 0 for v in t.constraints.values()):
            out.append(t)
    return out


def summary(study: optuna.Study) -> dict[str, Any]:
    states = [t.state for t in study.get_trials(deepcopy=False)]
    return {s.name.lower(): states.count(s) for s in TrialState if states.count(s)}
