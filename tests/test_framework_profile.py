"""The framework profile: one typed object, built from hardware_catalog/frameworks.yaml alone.

``Training`` keeps the workload; every switch is a field of a ``FrameworkProfile`` group with a
docstring under it and no default of its own; the generic profile names every switch once and a
framework overrides only switches the generic profile names (MaxText's base.yml rule).
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
from typing import Any

import pytest

from costmodel import SpecError, Training
from costmodel.framework import GROUPS, SWITCH_GROUP, FrameworkProfile, switch_names
from costmodel.graphs import graph_scope
from costmodel.memory_model import MemoryModel
from costmodel.recompute_modules import module_set
from hardware_catalog.frameworks import (
    PRECISIONS,
    framework_profile,
    load_profiles,
    memory_model,
)

# Training's own fields: the workload, and the profile. A framework switch added to Training
# instead of the profile fails here.
WORKLOAD = {"seq_len", "global_batch", "precision", "optimizer", "framework"}
PROFILES = sorted(load_profiles()["frameworks"])


def test_training_keeps_the_workload() -> None:
    names = {f.name for f in dataclasses.fields(Training)}
    assert names == WORKLOAD and len(names) <= 10


def test_the_groups_carry_no_defaults() -> None:
    """No second source of defaults: every value comes from frameworks.yaml."""
    for kind in (*GROUPS.values(), FrameworkProfile):
        for f in dataclasses.fields(kind):
            assert f.default is dataclasses.MISSING, (kind.__name__, f.name)
            assert f.default_factory is dataclasses.MISSING, (kind.__name__, f.name)


def test_every_field_has_a_docstring_under_it() -> None:
    for kind in (*GROUPS.values(), FrameworkProfile):
        tree = ast.parse(inspect.getsource(kind))
        body = next(node for node in tree.body if isinstance(node, ast.ClassDef)).body
        documented = {
            stmt.target.id for stmt, after in zip(body, body[1:], strict=False)
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)
            and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str) and after.value.value.strip()}
        assert documented == {f.name for f in dataclasses.fields(kind)}, kind.__name__


def _at(settings: dict[str, Any], precision: str) -> dict[str, Any]:
    """A profile's YAML entries at a precision (``<switch>_<precision>`` wins there)."""
    out = {k: v for k, v in settings.items() if k.rsplit("_", 1)[-1] not in PRECISIONS}
    out.update({k.rsplit("_", 1)[0]: v for k, v in settings.items()
                if k.rsplit("_", 1)[-1] == precision})
    return out


def _as_read(name: str, value: Any, profile: FrameworkProfile) -> Any:
    """A YAML value as the profile holds it (lists as tuples, normalised where the group does)."""
    if name == "cuda_graph_scope":
        return graph_scope(profile.kernels.cuda_graph_impl, value)
    if name == "recompute_modules":
        return module_set(value)
    return tuple(value) if isinstance(value, list) else value


def test_the_generic_profile_names_every_switch_once() -> None:
    generic = load_profiles()["frameworks"]["generic"]
    # its memory model section (Megatron-Core's fitted fragmentation) is not a switch
    assert set(_at(generic, "bf16")) - {"memory_model"} == set(switch_names())


@pytest.mark.parametrize("name", PROFILES)
def test_a_profile_overrides_only_what_the_generic_profile_names(name: str) -> None:
    own = load_profiles()["frameworks"][name]
    for precision in PRECISIONS:
        assert set(_at(own, precision)) - {"memory_model"} <= set(switch_names()), name


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("name", PROFILES)
def test_every_value_comes_from_the_yaml(name: str, precision: str) -> None:
    """Each switch is the framework's YAML entry at the precision, else the generic one's; the
    memory model is the YAML's, with the framework's own section over it."""
    frameworks = load_profiles()["frameworks"]
    profile = framework_profile(name, precision)
    generic, own = _at(frameworks["generic"], precision), _at(frameworks[name], precision)
    for switch in switch_names():
        expected = own[switch] if switch in own else generic[switch]
        assert profile.switch(switch) == _as_read(switch, expected, profile), (name, switch)
    mm = {**load_profiles()["memory_model"], **(frameworks[name].get("memory_model") or {})}
    assert dataclasses.asdict(profile.memory_model) == mm
    assert profile.memory_model == memory_model(name)


def test_a_study_override_wins_and_an_unknown_name_is_refused() -> None:
    tuned = framework_profile("nanotron", "bf16", {"tp_comm_overlap": True})
    assert tuned.tp.tp_comm_overlap and tuned.kernels.loss_kernel == "eager_fp32"
    with pytest.raises(SpecError, match="training.no_such_switch: not a framework switch"):
        framework_profile("generic", "bf16", {"no_such_switch": 1})


def test_a_profile_needs_every_switch() -> None:
    switches = framework_profile("generic").switches()
    del switches["dtensor_tp"]
    with pytest.raises(SpecError, match="needs every switch, but got none for dtensor_tp"):
        FrameworkProfile.from_switches({**switches, "memory_model": MemoryModel()})


@pytest.mark.parametrize("name", PROFILES)
def test_flat_names_round_trip(name: str) -> None:
    profile = framework_profile(name)
    assert FrameworkProfile.from_switches(
        {**profile.switches(), "memory_model": profile.memory_model}) == profile
    training = Training(seq_len=4096, global_batch=8, framework=profile)
    assert Training.from_dict(training.to_dict()) == training
    assert set(training.to_dict()) == (WORKLOAD - {"framework"}) | set(SWITCH_GROUP) | {
        "memory_model"}


def test_with_switches_changes_one_group_and_keeps_the_rest() -> None:
    profile = framework_profile("generic")
    tuned = profile.with_switches(overlap_grad_reduce=False, moe_load_imbalance=1.5)
    assert not tuned.dp.overlap_grad_reduce and tuned.moe.moe_load_imbalance == 1.5
    assert tuned.numerics == profile.numerics
    assert tuned.dp.dp_bucket_bytes == profile.dp.dp_bucket_bytes
    with pytest.raises(SpecError, match="training.moe_load_imbalance must be >= 1"):
        profile.with_switches(moe_load_imbalance=0.5)
