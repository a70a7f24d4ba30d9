"""A resumed study never ranks trial values of two cost models together: a study resumed under
another cost-model version (or other pricing numbers) is re-scored into a study of its own, its
trials kept, and one under the same version resumes as it always did."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import optuna
import pytest
from optuna.trial import TrialState

import search.evaluate
import search.pipeline
import search.rescore as rescore
from search.inputs.specs import Specs, build_specs
from search.inputs.study import Study, load_study
from search.pipeline import RunOptions, run_study
from search.space import build_space
from search.storage import FINGERPRINT_ATTR, StorageSpec

ROOT = Path(__file__).resolve().parents[1]
NAME = "llama3-8b-h100x8"


@pytest.fixture()
def study() -> Study:
    return load_study(ROOT / "studies" / f"{NAME}.yaml")


def trials(out: Path, name: str = NAME) -> list[optuna.trial.FrozenTrial]:
    stored = optuna.load_study(study_name=name, storage=StorageSpec.parse(None, out).open())
    return stored.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))


def upgrade(monkeypatch: pytest.MonkeyPatch, version: str = "f" * 64) -> None:
    """This process now runs 'another cost model': another version, the same formulas."""
    monkeypatch.setattr(rescore, "cost_model_version", lambda: version)


def halve_throughput(monkeypatch: pytest.MonkeyPatch) -> None:
    """A cost model that predicts half the tokens/s of today's, for every plan."""
    real = search.evaluate.estimate_batch

    def halved(*args: Any, **kwargs: Any) -> dict[str, np.ndarray]:
        out = dict(real(*args, **kwargs))
        out["tokens_per_s_per_gpu"] = out["tokens_per_s_per_gpu"] / 2
        return out

    monkeypatch.setattr(search.evaluate, "estimate_batch", halved)


