"""A resumed study never ranks trial values of two cost models together.

The fingerprint (``search.pipeline.fingerprint``) says which study a storage holds: the same
model, cluster, training, space, objective and sampler. What a trial's value also rests on is
not in it: the cost model's code, the catalog data (``uncertainty.yaml`` is read by no spec)
and the few study numbers that only price a plan (the fabric's network efficiency, the token
budget, the GPU-hour price). Those make the study's *scoring*, stored beside the fingerprint.

A study resumed under another scoring is re-scored, never mixed: its COMPLETE trials are judged
again, in their order, under the current model (cheap and deterministic) and added to a study
of their own in the same storage, named ``<study>@scored-<key>``; the run continues there and
the old study is kept as it was. The study under the study's own name points at the one last
continued, so the next upgrade re-scores the latest trials. A kill while re-scoring is resumed
by the next run: trials already re-scored are not judged again.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import json
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution
from optuna.trial import FrozenTrial, TrialState

from search.evaluate import Evaluator
from search.optimize import RESCORED_FROM, objective
from search.storage import FINGERPRINT_ATTR, StorageSpec

SCORING_ATTR = "tcf_search_scoring"  # {"cost_model": version, "inputs": {...}}
CURRENT_ATTR = "tcf_search_current"  # on the study under its own name: the study continued
# What turns a trial's sample into its values, beyond the fingerprinted specs: the cost model,
# the catalog (its loaders and data files), and the search modules that judge a unit.
PACKAGES = (("costmodel", ("*.py",)), ("hardware_catalog", ("*.py", "*.yaml")))
SEARCH_MODULES = ("evaluate", "objectives", "optimize", "placement", "prune", "space",
                  "stage_memory", "uncertainty")


def _sources() -> Iterable[tuple[str, Path]]:
    """(name as a package-relative path, file) of every source the version hashes."""
    for package, patterns in PACKAGES:
        module_file = importlib.import_module(package).__file__
        assert module_file is not None
        root = Path(module_file).parent
        for pattern in patterns:
            for path in root.rglob(pattern):
                if "__pycache__" not in path.parts:
                    yield f"{package}/{path.relative_to(root).as_posix()}", path
    here = Path(__file__).parent
    for name in SEARCH_MODULES:
        yield f"search/{name}.py", here / f"{name}.py"


def source_digest(sources: Iterable[tuple[str, Path]]) -> str:
    """SHA-256 over each file's name and content, in name order (no path, mtime or listing
    order enters it)."""
    digest = hashlib.sha256()
    for name, path in sorted(sources):
        digest.update(name.encode() + b"\0" + hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


@functools.cache
def cost_model_version() -> str:
    """The version of what scores a trial, as installed (a few ms, once a process: the first
    run of a study, after its catalog is loaded)."""
    return source_digest(_sources())


def scoring(inputs: dict[str, Any]) -> dict[str, Any]:
    """What the study's trial values rest on: the cost-model version and the study numbers that
    only price a plan (JSON values, as the storage holds them)."""
    return json.loads(json.dumps({"cost_model": cost_model_version(), "inputs": inputs},
                                 sort_keys=True))


def scored_name(name: str, key: dict[str, Any]) -> str:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()
    return f"{name}@scored-{digest[:12]}"


def current_study(base: optuna.Study, spec: StorageSpec, ev: Evaluator,
                  key: dict[str, Any]) -> tuple[optuna.Study, dict[str, Any] | None]:
    """The study to continue under scoring ``key``: ``base`` (the study under its own name,
    fingerprint checked) when its trials were scored so, else the study re-scored under it
    (made now from the latest one when there is none). Returns it and, when trials were
    re-scored in this call, what was done."""
    if SCORING_ATTR not in base.user_attrs and not base.get_trials(deepcopy=False):
        base.set_user_attr(SCORING_ATTR, key)  # a new study: scored by this model from the start
    if base.user_attrs.get(SCORING_ATTR) == key:
        if base.user_attrs.get(CURRENT_ATTR, base.study_name) != base.study_name:
            base.set_user_attr(CURRENT_ATTR, base.study_name)
        return base, None
    name = scored_name(base.study_name, key)
    source = _latest(base, name)
    study = _scored_study(base, name)
    if study.user_attrs.get(SCORING_ATTR) == key:  # re-scored before: continue it
        base.set_user_attr(CURRENT_ATTR, name)
        return study, None
    old = source.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    held = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    done = {t.user_attrs.get(RESCORED_FROM) for t in held}
    todo = [t for t in old if t.number not in done]
    trials, dropped = rescore(ev, todo, {int(t.user_attrs["unit"]) for t in held})
    study.add_trials(trials)
    study.set_user_attr(SCORING_ATTR, key)  # last: the re-score is complete
    base.set_user_attr(CURRENT_ATTR, name)
    was = source.user_attrs.get(SCORING_ATTR)
    info = {"from_study": source.study_name, "trials": len(old), "dropped": dropped,
            "from_scoring": was}
    print(f"note: {_note(spec, source.study_name, len(old), was, key, name)}", file=sys.stderr)
    return study, info


def _scored_study(base: optuna.Study, name: str) -> optuna.Study:
    """The study ``name`` beside ``base``, made (with its fingerprint) if there is none."""
    storage = base._storage
    if name in optuna.get_all_study_names(storage):  # made by an earlier run
        return optuna.load_study(study_name=name, storage=storage)
    try:
        study = optuna.create_study(storage=storage, study_name=name, directions=base.directions)
    except optuna.exceptions.DuplicatedStudyError:  # another host on the RDB, just now
        return optuna.load_study(study_name=name, storage=storage)
    study.set_user_attr(FINGERPRINT_ATTR, base.user_attrs[FINGERPRINT_ATTR])
    return study


def _latest(base: optuna.Study, name: str) -> optuna.Study:
    """The study whose trials a re-score under ``name`` starts from: the one last continued."""
    latest = base.user_attrs.get(CURRENT_ATTR, base.study_name)
    if latest in (base.study_name, name) or latest not in optuna.get_all_study_names(
            base._storage):
        return base
    return optuna.load_study(study_name=latest, storage=base._storage)


def _note(spec: StorageSpec, source: str, count: int, was: dict[str, Any] | None,
          key: dict[str, Any], name: str) -> str:
    now = key["cost_model"][:12]
    if was is None:
        why = (f"scored by an unrecorded cost model (before tcf-search recorded it); "
               f"re-scored under cost model {now}")
    elif was.get("cost_model") != key["cost_model"]:
        why = f"scored by cost model {str(was.get('cost_model'))[:12]}; re-scored under {now}"
    else:
        changed = sorted(k for k in key["inputs"]
                         if was.get("inputs", {}).get(k) != key["inputs"][k])
        why = f"scored with other {', '.join(changed)}; re-scored with the study's"
    return (f"storage {spec.describe()} held {count} trials of study {source!r} {why} as "
            f"study {name!r}; the old trials are kept")


def _snap(value: Any, choices: list[Any]) -> Any:
    """``value`` when it is a choice, else the nearest numeric choice (else the first)."""
    if value in choices:
        return value
    numeric = [c for c in choices if isinstance(c, int) and not isinstance(c, bool)]
    if isinstance(value, int) and not isinstance(value, bool) and numeric:
        return min(numeric, key=lambda c: (abs(c - value), c))
    return choices[0]


def rescore(ev: Evaluator, trials: list[FrozenTrial], seen: set[int]
            ) -> tuple[list[FrozenTrial], int]:
    """The trials judged again under the current model, in their order, each as a new COMPLETE
    trial: its sample (snapped to the axes' values now) repaired to the nearest unit not yet
    judged, as a trial sampling it now would be. Returns them and how many could not be judged
    (none, unless the model now fails on a plan)."""
    distributions: dict[str, BaseDistribution] = {
        a: CategoricalDistribution(v) for a, v in ev.choices.items()}
    out: list[FrozenTrial] = []
    dropped = 0
    for old in sorted(trials, key=lambda t: t.number):
        plan = old.user_attrs.get("plan", {})
        params = {a: _snap(old.params.get(a, plan.get(a)), v) for a, v in ev.choices.items()}
        fixed = optuna.trial.FixedTrial(params)
        try:
            values = objective(ev, fixed, seen)
        except Exception:  # noqa: BLE001 - as a trial failing in a run: the study goes on
            dropped += 1
            continue
        seen.add(int(fixed.user_attrs["unit"]))
        out.append(optuna.trial.create_trial(
            values=list(values), params=params, distributions=distributions,
            user_attrs={**fixed.user_attrs, RESCORED_FROM: old.number},
            constraints=fixed.constraints))
    return out, dropped
