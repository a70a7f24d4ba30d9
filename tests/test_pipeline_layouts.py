"""Pipeline layouts as Megatron-LM builds them: uneven first/last stages with interleaving, the
embedding and the loss counted as layers; one representation (first/last stage layers) read by
the rules, the search's placement, predict and the Megatron export."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from costmodel_helpers import training_for

from costmodel.estimate import check_plan
from costmodel.mapping import (
    chunk_split_exists,
    counted_split,
    launchable_chunks,
    stage_counts,
)
from search.inputs.measured import CaseError, case_from_row, presumed_split
from search.inputs.planfile import load_plan_file
from search.placement import candidates
from tcf_search.calibration.predict import predict_csv
from tcf_search.export import render
from tcf_search.export.options import ExportOptions
from tcf_search.export.view import facts_of, virtual_stage_layers

PLANS = Path(__file__).parent / "golden" / "export" / "plans"


def test_counted_split_worked_examples() -> None:
    # Llama 3.1 405B, pp 16, both counted: (126 + 2) / 16 = 8 units a rank -> 7 + 14*8 + 7
    assert counted_split(126, 16, True, True) == (7, 7)
    # MLPerf's pp 8: 128 / 8 = 16 -> 15 + 6*16 + 15
    assert counted_split(126, 8, True, True) == (15, 15)
    # the loss alone: (61 + 1) / 2 = 31 -> 31 on the first rank, 30 on the last
    assert counted_split(61, 2, False, True) == (31, 30)
    assert counted_split(126, 16, False, False) == (0, 0)
    assert counted_split(126, 5, True, True) == (-1, -1)  # 128 % 5 != 0
    # no pipeline: Megatron-Core takes the flags (96 % 1 == 0) and builds all 94 layers on the
    # one rank (the Megatron-MoE-ModelZoo's Qwen3-235B FSDP run, PP 1, sets both)
    assert counted_split(94, 1, True, True) == (0, 0)


@pytest.mark.parametrize(("layers", "pp", "vpp", "first", "last", "ok"), [
    (126, 16, 4, 7, 7, True),    # counted: c = 8, 8 % 4 == 0, ends 8 - 1
    (126, 16, 8, 7, 7, True),    # c = 8, 8 % 8 == 0
    (126, 16, 4, 6, 8, False),   # 6 % 4 != 0 and 6 != 8 - 1
    (126, 8, 8, 15, 15, True),   # dgxc / MLPerf: c = 16
    (126, 16, 2, 8, 6, True),    # flags: 8, 8, 6 all % 2 == 0
    (126, 16, 4, 0, 0, False),   # even: 126 % 64 != 0
    (128, 16, 4, 0, 0, True),    # even: 128 % 64 == 0
    (61, 2, 2, 31, 30, False),   # c = 31 is odd
    (62, 2, 2, 31, 31, True),    # both counted: c = 32 a rank, 32 % 2 == 0
])
def test_launchable_chunks(layers: int, pp: int, vpp: int, first: int, last: int,
                           ok: bool) -> None:
    assert bool(launchable_chunks(layers, pp, vpp, first, last)) is ok


def test_some_split_exists_exactly_when_a_candidate_does() -> None:
    for layers in (61, 94, 126):
        for pp in (2, 3, 4, 8, 16):
            for vpp in (2, 3, 4, 8):
                assert bool(chunk_split_exists(layers, pp, vpp)) == bool(
                    len(candidates(layers, pp, True, vpp))), (layers, pp, vpp)
                # an explicit layout: any split with a layer a rank
                assert bool(chunk_split_exists(layers, pp, vpp, any_split=True)) == bool(
                    len(candidates(layers, pp, True, vpp, any_chunks=True))), (layers, pp, vpp)


def _plan_405b(first: int, last: int, vpp: int = 4):  # type: ignore[no-untyped-def]
    pf = load_plan_file(PLANS / "dense70b.yaml")
    model = dataclasses.replace(pf.model, layers=126)
    plan = dataclasses.replace(pf.plan, tp=8, pp=16, dp=1, vpp=vpp, first_stage_layers=first,
                               last_stage_layers=last, recompute="none", recompute_layers=0)
    return dataclasses.replace(pf, model=model, plan=plan)


def test_megatron_export_counts_the_embedding_and_the_loss() -> None:
    files = render("megatron", _plan_405b(7, 7))
    script = files["megatron.sh"]
    assert "--account-for-embedding-in-pipeline-split" in script
    assert "--account-for-loss-in-pipeline-split" in script
    assert "--decoder-first-pipeline-num-layers" not in script
    flags = render("megatron", _plan_405b(8, 6, vpp=2))["megatron.sh"]
    assert "--decoder-first-pipeline-num-layers 8" in flags
    assert "--account-for" not in flags
    # 6 + 14 * 8 + 8 is neither: the explicit per-virtual-stage layout
    layout = render("megatron", _plan_405b(6, 8))["megatron.sh"]
    assert "--pipeline-model-parallel-layout" in layout and "--account-for" not in layout
    assert "--decoder-first-pipeline-num-layers" not in layout
    nemo = render("nemo", _plan_405b(7, 7))["nemo.sh"]  # Megatron-Bridge: the same fields
    assert "model.account_for_embedding_in_pipeline_split=true" in nemo
    assert "num_layers_in_first_pipeline_stage" not in nemo


def test_virtual_chunks_leave_the_embedding_and_loss_slot_empty() -> None:
    view = facts_of(_plan_405b(7, 7), ExportOptions(), "megatron")
    chunks = virtual_stage_layers(view)  # chunk c of rank r at c * 16 + r, 2 layers a chunk
    assert sum(chunks) == 126
    assert chunks[0] == 1 and chunks[-1] == 1  # rank 0's first, rank 15's last chunk
    assert chunks.count(1) == 2 and chunks.count(2) == 62


HEADER = ("case_id,model_name,layers,hidden,ffn_hidden,heads,kv_heads,vocab,seq_len,ffn_type,"
          "gpu,gpus_per_node,num_gpus,tp,pp,vpp,cp,dp,zero_stage,micro_batch,global_batch,"
          "recompute,sequence_parallel,precision,framework,first_stage_layers,last_stage_layers,"
          "embedding_in_pipeline_split,loss_in_pipeline_split")
LLAMA405 = "l405,126,16384,53248,128,8,128256,8192,swiglu,h100-sxm-80gb,8,1024"


def predicted(tmp_path: Path, rows: list[str]) -> pd.DataFrame:
    """``tcf-search predict``'s output for CSV rows of HEADER's columns, by case_id."""
    src = tmp_path / "cases.csv"
    src.write_text(HEADER + "\n" + "\n".join(rows) + "\n")
    return predict_csv(src, tmp_path / "out.csv").set_index("case_id")


def test_predict_chooses_and_reports_the_split(tmp_path: Path) -> None:
    rows = [f"free,{LLAMA405},8,8,8,1,16,1,1,512,full,true,bf16,megatron,,,,",
            f"counted,{LLAMA405},8,8,8,1,16,1,1,512,full,true,bf16,megatron,,,true,true",
            f"flags,{LLAMA405},8,16,2,1,8,1,1,512,full,true,bf16,megatron,8,6,,",
            f"bad,{LLAMA405},8,8,8,1,16,1,1,512,full,true,bf16,megatron,15,,true,"]
    out = predicted(tmp_path, rows)
    free, counted = out.loc["free"], out.loc["counted"]
    # 126 on pp 8 x vpp 8: only the counted split (15 + 6*16 + 15) is launchable
    assert (int(free["pred_choice_first_stage_layers"]),
            int(free["pred_choice_last_stage_layers"])) == (15, 15)
    assert free["pred_tokens_per_sec_per_gpu"] == counted["pred_tokens_per_sec_per_gpu"]
    assert pd.isna(counted["pred_choice_first_stage_layers"])  # given
    assert pd.isna(out.loc["flags", "pred_error"]) or not out.loc["flags", "pred_error"]
    assert "cannot be given with" in out.loc["bad", "pred_error"]


def test_predict_splits_61_layers_where_the_launcher_takes_a_layout(tmp_path: Path) -> None:
    # DeepSeek-V3's 61 layers on pp 16 x vpp 2: no first/last flags nor counted split builds
    # whole chunks, Megatron-Core's --pipeline-model-parallel-layout does (the megatron
    # profile's uneven_chunks); DeepSpeed's pipeline has no interleaving at all
    shape = "d61,61,4096,14336,32,8,128256,4096,swiglu,h100-sxm-80gb,8,128"
    rows = [f"layout,{shape},1,16,2,1,8,1,1,256,full,false,bf16,megatron,,,,",
            f"no_layout,{shape},1,16,2,1,8,1,1,256,full,false,bf16,deepspeed,,,,"]
    out = predicted(tmp_path, rows)
    got = out.loc["layout"]
    first, last = (int(got[f"pred_choice_{k}_stage_layers"]) for k in ("first", "last"))
    # the layout also lets the middle ranks hold shares a layer apart
    ranks = stage_counts(61, 16, first, last, near_even=True)
    assert sum(ranks) == 61 and min(ranks) >= 1 and max(ranks[1:-1]) - min(ranks[1:-1]) <= 1
    assert got["pred_tokens_per_sec_per_gpu"] > 0
    assert out.loc["no_layout", "pred_error"]  # refused, not priced


def test_measured_row_with_a_split_that_does_not_count() -> None:
    row = dict(zip(HEADER.split(","), (f"x,{LLAMA405},8,8,8,1,16,1,1,512,full,true,bf16,"
                                       "megatron,,,true,true").split(","), strict=True))
    row["pp"] = "5"
    with pytest.raises(CaseError, match="split evenly over pp=5"):
        case_from_row(row)
    assert np.asarray(launchable_chunks(126, 8, 8, 15, 15)).all()


def test_calibration_presumes_the_counted_split_only_where_no_other_builds() -> None:
    """NVIDIA's 405B rows leave the split unsaid: 126 layers over 8 x 8 chunks build only with
    the embedding and the loss counted (15 / 16 / 15), so the fit and the accuracy report take
    that; an even split, a given split, a framework without the flags or vpp 1 stay as given."""
    row = dict(zip(HEADER.split(","), (f"x,{LLAMA405},8,8,8,1,16,1,1,512,full,true,bf16,"
                                       "nemo,,,,").split(","), strict=True))
    case = case_from_row(presumed_split(row))
    assert (case.plan.first_stage_layers, case.plan.last_stage_layers) == (15, 15)
    raw = case_from_row(row)
    with pytest.raises(ValueError, match="vpp_layers"):  # unsaid and uneven: refused as given
        check_plan(raw.model, raw.cluster, raw.plan, raw.training)
    unchanged = [{**row, "framework": "deepspeed"}, {**row, "vpp": "1"},
                 {**row, "first_stage_layers": "14", "last_stage_layers": "14"},
                 {**row, "layers": "128"}]
    for r in unchanged:
        assert presumed_split(r) == r


def test_a_release_splits_as_its_recipe_does(tmp_path: Path) -> None:
    """A Megatron-Bridge release whose recipe counts the embedding and the loss as layers
    (Qwen3-235B: 94 + 2 units, 11 / 12 / 11 at pp 8) or splits evenly (Llama 3 70B) gives the
    split, which predict then prices rather than searches; a split cell the row fills wins."""
    bridge = "megatron-bridge,NVIDIA-NeMo/Megatron-Bridge docs/performance-summary-archive.md"
    qwen = ("qwen,Qwen3_235B_a22B,94,4096,1536,64,4,151936,4096,swiglu,h100-sxm-80gb,8,256,"
            "2,8,4,1,16,1,1,2048,,,fp8,,{first},{last},,,128,8,1536,32,"
            f"{bridge} section 26.04.01 DGX-H100")
    llama = ("llama,LLAMA3_70B,80,8192,28672,64,8,128256,8192,swiglu,h100-sxm-80gb,8,64,"
             "4,8,5,1,2,1,1,128,,,fp8,,,,,,,,,1,"
             f"{bridge} section 25.11 DGX-H100")
    header = HEADER + ",moe_experts,moe_topk,moe_ffn_hidden,ep,source,source_detail"
    src = tmp_path / "cases.csv"
    src.write_text("\n".join([header, qwen.format(first="", last=""),
                               qwen.format(first="10", last="12").replace("qwen,", "given,", 1),
                               llama]) + "\n")
    out = predict_csv(src, tmp_path / "out.csv").set_index("case_id")
    assert not out["pred_error"].fillna("").astype(str).str.len().any()
    chosen = ["pred_choice_first_stage_layers", "pred_choice_sequence_parallel"]
    assert out[chosen].isna().all().all()
    rows = pd.read_csv(src, dtype=str, keep_default_na=False).set_index("case_id")
    splits = {k: (c.plan.first_stage_layers, c.plan.last_stage_layers, c.plan.sequence_parallel)
              for k in rows.index for c in [case_from_row({"case_id": k, **rows.loc[k]})]}
    assert splits == {"qwen": (11, 11, True), "given": (10, 12, True), "llama": (0, 0, True)}


def test_interleaving_divides_the_bubble_by_the_chunks_the_layers_make(h100) -> None:
    """A stage's chunk step runs at least one layer: 126 layers on pp 32 (4 a stage, 2 on the
    ends) leave the same bubble in 8 virtual stages as in 4 (the other 4 empty); where vpp
    divides a stage's layers (63 on each of 2 stages: 7 chunks of 9) it divides the bubble."""
    from costmodel import ClusterSpec, Plan, estimate
    from search.inputs.presets import PRESETS

    model = PRESETS["llama3.1-405b"]
    cluster = ClusterSpec(gpu=h100, num_gpus=32 * 8 * 4)
    tr = training_for(seq_len=8192, global_batch=256)

    def bubble(pp: int, vpp: int, first: int = 0, last: int = 0) -> float:
        plan = Plan(tp=8, pp=pp, dp=32 * 4 // pp, vpp=vpp, sequence_parallel=True,
                    recompute="full", first_stage_layers=first, last_stage_layers=last)
        return estimate(model, cluster, plan, tr).bubble_time_s

    assert bubble(32, 8, 4, 2) == pytest.approx(bubble(32, 4, 4, 2), rel=0.02)
    assert bubble(32, 2, 4, 2) == pytest.approx(2 * bubble(32, 4, 4, 2), rel=0.02)
    assert bubble(2, 7) == pytest.approx(bubble(2, 1) / 7, rel=0.02)


