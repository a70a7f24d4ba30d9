"""torchtitan's fp8 as it runs: torchao's dynamic casts are tensor ops that torch.compile fuses
with their producers (``costmodel.kernels.COMPILED_CAST_BYTES``: read bf16, write fp8, the amax
in the producer's kernel), Transformer Engine's are its own kernels at the family's fitted bytes;
fp8 weights (FSDP's float8 all-gather) arrive cast; under a pipeline a torchtitan row without a
micro-batch runs one micro-batch per stage; the 405B rows of torchtitan's 2024-08 table ran their
preset's compile and float8 all-gather."""

from __future__ import annotations

import pytest
from costmodel_helpers import training_for

from costmodel import ClusterSpec, ModelSpec, Plan
from costmodel.kernels import COMPILED_CAST_BYTES, kernels_of
from costmodel.plans import as_plan_arrays, plans_to_arrays
from costmodel.specs import GpuSpec
from search.inputs.measured import case_from_row

PLAN = Plan(tp=1, pp=1, dp=8, micro_batch=2, zero_stage=3, recompute="selective")
# a torchtitan row in the measured file's schema (made up here, not read from the shared file)
TITAN = {"model_name": "Llama 3.1 405B", "layers": 126, "hidden": 16384, "ffn_hidden": 53248,
         "heads": 128, "kv_heads": 8, "vocab": 128256, "seq_len": 8192,
         "gpu": "h100-sxm-80gb", "num_gpus": 512, "tp": 8, "pp": 8, "vpp": 1, "cp": 1,
         "dp": 8, "zero_stage": 3, "global_batch": 256, "recompute": "full",
         "precision": "fp8", "framework": "torchtitan", "source": "torchtitan"}
DOC_0824 = "pytorch/torchtitan docs/performance.md @3faaa1a0 (2024-08-23)"


def _kernels(h100: GpuSpec, framework: str, compile: bool, **switches: object):  # noqa: ANN202
    tr = training_for(framework, seq_len=8192, global_batch=16, precision="fp8",
                      compile=compile, **switches)
    return kernels_of(ClusterSpec(gpu=h100, num_gpus=8), tr, as_plan_arrays(plans_to_arrays(
        [PLAN])))


def test_a_compiled_torchao_cast_moves_three_bytes_an_element(h100: GpuSpec) -> None:
    fitted = h100.efficiency.fp8_cast_bytes_per_element
    assert fitted > COMPILED_CAST_BYTES
    assert _kernels(h100, "torchtitan", compile=True).cast_bytes == COMPILED_CAST_BYTES
    # eager torchao, and Transformer Engine's kernels under any compile setting: the fitted bytes
    assert _kernels(h100, "torchtitan", compile=False).cast_bytes == fitted
    assert _kernels(h100, "nemo", compile=True).cast_bytes == fitted


def test_a_gemm_pays_its_cast_bytes_over_the_achieved_bandwidth(h100: GpuSpec) -> None:
    compiled = _kernels(h100, "torchtitan", compile=True)
    eager = _kernels(h100, "torchtitan", compile=False)
    n, k = 4096.0, 14336.0
    m = float(compiled.tokens[0])
    elements = m * k + k * n  # the input, and the weight torchao casts at every forward
    gap = (eager.cast_bytes - compiled.cast_bytes) * elements / compiled.hbm
    assert float((eager.gemm(n, k) - compiled.gemm(n, k))[0]) == pytest.approx(gap, rel=1e-9)


@pytest.mark.parametrize(("framework", "switches", "casts"), [
    ("torchtitan", {}, True),  # Float8Linear casts its bf16 weight at every forward
    ("torchtitan", {"fp8_param_gather": True}, False),  # FSDP's float8 all-gather: cast already
    ("nemo", {}, False),  # TE caches the weight's cast from a step's first micro-batch
])
def test_which_gemms_cast_their_weight(h100: GpuSpec, framework: str,
                                       switches: dict[str, object], casts: bool) -> None:
    assert _kernels(h100, framework, compile=True, **switches).weight_cast is casts


def test_compiled_fp8_steps_faster_than_eager_fp8(llama8b: ModelSpec, h100: GpuSpec) -> None:
    from costmodel import estimate

    def step(compile: bool, precision: str) -> float:
        tr = training_for("torchtitan", seq_len=8192, global_batch=16, precision=precision,
                          compile=compile)
        return estimate(llama8b, ClusterSpec(gpu=h100, num_gpus=8), PLAN, tr).step_time_s

    # compile saves the eager elementwise passes at either precision, and at fp8 the casts too
    assert step(False, "fp8") - step(True, "fp8") > step(False, "bf16") - step(True, "bf16")


@pytest.mark.parametrize(("cells", "micro_batch", "given"), [
    ({}, 4, True),  # 256 sequences over dp 8: 32 a rank, in pp = 8 micro-batches
    ({"global_batch": 64}, 1, True),
    ({"micro_batch": 2}, 2, True),  # the row's cell wins
    ({"global_batch": 100}, 1, False),  # no even split: the field's default, searched
])
def test_a_torchtitan_pipeline_runs_a_micro_batch_per_stage(
        cells: dict[str, object], micro_batch: int, given: bool) -> None:
    case = case_from_row({**TITAN, **cells})
    assert case.plan.micro_batch == micro_batch
    assert ("micro_batch" in case.given) is given
    noted = any(a.startswith("micro_batch=") for a in case.assumed)
    assert noted is (given and "micro_batch" not in cells)


def test_no_pipeline_and_other_stacks_keep_an_empty_micro_batch_searched() -> None:
    for cells in ({"pp": 1, "dp": 64}, {"framework": "nemo", "source": "nemo"}):
        case = case_from_row({**TITAN, **cells})
        assert "micro_batch" not in case.given


@pytest.mark.parametrize(("precision", "param_gather"), [("fp8", True), ("bf16", False)])
def test_the_2024_08_405b_rows_ran_their_preset(precision: str, param_gather: bool) -> None:
    """train_configs/llama3_405b.toml at 3faaa1a0: compile = true, and at fp8
    enable_fsdp_float8_all_gather = true; the table's other models ran presets without
    compile."""
    row = {**TITAN, "source_detail": DOC_0824, "num_gpus": 128, "pp": 1, "dp": 16,
           "micro_batch": 2, "global_batch": 32, "precision": precision}
    fw = case_from_row(row).training.framework
    assert fw.kernels.fused_elementwise is True
    assert fw.numerics.fp8_param_gather is param_gather
    other = case_from_row({**row, "model_name": "Llama 3 70B", "layers": 80, "hidden": 8192,
                           "ffn_hidden": 28672, "heads": 64})
    assert other.training.framework.kernels.fused_elementwise is False
