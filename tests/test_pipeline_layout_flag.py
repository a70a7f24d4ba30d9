"""An explicit per-virtual-stage layout (Megatron-Core's ``--pipeline-model-parallel-layout``,
torchtitan's per-stage module lists): the frameworks whose profile takes one
(``uneven_chunks``) get any split of a rank's layers into vpp chunks in the search and the
exports; the others refuse with the table's ``vpp_layers`` rule."""

from __future__ import annotations

import dataclasses
import re
import warnings
from pathlib import Path

import numpy as np
import pytest

from costmodel import check_plan
from costmodel.mapping import chunk_counts, chunk_split_exists, launchable_chunks, stage_counts
from search.inputs.planfile import PlanFile, load_plan_file
from search.inputs.specs import build_specs
from search.inputs.study import parse_study
from search.prune import memory_stage
from search.space import AXES, build_space, enumerate_layouts, plan_from_row
from tcf_search.export import ExportOptions, ExportRefused, render
from tcf_search.export.torchtitan import model_parts
from tcf_search.export.view import facts_of, format_switches, virtual_stage_layers

PLANS = Path(__file__).parent / "golden" / "export" / "plans"
LAYOUT = re.compile(r"--pipeline-model-parallel-layout '([^']*)'")


def _plan(layers: int, pp: int, vpp: int, first: int, last: int) -> PlanFile:
    """dense70b's plan file reshaped: tp 8, pp stages, dp 8, no recompute."""
    pf = load_plan_file(PLANS / "dense70b.yaml")
    plan = dataclasses.replace(pf.plan, pp=pp, dp=8, vpp=vpp, first_stage_layers=first,
                               last_stage_layers=last, recompute="selective",
                               recompute_layers=0,
                               pp_schedule="interleaved" if vpp > 1 else "1f1b")
    return dataclasses.replace(pf, model=dataclasses.replace(pf.model, layers=layers),
                               num_gpus=8 * pp * 8, plan=plan)


def _megatron_layout(text: str, pp: int):  # type: ignore[no-untyped-def]
    """Megatron-Core's own parser of the flag (megatron-core, CPU-only import)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mod = pytest.importorskip("megatron.core.transformer.pipeline_parallel_layer_layout")
    return mod.PipelineParallelLayerLayout(text, pp)


def _decoders_per_virtual_stage(layout, pp: int, vpp: int) -> list[int]:  # type: ignore[no-untyped-def]
    from megatron.core.transformer.enums import LayerType
    return [layout.layout[rank][chunk].count(LayerType.decoder)
            for chunk in range(vpp) for rank in range(pp)]


# DeepSeek-V3's 61 layers on pp 16 (3 + 14 * 4 + 2), interleaved: neither the first/last flags
# (3 % 2 != 0) nor the counted embedding and loss (4 - 3 = 1, but 4 - 2 = 2) build it
DEEPSEEK = (61, 16, 2, 3, 2)


def test_deepseek_v3_split_is_written_as_megatron_cores_layout() -> None:
    layers, pp, vpp, first, last = DEEPSEEK
    assert not bool(launchable_chunks(layers, pp, vpp, first, last))
    pf = _plan(*DEEPSEEK)
    script = render("megatron", pf)["megatron.sh"]
    found = LAYOUT.search(script)
    assert found, script
    text = found.group(1)
    # the layout gives vpp; the other split flags conflict with it (arguments.py, TransformerConfig)
    for flag in ("--num-virtual-stages-per-pipeline-rank", "--decoder-first-pipeline-num-layers",
                 "--decoder-last-pipeline-num-layers", "--account-for"):
        assert flag not in script
    layout = _megatron_layout(text, pp)
    assert layout.virtual_pipeline_model_parallel_size == vpp
    assert layout.validate_layer_layout(num_layers=layers,
                                        mtp_num_layers=pf.model.mtp_layers) is False
    expected = chunk_counts(stage_counts(layers, pp, first, last), vpp)
    assert _decoders_per_virtual_stage(layout, pp, vpp) == list(expected)
    assert expected[0] == 1 and expected[pp - 1] == 1  # rank 0's and rank 15's first chunks
    nemo = render("nemo", pf)["nemo.sh"]  # Megatron-Bridge: TransformerConfig's field
    assert f"model.pipeline_model_parallel_layout={text}" in nemo
    assert "num_layers_in_first_pipeline_stage" not in nemo


@pytest.mark.parametrize("layers,pp,vpp,first,last", [
    (80, 4, 2, 17, 19), (126, 16, 4, 6, 8), (94, 8, 3, 10, 12), (61, 4, 4, 15, 16), (9, 2, 3, 4, 5),
    # middle ranks a layer apart (issue #38): 80 on pp 32 as 3, 15 x 3, 15 x 2, 2; 19 | 22 21 | 18
    (80, 32, 1, 3, 2), (80, 4, 2, 19, 18), (70, 8, 1, 9, 8),
])
def test_every_layout_parses_to_the_cost_models_chunks(layers: int, pp: int, vpp: int,
                                                       first: int, last: int) -> None:
    pf = _plan(layers, pp, vpp, first, last)
    found = LAYOUT.search(render("megatron", pf)["megatron.sh"])
    assert found
    layout = _megatron_layout(found.group(1), pp)
    layout.validate_layer_layout(num_layers=layers, mtp_num_layers=None)
    view = facts_of(pf, ExportOptions(), "megatron")
    assert _decoders_per_virtual_stage(layout, pp, vpp) == virtual_stage_layers(view)


def test_torchtitan_lists_each_virtual_stages_modules() -> None:
    pf = _plan(*DEEPSEEK)
    render("torchtitan", pf)
    parts = model_parts(facts_of(pf, ExportOptions(), "torchtitan"), "lm_head")
    assert parts is not None
    counts = [sum(name.startswith("layers.") for name in part) for part in parts]
    assert counts == list(chunk_counts(stage_counts(61, 16, 3, 2), 2))
    assert parts[0][0] == "tok_embeddings" and parts[-1][-1] == "lm_head"


def test_only_the_profiles_with_a_layout_launch_uneven_chunks() -> None:
    launch = {fmt: format_switches(fmt).uneven_chunks
              for fmt in ("megatron", "nemo", "torchtitan", "nanotron", "deepspeed")}
    assert launch == {"megatron": True, "nemo": True, "torchtitan": True, "nanotron": False,
                      "deepspeed": False}
    pf = _plan(80, 4, 2, 17, 19)
    for fmt in ("nanotron", "deepspeed"):
        with pytest.raises(ExportRefused, match="vpp_layers: .*uneven_chunks=False"):
            render(fmt, pf)


STUDY = """
model:
  architecture: {{layers: 7, hidden: 512, ffn_hidden: 1536, heads: 8, kv_heads: 4, vocab: 32000}}