def test_nanotron_runs_more_stages_than_layers_and_megatron_does_not(tmp_path: Path) -> None:
    """Issue #36: nanotron places its blocks by cost and leaves the ranks past the last one
    empty (src/nanotron/models/base.py build_model), so the Playbook's 28-layer model on pp 32
    ran; the table refused it (pp <= layers). A launcher that splits layers over ranks still
    refuses it."""
    shape = "l3b,28,3072,8192,24,8,131072,4096,swiglu,h100-sxm-80gb,8,128"
    rows = [f"nanotron,{shape},4,32,1,1,1,0,1,256,none,true,bf16,nanotron,,,,",
            f"megatron,{shape},4,32,1,1,1,0,1,256,none,true,bf16,megatron,,,,"]
    out = predicted(tmp_path, rows)
    assert pd.isna(out.loc["nanotron", "pred_error"]) or not out.loc["nanotron", "pred_error"]
    assert out.loc["nanotron", "pred_tokens_per_sec_per_gpu"] > 0
    assert "pp_layers" in str(out.loc["megatron", "pred_error"])


def test_predict_fills_megatrons_default_mlp_size_and_says_so(tmp_path: Path) -> None:
    """Issue #36: Megatron-LM's weak-scaling table gives no MLP size; an unset
    --ffn-hidden-size is 4h there (megatron/training/arguments.py validate_args). Another
    framework's row with the cell empty stays refused."""
    shape = "g,24,2048,,16,16,131072,2048,gelu,h100-sxm-80gb,8,8"
    rows = [f"megatron,{shape},1,1,1,1,8,1,1,64,none,false,bf16,megatron,,,,",
            f"titan,{shape},1,1,1,1,8,1,1,64,none,false,bf16,torchtitan,,,,"]
    out = predicted(tmp_path, rows)
    assert out.loc["megatron", "pred_tokens_per_sec_per_gpu"] > 0
    assert out.loc["megatron", "pred_assumed"].startswith("ffn_hidden=8192 ")
    assert "ffn_hidden: required" in out.loc["titan", "pred_error"]


