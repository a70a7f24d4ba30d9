"""The Megatron-MoE-ModelZoo check (benchmarks/modelzoo.py): its rows reach ``predict`` as the
table's runs, with what frameworks.yaml says every row ran and each row's own dispatch, and none
is refused (a run that ran is priced)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from modelzoo import DETAIL, GPUS, QWEN3_235B, ROWS, SOURCE, rows  # noqa: E402

from hardware_catalog.frameworks import release_switches  # noqa: E402
from search.inputs.measured import case_from_row  # noqa: E402
from tcf_search.calibration.predict import predict_frame  # noqa: E402


def test_the_release_entry_is_the_rows() -> None:
    ran = release_switches(SOURCE, DETAIL, QWEN3_235B["model_name"])
    assert ran["qk_norm"] is True and ran["head_dim"] == 128
    assert ran["moe_load_imbalance"] == 1.0  # --moe-router-force-load-balancing
    assert ran["tp_comm_overlap"] is True  # bf16: --tp-comm-overlap


def test_each_row_builds_its_own_dispatch_and_layout() -> None:
    for spec, (_, row) in zip(ROWS, rows().iterrows(), strict=True):
        case = case_from_row(row.to_dict())
        plan, model = case.plan, case.model
        assert model.qk_norm and model.head_dim == 128 and model.moe_experts == 128
        assert plan.tp * plan.pp * plan.dp == GPUS
        assert plan.moe_dispatcher == spec[1] and plan.moe_a2a_overlap == spec[7]
        assert plan.ep == spec[5] and plan.zero_stage == spec[8]
        assert case.training.framework.moe.moe_load_imbalance == 1.0
        if plan.pp == 8:  # 94 layers + embedding + loss over 8 ranks: 11 + 6 x 12 + 11
            assert (plan.first_stage_layers, plan.last_stage_layers) == (11, 11)
        if plan.pp == 1:  # the FSDP row: the counted split on one rank builds every layer
            assert (plan.first_stage_layers, plan.last_stage_layers) == (0, 0)


def test_no_row_is_refused() -> None:
    out = predict_frame(rows())
    assert out["pred_error"].isna().all(), out["pred_error"].tolist()
    assert (out["pred_tokens_per_sec_per_gpu"].astype(float) > 0).all()