training: {{seq_len: 2048, global_batch: 48{framework}}}
cluster: {{gpu: h100-sxm-80gb, gpus: 24, gpus_per_node: 8}}
search_space:
  tp: [1, 2]
  pp: [1, 2, 3]
  cp: 1
  vpp: [1, 2]
  zero_stage: [0, 1]
  micro_batch: [1, 2]
  recompute: [none]
  sequence_parallel: false
"""


def test_search_places_interleaved_splits_only_a_layout_builds() -> None:
    """7 layers on 3 stages in 2 chunks: no split Megatron's first/last flags or its counted
    embedding and loss build (7 is odd; (7 + k) % 6 != 0), so before the explicit layout the
    search had no such layout; with it (the generic profile) it places one, and the export
    writes it as a layout Megatron-Core parses."""
    assert not bool(chunk_split_exists(7, 3, 2)) and bool(chunk_split_exists(7, 3, 2, True))
    study = parse_study(STUDY.format(framework=""))
    specs = build_specs(study)
    space = build_space(study, specs)
    cols = enumerate_layouts(space).columns
    both = np.flatnonzero((cols["pp"] == 3) & (cols["vpp"] == 2))
    assert len(both) > 0
    stage = memory_stage(specs, space, cols)
    placed = 0
    for i in both[:4]:
        placement = stage.place(int(i))
        assert placement is not None
        row = {a: int(cols[a][i]) for a in AXES}
        row.update(placement.plan_fields(7, 3, False, 2))
        plan = plan_from_row(row)
        assert plan.first_stage_layers > 0
        check_plan(specs.model, specs.cluster, plan, specs.training, specs.switches)
        pf = PlanFile(study="layout", model=specs.model, gpu=specs.cluster.gpu.id,
                      num_gpus=24, gpus_per_node=8, training=specs.training, plan=plan)
        found = LAYOUT.search(render("megatron", pf)["megatron.sh"])
        assert found
        _megatron_layout(found.group(1), 3).validate_layer_layout(num_layers=7,
                                                                  mtp_num_layers=None)
        placed += 1
    assert placed
    # a framework without an explicit layout (DeepSpeed's PipelineModule) has none of them
    plain = parse_study(STUDY.format(framework=", framework: deepspeed"))
    cols = enumerate_layouts(build_space(plain, build_specs(plain))).columns
    assert not np.any((cols["pp"] == 3) & (cols["vpp"] == 2))
