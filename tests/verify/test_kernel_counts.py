"""speedlimit's kernels-per-decode-step counts match the graphs llama.cpp really runs (benchmarks/kernel_counts.py)."""

import importlib.util
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.engine
pytest.importorskip("llama_cpp")

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "kernel_counts.py"


@pytest.fixture(scope="module")
def kernel_counts():
    spec = importlib.util.spec_from_file_location("kernel_counts", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def counts(kernel_counts, tmp_path_factory):
    """Every family's engine and speedlimit counts, read once (each runs llama.cpp twice)."""
    workdir = tmp_path_factory.mktemp("kernel-counts")
    return {family.label: kernel_counts.count_family(family, workdir) for family in kernel_counts.FAMILIES}


def test_every_family_matches_the_engine_graph(counts):
    for label, count in counts.items():
        assert count.per_layer["MUL_MAT"] >= 7, label  # the graph was really read
        assert sum(count.per_layer.values()) == count.speedlimit_per_layer, (label, dict(count.per_layer))
        assert abs(count.per_step - count.speedlimit_per_step) <= 1, label


def test_moe_graph_grows_with_the_experts_per_token(counts):
    top2, top8 = (sum(counts[label].per_layer.values()) for label in ("qwen3moe (top-2 of 16)", "qwen3moe (top-8 of 16)"))
    assert top8 - top2 == 6
