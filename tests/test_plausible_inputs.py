"""Issue #38: numbers that parse but no real setup has get one line naming the field and the
plausible range: an override in another unit, a head dimension that is not whole."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from clirunner import main

from search.inputs.specs import build_specs
from search.inputs.study import StudyError, parse_study

STUDY = """
model: {preset: llama3-8b}
training: {seq_len: 8192, global_batch: 256}
cluster: {gpu: h100-sxm-80gb, gpus: 16}
"""
ODD_HEADS = STUDY.replace("{preset: llama3-8b}", "{architecture: {layers: 32, hidden: 4000, "
                          "ffn_hidden: 14336, heads: 30, kv_heads: 10, vocab: 128256}}")


def warnings(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="tcf_search"):
        build_specs(parse_study(text))
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("warning: ")]


def test_an_override_in_gigabits_is_named_with_the_catalog_range(
        caplog: pytest.LogCaptureFixture) -> None:
    # 400 (meant as Gb/s) as bytes/s: the catalog's slowest network is the CPU entry's 0.68 GB/s,
    # so 400 B/s is below 1/100 of it; the fastest is Blackwell Ultra's 800 Gb/s ConnectX-8
    # (100 GB/s), so the plausible range ends at 100 x 1e11
    lines = warnings(caplog, STUDY.replace("gpus: 16}", "gpus: 16, overrides: "
                                           "{network_bw_bytes_per_s: 400}}"))
    assert len(lines) == 1 and "\n" not in lines[0]
    assert lines[0].startswith("warning: cluster.overrides.network_bw_bytes_per_s: 400 is below")
    assert "plausible: 6.81e+06 to 1e+13" in lines[0]


@pytest.mark.parametrize("override", ["network_bw_bytes_per_s: 5.0e+10", "hbm_bytes: 3.0e+10",
                                      "peak_flops_bf16: 4.0e+15"])
def test_a_plausible_override_says_nothing(caplog: pytest.LogCaptureFixture,
                                           override: str) -> None:
    assert warnings(caplog, STUDY.replace("gpus: 16}", f"gpus: 16, overrides: {{{override}}}}}"
                                          )) == []


def test_hbm_in_gigabytes_is_named(caplog: pytest.LogCaptureFixture) -> None:
    lines = warnings(caplog, STUDY.replace("gpus: 16}", "gpus: 16, overrides: {hbm_bytes: 80}}"))
    assert len(lines) == 1 and "cluster.overrides.hbm_bytes: 80 is below" in lines[0]


def test_a_head_dim_that_is_not_whole_is_a_warning_where_the_framework_floors_it(
        caplog: pytest.LogCaptureFixture) -> None:
    lines = warnings(caplog, ODD_HEADS.replace("global_batch: 256",
                                               "global_batch: 256, framework: torchtitan"))
    assert len(lines) == 1
    assert lines[0].startswith("warning: model.architecture.hidden: hidden % heads == 0 must "
                               "hold for a whole head dimension (got hidden=4000, heads=30: "
                               "head dim 133.3); plausible: a multiple of 30 such as 3990 or "
                               "4020")


def test_a_head_dim_that_is_not_whole_is_refused_under_megatron() -> None:
    with pytest.raises(StudyError) as err:
        build_specs(parse_study(ODD_HEADS))  # the generic profile is Megatron-Core's
    assert str(err.value).startswith("model.architecture.hidden: hidden % heads == 0 must hold")
    assert "Megatron-LM asserts it" in str(err.value) and "\n" not in str(err.value)


def test_kv_heads_not_dividing_heads_is_refused() -> None:
    with pytest.raises(StudyError) as err:
        build_specs(parse_study(ODD_HEADS.replace("kv_heads: 10", "kv_heads: 8")))
    assert "heads % model.kv_heads == 0 must hold" in str(err.value)


def test_the_run_warns_once_and_goes_on(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                        caplog: pytest.LogCaptureFixture) -> None:
    study = tmp_path / "s.yaml"
    study.write_text(STUDY.replace("gpus: 16}", "gpus: 16, overrides: "
                                   "{network_bw_bytes_per_s: 400}}") + "search: {trials: 4}\n")
    with caplog.at_level(logging.WARNING, logger="tcf_search"):
        code = main(["run", str(study), "-o", str(tmp_path / "out"), "-q"])
    assert code == 0 and "Traceback" not in capsys.readouterr().err
    said = [r.getMessage() for r in caplog.records]
    assert sum("cluster.overrides.network_bw_bytes_per_s" in m for m in said) == 1
