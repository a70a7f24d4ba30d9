"""The export variants (issue #37): H800 SXM5 and A800 SXM4 40/80 GB are their H100/A100 with
NVLink capped at 400 GB/s bidirectional; every number cited, studies on them run, and a TP group
inside the node costs more than on the full-NVLink part."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from clirunner import cli

from hardware_catalog import get_gpu, sources
from hardware_catalog.catalog import NUMERIC_FIELDS

VARIANTS = {"h800-sxm-80gb": "h100-sxm-80gb", "a800-sxm-40gb": "a100-sxm-40gb",
            "a800-sxm-80gb": "a100-sxm-80gb"}
STUDY = ("name: v\nmodel: {preset: llama3-8b}\ncluster: {gpu: %s, nodes: 2}\n"
         "training: {framework: megatron-lm, seq_len: 4096, global_batch: 256}\n"
         "search: {trials: 20, seed: 0}\n")


@pytest.mark.parametrize(("variant", "full"), VARIANTS.items())
def test_only_nvlink_differs_from_the_full_part(variant: str, full: str) -> None:
    v, f = get_gpu(variant), get_gpu(full)
    # 400 GB/s bidirectional, unidirectional in the catalog
    assert v.intra_node_bw_bytes_per_s == 200e9 < f.intra_node_bw_bytes_per_s
    for field in NUMERIC_FIELDS:
        if field != "intra_node_bw_bytes_per_s":
            assert getattr(v, field) == getattr(f, field), field
    assert v.family == f.family and v.efficiency == f.efficiency


@pytest.mark.parametrize("variant", VARIANTS)
def test_catalog_show_cites_every_number(variant: str) -> None:
    code, out, err = cli("catalog", "show", variant)
    assert code == 0, err
    doc = json.loads(out)
    given = [f for f in NUMERIC_FIELDS if f in sources(variant)]
    assert {"peak_flops_bf16", "hbm_bytes", "intra_node_bw_bytes_per_s"} <= set(given)
    for field in given:
        assert len(doc["sources"][field]["source"]) > 20, field
    assert "400 GB/s" in doc["sources"]["intra_node_bw_bytes_per_s"]["source"]
    assert doc["sources"]["efficiency"]["source"] == get_gpu(variant).efficiency.source


@pytest.mark.parametrize(("variant", "full"), VARIANTS.items())
def test_a_study_runs_and_tp_in_the_node_costs_more(tmp_path: Path, variant: str,
                                                     full: str) -> None:
    times = {}
    for gpu in (variant, full):
        study = tmp_path / f"{gpu}.yaml"
        study.write_text(STUDY % gpu)
        code, out, err = cli("explain", str(study), "--plan", "tp=8,pp=1,mbs=1,zero=1",
                             "--json")
        assert code == 0, err
        doc = json.loads(out)
        times[gpu] = sum(c["time_s"] for c in doc["communication"]["collectives"]
                         if c["group"] == "tp")
        assert doc["calibration"]["family"] == get_gpu(gpu).family
    # bandwidth 1.5x (A800) and 2.25x (H800) slower; the per-step latency is the same
    assert times[variant] > 1.25 * times[full]
    code, _, err = cli("run", str(tmp_path / f"{variant}.yaml"), "-o", str(tmp_path / "r"),
                       "--quiet")
    assert code == 0, err