@pytest.mark.parametrize("seed", range(30))
def test_per_rank_counts_keep_the_pins_and_spread_the_rest_earliest_first(seed: int) -> None:
    """costmodel.mapping.ranks_of / stage_counts (issue #38): the pinned ends hold their counts,
    the other ranks share the rest a layer apart at most, the extra layers on the earliest."""
    rng = np.random.default_rng(seed)
    layers, pp = int(rng.integers(4, 130)), int(rng.integers(2, 33))
    first, last = (int(rng.integers(0, 2) * rng.integers(1, layers)) for _ in range(2))
    ranks = stage_counts(layers, pp, first, last, near_even=True)
    if not ranks:
        return
    assert len(ranks) == pp and sum(ranks) == layers and min(ranks) >= 1
    free = [n for i, n in enumerate(ranks)
            if not (i == 0 and first) and not (i == pp - 1 and last and pp > 1)]
    assert (first == 0 or ranks[0] == first) and (last == 0 or ranks[-1] == last)
    assert max(free) - min(free) <= 1 and free == sorted(free, reverse=True)


def test_a_fully_sharded_torchtitan_row_under_a_pipeline_ran_zero1(tmp_path: Path) -> None:
    """torchtitan's FSDP keeps parameters gathered under a pipeline by default
    (get_fsdp_reshard_after_forward_policy: not pp_enabled; hard-coded at 9dec370): its 405B
    table's "FSDP 8, TP 8, PP 8" rows ran ZeRO-1's memory, which predict reads and says;
    without a pipeline ZeRO-3 stays ZeRO-3."""
    rows = [f"titan_pp,{LLAMA405},8,8,1,1,16,3,1,512,full,true,bf16,torchtitan,,,,",
            f"titan_flat,{LLAMA405},8,1,1,1,128,3,1,512,full,true,bf16,torchtitan,,,,"]
    out = predicted(tmp_path, rows)
    assert "zero_stage=1 (fully sharded under a pipeline" in out.loc["titan_pp", "pred_assumed"]
    assert not out.loc["titan_flat", "pred_assumed"]
    # the stage's whole bf16 weights (126 layers of 405B over tp 8 x pp 8: ~11.8 GiB), not a
    # sixteenth of them
    assert out.loc["titan_pp", "pred_mem_weights_gib"] > 10.0
    assert out.loc["titan_flat", "pred_mem_weights_gib"] < 2.0
