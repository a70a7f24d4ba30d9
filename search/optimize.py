"""Optuna over the feasible set: samplers, the objective, exact trial counts, worker processes.

Trial counts are exact: ``trials`` is the number of COMPLETE trials the study must hold. A run
counts what the storage already holds, fails trials left RUNNING by a killed run, and runs only
the remainder, split into fixed quotas over the workers. Each trial gets a sampler seeded from
the study seed and the number of trials completed before it, so a single-worker study resumed
after a kill samples exactly what an uninterrupted one would have.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import multiprocessing as mp
import os
import signal
import sys
import time
from collections.abc import Callable, Collection, Mapping
from typing import Any, TypeVar

import optuna
from optuna.trial import TrialState

from costmodel import PLAN_FIELDS
from costmodel.errors import TcfError
from search.evaluate import Evaluator
from search.inputs.planfile import plan_dict
from search.rdb import StorageFailed
from search.storage import SearchError, StorageSpec, quiet, signals_deferred

SETTLE_S = 10.0  # how long a host waits for the trials other hosts have under way
MAX_FAILURES = 20  # trials failing in a row (a bug, not bad luck) before a worker gives up
RESCORED_FROM = "rescored_from"  # a re-scored trial's attribute: its trial in the old study

Progress = Callable[[int, int], None]
Turn = Callable[[], contextlib.AbstractContextManager[Any]]  # one process at a time
T = TypeVar("T")
_stop = False  # a worker process got SIGINT: it ends the trial under way, then stops


def _stop_after_trial(signum: int, frame: object) -> None:
    global _stop
    _stop = True


def make_sampler(kind: str, seed: int, objectives: int) -> optuna.samplers.BaseSampler:
    if kind == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if kind == "nsga2" or (kind == "auto" and objectives > 1):
        return optuna.samplers.NSGAIISampler(seed=seed)
    with quiet():
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


def completed(study: optuna.Study) -> int:
    return len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)))


def started(study: optuna.Study) -> int:
    """Trials complete or under way."""
    return len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.RUNNING)))


def queued(study: optuna.Study) -> int:
    """Trials waiting in the queue (brute force's layouts, enqueued by any host)."""
    return len(study.get_trials(deepcopy=False, states=(TrialState.WAITING,)))


def objective(ev: Evaluator, trial: optuna.trial.BaseTrial,
              seen: Collection[int] = (), study: optuna.Study | None = None) -> tuple[float, ...]:
    """Sample the searched axes, repair to the nearest unit not in ``seen``, judge its best
    plan. With ``study`` (the storage workers share), the unit is claimed first, so no two
    trials judge one unit. The trial's params are the sample; its ``plan`` is what was judged."""
    return judge(ev, trial, *take(ev, trial, seen, study))


def take(ev: Evaluator, trial: optuna.trial.BaseTrial, seen: Collection[int] = (),
         study: optuna.Study | None = None) -> tuple[int, bool]:
    """:func:`objective`'s first half: the unit the trial judges, and whether it was repaired."""
    params = {axis: trial.suggest_categorical(axis, values) for axis, values in ev.choices.items()}
    if study is not None and isinstance(trial, optuna.trial.Trial):
        return claim(ev, study, trial, params)
    unit, repaired = ev.nearest(params, seen)
    trial.set_user_attr("unit", unit)
    return unit, repaired


def judge(ev: Evaluator, trial: optuna.trial.BaseTrial, unit: int,
          repaired: bool) -> tuple[float, ...]:
    """:func:`objective`'s second half: the unit's best plan, recorded on the trial."""
    result = ev.evaluate(unit)
    trial.set_user_attr("plan", plan_dict(result.plan))
    trial.set_user_attr("metrics", result.metrics)
    trial.set_user_attr("search", {"repaired": repaired, "candidates": result.candidates})
    # <= 0 means the plan fits with the study's headroom (Optuna's constraint convention).
    trial.set_constraint("memory_gib", -result.metrics["memory_headroom_gib"])
    return result.values


def claim(ev: Evaluator, study: optuna.Study, trial: optuna.trial.Trial,
          params: dict[str, Any]) -> tuple[int, bool]:
    """The unit this trial judges, claimed on the shared storage: write the claim (the
    trial's ``unit`` attribute), then read every other trial's; on a rival claim, yield and
    claim the next nearest. Two trials never both keep a unit: of two claims, the one written
    second is read after the first, so at least one trial sees the other and yields (both may
    yield; each then tries another unit). Only once every unit is taken does a trial judge one
    again. Returns the unit and whether it differs from the sample."""
    yielded: set[int] = set()
    while True:
        taken = {u for n, u in _claims(study).items() if n != trial.number} | yielded
        unit, repaired = ev.nearest(params, taken)
        trial.set_user_attr("unit", unit)
        if len(taken) >= ev.units:
            return unit, True  # nothing left unjudged: a repeat cannot be avoided
        if not any(u == unit for n, u in _claims(study).items() if n != trial.number):
            return unit, repaired or bool(yielded)
        yielded.add(unit)


def _claims(study: optuna.Study) -> dict[int, int]:
    """Trial number -> unit, of trials complete or under way (read fresh from the storage)."""
    return {t.number: int(t.user_attrs["unit"]) for t in study.get_trials(
        deepcopy=False, states=(TrialState.COMPLETE, TrialState.RUNNING))
        if "unit" in t.user_attrs}


def seen_units(study: optuna.Study) -> set[int]:
    """Units judged (or being judged) by the study's trials, from any worker or earlier run."""
    return set(_claims(study).values())


def run_trials(ev: Evaluator, study: optuna.Study, quota: int, *, sampler: str, seed: int,
               worker: int = 0, target: int | None = None, progress: Progress | None = None,
               turn: Turn = contextlib.nullcontext) -> int:
    """Run ``quota`` COMPLETE trials in this process (ask/tell), stopping early once the study
    holds ``target`` complete or running trials (other processes sharing the storage add
    theirs) and nothing is queued. ``turn`` is held while a process reads the count, asks and
    claims its unit: processes that share the storage take that step one at a time, so none
    passes the count and no layout is queued for a trial that has not yet claimed it."""
    done = failures = 0
    study.sampler = make_sampler(sampler, seed, len(ev.directions))
    while done < quota and not _stop:
        with turn():
            if target is not None and started(study) >= target and not queued(study):
                break
            # The seed depends only on the history, so a resumed study samples what an
            # uninterrupted one would have.
            reseed(study.sampler, trial_seed(seed, completed(study), worker))
            with quiet():
                trial = study.ask()
            taken = _guarded(study, trial, functools.partial(take, ev, trial, study=study))
        values = taken if isinstance(taken, Exception) else _guarded(
            study, trial, functools.partial(judge, ev, trial, *taken))
        if isinstance(values, Exception):
            failures += 1
            if failures >= MAX_FAILURES:
                raise SearchError(f"{failures} trials failed in a row; last: {values}") from values
            continue
        study.tell(trial, list(values))
        done += 1
        failures = 0
        if progress is not None:
            progress(done, quota)
    return done


def _guarded(study: optuna.Study, trial: optuna.trial.Trial,
             step: Callable[[], T]) -> T | Exception:
    """``step``'s result, or the exception that failed the trial (recorded on it, the trial told
    FAIL: a study never crashes on one trial). Ctrl-C fails the trial and stops; a lost storage
    stops (nothing more can be told)."""
    try:
        return step()
    except KeyboardInterrupt:
        study.tell(trial, state=TrialState.FAIL)
        raise
    except StorageFailed:
        raise
    except Exception as exc:
        trial.set_user_attr("error", f"{type(exc).__name__}: {exc}")
        study.tell(trial, state=TrialState.FAIL)
        return exc


def enqueue_all(ev: Evaluator, study: optuna.Study) -> None:
    """Brute force: one waiting trial per unit not yet judged, waiting or taken from the queue
    (a trial failed by a killed run is enqueued again, unlike with ``skip_if_exists``). Hosts
    that share a database run this one at a time (``StorageSpec.exclusive``)."""
    held = seen_units(study)
    # a queued trial another host has just taken is RUNNING before it claims its unit
    waiting = [t.system_attrs.get("fixed_params", {}) for t in study.get_trials(
        deepcopy=False, states=(TrialState.WAITING, TrialState.RUNNING))]
    held |= {ev.nearest(p)[0] for p in waiting if set(p) == set(ev.choices)}
    for unit in range(ev.units):
        if unit not in held:
            study.enqueue_trial(ev.params_of(unit))


def _worker(ev: Evaluator, spec: StorageSpec, name: str, quota: int, sampler: str, seed: int,
            worker: int, target: int, errors: Any, turn: Turn) -> None:
    if sys.platform.startswith("linux"):
        # Die with the command (even a SIGKILLed one): a worker left running would go on
        # writing trials that the resumed command has failed as stale.
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    # Ctrl-C must not land inside a journal append (it would leave Optuna's lock held and the
    # trial RUNNING): the worker finishes its trial and stops.
    signal.signal(signal.SIGINT, _stop_after_trial)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # not the deferring handler forked with it
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        study = optuna.load_study(study_name=name, storage=spec.open())
        run_trials(ev, study, quota, sampler=sampler, seed=seed, worker=worker, target=target,
                   turn=turn)
    except KeyboardInterrupt:
        pass
    except TcfError as exc:  # one line, said by the command (not a worker's traceback)
        errors.put((isinstance(exc, StorageFailed), str(exc)))
        sys.exit(1)


def quotas(remaining: int, workers: int) -> list[int]:
    base, extra = divmod(remaining, workers)
    return [base + (1 if w < extra else 0) for w in range(min(workers, remaining))]


def run_workers(ev: Evaluator, study: optuna.Study, spec: StorageSpec, target: int, *,
                workers: int, sampler: str, seed: int, progress: Progress | None = None,
                poll_s: float = 0.5) -> None:
    """Bring the study to ``target`` COMPLETE trials over ``workers`` processes sharing the
    storage: each runs a fixed share of the remainder."""
    # once the count is reached, only what is still queued (run_trials)
    remaining = max(0, target - completed(study)) or queued(study)
    shares = quotas(remaining, workers)
    # a database may be shared by other hosts: their turns are its lock (a dead process's is
    # released with it); a journal serves this command alone, whose workers' quotas sum to
    # the remainder, so none can pass the count
    turn: Turn = spec.exclusive if spec.url is not None else contextlib.nullcontext
    if len(shares) <= 1:
        run_trials(ev, study, remaining, sampler=sampler, seed=seed, target=target,
                   progress=progress, turn=turn)
        return
    # fork: the workers inherit the evaluator (feasible set, CP-SAT cache) without pickling.
    ctx = mp.get_context("fork")
    start = completed(study)
    errors = ctx.SimpleQueue()
    procs = [ctx.Process(target=_worker, daemon=False, args=(
        ev, spec, study.study_name, q, sampler, seed, w, target, errors, turn))
        for w, q in enumerate(shares)]
    try:
        # A Ctrl-C while forking would land in the at-fork hooks (logging's lock release) and
        # print "Exception ignored": it is held until every worker has started, then raised.
        with signals_deferred():
            for p in procs:
                p.start()
        while any(p.is_alive() for p in procs):
            time.sleep(poll_s)
            if progress is not None:
                progress(completed(study) - start, remaining)
    except KeyboardInterrupt:
        # A terminal's Ctrl-C reaches the workers too; a signal sent to this process alone
        # must be passed on, or they would run their shares to the end.
        for p in procs:
            if p.is_alive() and p.pid is not None:
                os.kill(p.pid, signal.SIGINT)
        raise
    finally:
        for p in procs:
            p.join()
    if not errors.empty():
        lost, message = errors.get()
        raise StorageFailed(message, "") if lost else SearchError(message)
    if progress is not None:
        progress(completed(study) - start, remaining)


def run_to_target(ev: Evaluator, study: optuna.Study, spec: StorageSpec, target: int, *,
                  workers: int, sampler: str, seed: int, progress: Progress | None = None,
                  settle_s: float = SETTLE_S, poll_s: float = 0.2) -> None:
    """:func:`run_workers`, then, on a shared database, wait up to ``settle_s`` for the trials
    other hosts have under way (milliseconds each), running more if some of theirs fail: hosts
    that start together each end with the whole study. Past that, the study may end short
    (a dead host's trial counts as running until its heartbeat is old): the caller says so."""
    deadline = time.monotonic() + settle_s
    while True:
        run_workers(ev, study, spec, target, workers=workers, sampler=sampler, seed=seed,
                    progress=progress)
        while started(study) >= target > completed(study) and time.monotonic() < deadline:
            time.sleep(poll_s)
        if started(study) >= target or time.monotonic() >= deadline:
            return


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


def plan_cells(plan: Mapping[str, Any]) -> dict[str, Any]:
    """A plan's trials.csv cells (``plan_dict``'s values), one per field of
    ``costmodel.plan_fields`` ('' where the trial holds none); a set of names joined by '+' as a
    plan string writes it ('': the selective modules are the training's; search.inputs.planspec)."""
    return {f.name: "+".join(plan.get(f.name, ())) if f.type is tuple else plan.get(f.name, "")
            for f in PLAN_FIELDS}


def trial_rows(study: optuna.Study) -> list[dict[str, Any]]:
    """One CSV row per trial: the plan's knobs, its predicted metrics, the trial state."""
    rows = []
    for t in study.get_trials(deepcopy=False):
        plan = t.user_attrs.get("plan", {})
        row: dict[str, Any] = {"number": t.number, "state": t.state.name.lower()}
        row.update({f"value_{k}": v for k, v in enumerate(t.values or [])})
        row.update(plan_cells(plan))
        row.update(t.user_attrs.get("metrics", {}))
        row.update({f"constraint_{k}": v for k, v in t.constraints.items()})
        row.update(t.user_attrs.get("search", {}))
        row["duration_s"] = t.duration.total_seconds() if t.duration else ""
        row["error"] = t.user_attrs.get("error", "")
        if RESCORED_FROM in t.user_attrs:  # search.rescore: judged again under today's model
            row[RESCORED_FROM] = t.user_attrs[RESCORED_FROM]
        rows.append(row)
    return rows
