from __future__ import annotations

import pytest

from costmodel import ClusterSpec, GpuSpec, ModelSpec, Training


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
