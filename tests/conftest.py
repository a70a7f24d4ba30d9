from __future__ import annotations

import shutil
import signal
import threading
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from costmodel import ClusterSpec, GpuSpec, ModelSpec, Training

if TYPE_CHECKING:
    from search.inputs.planfile import PlanFile

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("costmodel", "search", "hardware_catalog", "tcf_search")  # pyproject's packages


def pytest_sessionstart(session: pytest.Session) -> None:
    """A SIGTERM sent to pytest (a time limit around the run, a kill) stops the run after the
    test under way and says so. Left to its default it lands in whatever runs: inside an
    in-process ``tcf_search.cli.main`` it is taken for that command's own (exit 143), so one
    test failed, blamed, and the rest ran on."""
    def stop(signum: int, frame: object) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second one kills, as usual
        session.shouldstop = "pytest got SIGTERM: stopped after the test under way"

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, stop)


@pytest.fixture(scope="session")
def frozen_checkout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the packages (code and catalog data), for tests that compare the trials of
    separate ``tcf-search`` processes: each process run from it (cwd and PYTHONPATH) imports this
    copy, so a checkout that changes under a running suite (a merge, a refit rewriting
    calibration.yaml) cannot make one run disagree with another."""
    root = tmp_path_factory.mktemp("checkout")
    for package in PACKAGES:
        shutil.copytree(ROOT / package, root / package,
                        ignore=shutil.ignore_patterns("__pycache__"))
    return root


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
    from costmodel_helpers import training_for  # the generic profile, as a study builds it

    return training_for(seq_len=8192, global_batch=512)


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
