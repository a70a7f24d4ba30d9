"""A plan's own Megatron-Core selective modules (Plan.recompute_modules; costmodel/
recompute_modules.py): a plan that names a set is priced exactly as a training whose
recompute_modules are that set, one plan or many at once; the validity table refuses a set where
Megatron-Core would; the sets worth searching come from what each module frees."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from costmodel import ClusterSpec, Plan, SpecError, Training, check_plan, estimate, estimate_batch
from costmodel.plans import plans_to_arrays
from costmodel.specs import GpuSpec, ModelSpec
from costmodel.terms import freeing_modules
from search.inputs.presets import get_preset
from search.inputs.specs import training_spec

SEQ = 4096
# a dense, a MoE and an MLA model, each with a layout that recomputes selectively
CASES = {
    "llama3-8b": (8, Plan(tp=2, dp=4, sequence_parallel=True, recompute="selective")),
    "qwen3-30b-a3b": (8, Plan(tp=1, dp=8, ep=8, recompute="selective")),
    # Megatron-Bridge's H100 layout (7 / 8 / 6 layers on the first / middle / last rank)
    "deepseek-v3": (1024, Plan(tp=2, pp=8, dp=64, ep=64, vpp=4, sequence_parallel=True,
                               recompute="selective", first_stage_layers=7,
                               last_stage_layers=6)),
}


def _megatron(precision: str = "bf16", **switches: object) -> Training:
    return training_spec(framework="megatron", precision=precision, seq_len=SEQ,
                         global_batch=512, switches=switches)


def _subsets(names: tuple[str, ...]) -> list[tuple[str, ...]]:
    return [s for k in range(1, len(names) + 1) for s in itertools.combinations(names, k)]


def test_the_modules_worth_searching_are_those_that_free_memory() -> None:
    """core_attn frees the log-sum-exp on every model; mlp a dense model's MLP; moe_act the
    routed experts' activation and layernorm a MoE layer's pre-MLP norm (and MLA's input norm),
    both in bf16 only (under fp8 the next GEMM keeps its own cast); mla_up_proj MLA's q, k, v."""
    got = {name: freeing_modules(get_preset(name), _megatron()) for name in CASES}
    assert got == {"llama3-8b": ("core_attn", "mlp"),
                   "qwen3-30b-a3b": ("core_attn", "moe_act", "layernorm"),
                   "deepseek-v3": ("core_attn", "moe_act", "layernorm", "mla_up_proj")}
    assert freeing_modules(get_preset("deepseek-v3"), _megatron("fp8")) == (
        "core_attn", "mla_up_proj")


@pytest.mark.parametrize("precision", ["bf16", "fp8"])
@pytest.mark.parametrize("name", list(CASES))
def test_a_plans_set_prices_as_the_trainings(name: str, precision: str, h100: GpuSpec) -> None:
    """Memory, step time, HFU (every figure of the estimate) of a plan naming a set under the
    default training equal those of the plan naming none under a training with that set."""
    model, (gpus, plan) = get_preset(name), CASES[name]
    cluster, default = ClusterSpec(gpu=h100, num_gpus=gpus), _megatron(precision)
    assert default.framework.activations.recompute_modules == ("core_attn",)
    sets = _subsets(freeing_modules(model, _megatron()))
    for modules in sets:
        own = estimate(model, cluster, Plan(**{**_fields(plan), "recompute_modules": modules}),
                       default)
        theirs = estimate(model, cluster, plan, _megatron(precision, recompute_modules=modules))
        assert own.to_dict() == theirs.to_dict(), modules
        assert (own.memory.peak_bytes, own.step_time_s, own.hfu) == (
            theirs.memory.peak_bytes, theirs.step_time_s, theirs.hfu)
    # more than the default set runs more again: the comparison could fail
    widest = estimate(model, cluster, Plan(**{**_fields(plan), "recompute_modules": sets[-1]}),
                      default)
    assert widest.step_time_s > estimate(model, cluster, plan, default).step_time_s


@pytest.mark.parametrize("name", list(CASES))
def test_one_batch_prices_each_plan_with_its_own_set(name: str, h100: GpuSpec) -> None:
    """Plans of different sets (and none) judged in one vectorised call each get their own."""
    model, (gpus, plan) = get_preset(name), CASES[name]
    cluster, default = ClusterSpec(gpu=h100, num_gpus=gpus), _megatron()
    sets = [(), *_subsets(freeing_modules(model, default))]
    plans = [Plan(**{**_fields(plan), "recompute_modules": s}) for s in sets]
    batch = estimate_batch(model, cluster, default, plans_to_arrays(plans))
    one = [estimate(model, cluster, plan, _megatron(recompute_modules=s or ("core_attn",)))
           for s in sets]
    assert list(batch["peak_mem_bytes"]) == [e.memory.peak_bytes for e in one]
    assert list(batch["step_time_s"]) == [e.step_time_s for e in one]
    assert len(set(batch["peak_mem_bytes"].tolist())) > 1


def _fields(plan: Plan) -> dict[str, object]:
    return {f: getattr(plan, f) for f in plan.__slots__}  # type: ignore[attr-defined]


@pytest.mark.parametrize(("model", "plan", "framework", "match"), [
    ("llama3-8b", Plan(dp=8, recompute="full", recompute_modules=("core_attn",)), "megatron",
     "recompute_modules: recompute_modules is the training's set, or .* but got "
     "recompute_modules=core_attn, recompute=2"),
    ("llama3-8b", Plan(dp=8, recompute="selective", recompute_modules=("mla_up_proj",)),
     "megatron", r"recompute_modules: .* but got recompute_modules=mla_up_proj, recompute=1, "
                 r"selective_recompute=modules, mla=False"),
    ("llama3-8b", Plan(dp=8, recompute="selective", recompute_modules=("moe_act",)), "nemo",
     "experts=0"),
    ("llama3-8b", Plan(dp=8, recompute="selective", recompute_modules=("mlp",)), "torchtitan",
     "selective_recompute=every_other_mm"),
])
def test_the_table_refuses_a_set_megatron_core_would(model: str, plan: Plan, framework: str,
                                                     match: str, h100: GpuSpec) -> None:
    tr = training_spec(framework=framework, precision="bf16", seq_len=SEQ, global_batch=64)
    with pytest.raises(SpecError, match=match):
        check_plan(get_preset(model), ClusterSpec(gpu=h100, num_gpus=8), plan, tr)


def test_a_plan_names_known_modules_once(llama8b: ModelSpec) -> None:
    plan = Plan(recompute="selective", recompute_modules=["mlp", "core_attn", "mlp"])  # type: ignore[arg-type]
    assert plan.recompute_modules == ("mlp", "core_attn")
    assert Plan().recompute_modules == ()
    with pytest.raises(SpecError, match="plan.recompute_modules must hold names of"):
        Plan(recompute="selective", recompute_modules=("bogus",))
    with pytest.raises(SpecError, match="plan.recompute_modules: 'moe' is Megatron-Core's"):
        Plan(recompute="selective", recompute_modules=("moe",))
    assert np.array_equal(plans_to_arrays([plan, Plan()])["recompute_modules"], [1 + 16, 0])
