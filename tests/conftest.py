from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from costmodel import ClusterSpec, GpuSpec, ModelSpec, Training

if TYPE_CHECKING:
    from search.planfile import PlanFile


@pytest.fixture()
def h100() -> GpuSpec:
    from hardware_catalog import get_gpu

    return get_gpu("h100-sxm-80gb")


@pytest.fixture()
def llama8b() -> ModelSpec:
    return ModelSpec(name="llama3-8b", layers=32, hidden=4096, ffn_hidden=14336, heads=32,
                     kv_heads=8, vocab=128256)


@pytest.fixture()
def cluster64(h100: GpuSpec) -> ClusterSpec:
    return ClusterSpec(gpu=h100, num_gpus=64, gpus_per_node=8)


@pytest.fixture()
def train8k() -> Training:
    return Training(seq_len=8192, global_batch=512)


# Imported inside the fixtures below: the search and the CLI load only for the tests that ask.

@pytest.fixture(scope="session")
def plans(tmp_path_factory: pytest.TempPathFactory) -> dict[str, PlanFile]:
    """The golden plans and every shipped study's top plans, searched once a session for every
    launcher round-trip test."""
    from export_plans import golden_plans, study_top_plans

    return {**golden_plans(), **study_top_plans(tmp_path_factory.mktemp("studies"))}


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished tiny study's result folder (copied by tests that change it)."""
    from clirunner import TINY, cli

    folder = tmp_path_factory.mktemp("finished")
    study = folder / "tiny.yaml"
    study.write_text(TINY)
    code, _, err = cli("run", str(study), "-o", str(folder / "out"), "-q")
    assert code == 0, err
    return folder / "out"