def test_an_unchanged_model_resumes_the_same_study(tmp_path: Path, study: Study,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    first = run_study(study, RunOptions(out_dir=tmp_path, trials=8))
    kept = {t.number: t.values for t in trials(tmp_path)}
    second = run_study(study, RunOptions(out_dir=tmp_path, trials=12))
    assert "re-scored" not in capsys.readouterr().err
    assert second.search["study_name"] == first.search["study_name"] == NAME
    assert "rescored" not in second.search
    assert second.search["trials_this_run"] == 4 and second.trials == 12
    assert {t.number: t.values for t in trials(tmp_path) if t.number in kept} == kept
    version = rescore.cost_model_version()
    assert second.to_dict()["search"]["cost_model"] == version and len(version) == 64
    stored = optuna.load_study(study_name=NAME, storage=StorageSpec.parse(None, tmp_path).open())
    assert stored.user_attrs[rescore.SCORING_ATTR]["cost_model"] == version


def test_another_model_rescores_the_trials_and_never_mixes(
        tmp_path: Path, study: Study, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    run_study(study, RunOptions(out_dir=tmp_path, trials=10))
    old = trials(tmp_path)
    old_value = {t.user_attrs["unit"]: t.values[0] for t in old}
    old_version = rescore.cost_model_version()
    upgrade(monkeypatch)
    halve_throughput(monkeypatch)
    capsys.readouterr()
    result = run_study(study, RunOptions(out_dir=tmp_path, trials=14))
    err = capsys.readouterr().err
    name = result.search["study_name"]
    assert name.startswith(f"{NAME}@scored-")
    assert (f"held 10 trials of study {NAME!r} scored by cost model {old_version[:12]}; "
            f"re-scored under ffffffffffff as study {name!r}") in err
    assert err.count("re-scored") == 1
    assert result.search["rescored"]["trials"] == 10 and result.search["cost_model"] == "f" * 64
    assert result.search["trials_this_run"] == 4 and result.trials == 14
    now = trials(tmp_path, name)
    assert len(now) == 14
    rescored = [t for t in now if rescore.RESCORED_FROM in t.user_attrs]
    # every old trial judged again, in its order, on the same layout, at the new model's value
    assert [t.user_attrs[rescore.RESCORED_FROM] for t in rescored] == [t.number for t in old]
    for t in rescored:
        assert t.values[0] == pytest.approx(old_value[t.user_attrs["unit"]] / 2, rel=1e-12)
    # the ranking holds the new model's values only: its best is half the old best
    assert result.best is not None
    assert result.best.values[0] <= max(old_value.values()) / 2 * (1 + 1e-12)
    assert all(r.values[0] <= max(old_value.values()) / 2 * (1 + 1e-12) for r in result.top)
    assert trials(tmp_path) == old  # the old study is kept as it was
    # the next run under the same model continues the re-scored study, re-scoring nothing
    again = run_study(study, RunOptions(out_dir=tmp_path, trials=16))
    assert again.search["study_name"] == name and "rescored" not in again.search
    assert again.search["trials_this_run"] == 2 and "re-scored" not in capsys.readouterr().err


def test_each_upgrade_rescores_the_latest_trials(tmp_path: Path, study: Study,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    run_study(study, RunOptions(out_dir=tmp_path, trials=6))
    upgrade(monkeypatch, "a" * 64)
    second = run_study(study, RunOptions(out_dir=tmp_path, trials=9))
    upgrade(monkeypatch, "b" * 64)
    third = run_study(study, RunOptions(out_dir=tmp_path, trials=9))
    assert len({NAME, second.search["study_name"], third.search["study_name"]}) == 3
    assert third.search["rescored"]["from_study"] == second.search["study_name"]
    assert third.search["rescored"]["trials"] == 9 and third.search["trials_this_run"] == 0
    assert len(trials(tmp_path, third.search["study_name"])) == 9


def test_other_pricing_numbers_rescore_too(tmp_path: Path, study: Study,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    # the token budget prices a plan (time to train) but is no part of the fingerprint
    run_study(study, RunOptions(out_dir=tmp_path, trials=6))
    cheaper = study.model_copy(update={"training": study.training.model_copy(
        update={"token_budget": 2e11})})
    capsys.readouterr()
    result = run_study(cheaper, RunOptions(out_dir=tmp_path, trials=6))
    assert "scored with other token_budget; re-scored" in capsys.readouterr().err
    assert all(r.predicted["time_to_train_days"] > 0 for r in result.top)
    days = {t.user_attrs["unit"]: t.user_attrs["metrics"]["time_to_train_days"]
            for t in trials(tmp_path)}
    for t in trials(tmp_path, result.search["study_name"]):
        assert t.user_attrs["metrics"]["time_to_train_days"] == pytest.approx(
            2 * days[t.user_attrs["unit"]], rel=1e-12)


def test_a_pareto_study_is_rescored_with_its_constraints(
        tmp_path: Path, study: Study, monkeypatch: pytest.MonkeyPatch) -> None:
    pareto = study.model_copy(update={"objective": study.objective.model_copy(
        update={"second": "memory_headroom"})})
    run_study(pareto, RunOptions(out_dir=tmp_path, trials=8))
    old = {t.user_attrs["unit"]: t for t in trials(tmp_path)}
    upgrade(monkeypatch)
    halve_throughput(monkeypatch)
    result = run_study(pareto, RunOptions(out_dir=tmp_path, trials=8))
    now = trials(tmp_path, result.search["study_name"])
    assert len(now) == 8 and set(old) == {t.user_attrs["unit"] for t in now}
    for t in now:
        was = old[t.user_attrs["unit"]]
        assert t.values == pytest.approx([was.values[0] / 2, was.values[1]], rel=1e-12)
        assert t.constraints == was.constraints and t.params == was.params
    assert result.top and all(r.source.startswith("trial ") for r in result.top)
    csv_head = (tmp_path / "trials.csv").read_text().splitlines()[0].split(",")
    assert "rescored_from" in csv_head


def test_a_study_from_before_versions_is_rescored(tmp_path: Path, study: Study,
                                                 monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    # then: no scoring recorded, and the fingerprint with the GPU's efficiency in it
    real = search.pipeline.fingerprints
    monkeypatch.setattr(rescore, "SCORING_ATTR", "not_recorded_then")
    monkeypatch.setattr(search.pipeline, "fingerprints", lambda *a: (real(*a)[1], ""))
    run_study(study, RunOptions(out_dir=tmp_path, trials=6))
    earlier = optuna.load_study(study_name=NAME, storage=StorageSpec.parse(None, tmp_path).open())
    assert earlier.user_attrs[FINGERPRINT_ATTR] != real(
        study, build_specs(study), build_space(study, build_specs(study)))[0]
    monkeypatch.undo()
    capsys.readouterr()
    result = run_study(study, RunOptions(out_dir=tmp_path, trials=6))
    assert "scored by an unrecorded cost model" in capsys.readouterr().err
    assert result.search["rescored"]["trials"] == 6 and result.trials == 6


def test_a_refit_calibration_rescores_and_is_not_refused(
        tmp_path: Path, study: Study, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A refit changes the GPU's efficiency, which scores a plan: the study is re-scored under
    it (its fingerprint is the same), not refused as a study of other hardware."""
    run_study(study, RunOptions(out_dir=tmp_path, trials=6))
    real = search.pipeline.build_specs

    def refit(s: Study) -> Specs:
        specs = real(s)
        gpu = specs.cluster.gpu
        eff = replace(gpu.efficiency, gemm_peak_fraction=gpu.efficiency.gemm_peak_fraction / 2)
        return replace(specs, cluster=replace(specs.cluster, gpu=replace(gpu, efficiency=eff)))

    monkeypatch.setattr(search.pipeline, "build_specs", refit)
    capsys.readouterr()
    result = run_study(study, RunOptions(out_dir=tmp_path, trials=8))
    assert "scored with other efficiency; re-scored" in capsys.readouterr().err
    assert result.search["rescored"]["trials"] == 6 and result.trials == 8
    old = {t.user_attrs["unit"]: t.values[0] for t in trials(tmp_path)}
    now = [t for t in trials(tmp_path, result.search["study_name"])
           if rescore.RESCORED_FROM in t.user_attrs]
    assert len(now) == 6 and all(t.values[0] < old[t.user_attrs["unit"]] for t in now)


def test_a_rescore_cut_short_is_finished_by_the_next_run(tmp_path: Path, study: Study,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    run_study(study, RunOptions(out_dir=tmp_path, trials=10))
    upgrade(monkeypatch)
    real = optuna.Study.add_trials

    def killed_half_way(self: optuna.Study, new: list[optuna.trial.FrozenTrial]) -> None:
        real(self, new[:4])
        raise KeyboardInterrupt

    monkeypatch.setattr(optuna.Study, "add_trials", killed_half_way)
    with pytest.raises(KeyboardInterrupt):
        run_study(study, RunOptions(out_dir=tmp_path, trials=10))
    monkeypatch.setattr(optuna.Study, "add_trials", real)
    result = run_study(study, RunOptions(out_dir=tmp_path, trials=10))
    now = trials(tmp_path, result.search["study_name"])
    assert sorted(t.user_attrs[rescore.RESCORED_FROM] for t in now) == list(range(10))
    assert len({t.user_attrs["unit"] for t in now}) == 10  # no layout judged twice
    assert result.search["trials_this_run"] == 0


def test_the_version_hashes_names_and_contents_only(tmp_path: Path) -> None:
    sources = dict(rescore._sources())
    assert {"costmodel/step.py", "costmodel/parallel/__init__.py", "search/evaluate.py",
            "hardware_catalog/calibration.yaml", "hardware_catalog/uncertainty.yaml",
            "hardware_catalog/h100-sxm-80gb.yaml"} <= set(sources)
    copy = {}
    for name, path in reversed(sources.items()):  # another place, another listing order
        copy[name] = tmp_path / "elsewhere" / name
        copy[name].parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, copy[name])
    assert rescore.source_digest(copy.items()) == rescore.source_digest(sources.items())
    assert rescore.source_digest(sources.items()) == rescore.cost_model_version()
    with copy["costmodel/step.py"].open("a") as f:
        f.write("# a changed line\n")
    assert rescore.source_digest(copy.items()) != rescore.cost_model_version()


def test_an_rdb_study_is_rescored_alike(tmp_path: Path, study: Study,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    first = run_study(study, RunOptions(out_dir=tmp_path / "a", trials=6, storage=url))
    upgrade(monkeypatch)
    second = run_study(study, RunOptions(out_dir=tmp_path / "b", trials=8, storage=url))
    assert second.search["rescored"]["trials"] == 6 and second.search["trials_this_run"] == 2
    assert second.search["study_name"] != first.search["study_name"]
    names = set(optuna.get_all_study_names(storage=url))
    assert names == {NAME, second.search["study_name"]}
