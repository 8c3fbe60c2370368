"""The hardware catalog's memory capacities: the driver's readout where one is cited (what engines' memory
fractions multiply), else the vendor's nominal figure."""

from __future__ import annotations

import math
import re

import pytest

from speedlimit.catalog import catalog_hardware, hardware_entries
from speedlimit.estimator import core
from speedlimit.simulator.api import engine_config, resolve

MIB = 1024 * 1024
READOUTS = [key for key, entry in hardware_entries().items() if "memory_source" in entry]


def test_the_cited_readouts_cover_the_common_gpus() -> None:
    assert {"h100-sxm", "a100-sxm-80gb", "l40s", "l4", "rtx-4090", "rtx-3090"} <= set(READOUTS)


@pytest.mark.parametrize("key", READOUTS)
def test_a_cited_readout_is_a_url_and_whole_bytes(key: str) -> None:
    entry = hardware_entries()[key]
    assert entry["memory_source"].startswith("https://")
    memory = catalog_hardware(key).memory_bytes
    assert memory == int(memory)
    assert entry["memory_bytes"] == int(entry["memory_bytes"])  # written as bytes, not rounded to a GB figure
    # a readout is within 10% of the nominal figure the name states in GB, when it states one
    nominal = re.search(r"(\d+)\s?GB", entry["name"])
    if nominal:
        assert 0.95 * float(nominal.group(1)) * 1e9 <= memory <= 1.10 * float(nominal.group(1)) * 1e9

def test_h100_is_the_81559_mib_nvidia_smi_reports() -> None:
    assert catalog_hardware("h100-sxm").memory_bytes == 81559 * MIB


def test_the_kv_cache_gets_the_engines_fraction_of_the_reported_memory() -> None:
    step = resolve("llama-3.3-70b", "h100-sxm", tp=2, weights="fp8", engine="tensorrt-llm")
    free = 2 * 81559 * MIB * core.USABLE_MEMORY_FRACTION - step.cost.total_weight_bytes
    per_token = float(core.kv_bytes_per_sequence(step.cost, 1.0))
    assert engine_config(step=step).kv_capacity_tokens == math.floor(free / per_token)
