"""Number formats: GGUF block sizes from the gguf package, file-type mixes, plain formats, errors."""

import pytest

from speedlimit.errors import SpeedlimitError
from speedlimit.precision import parse_precision


@pytest.mark.parametrize(
    ("name", "bits"),
    [("q4_0", 4.5), ("q8_0", 8.5), ("q4_k", 4.5), ("q6_k", 6.5625), ("q4_1", 5.0), ("iq4_xs", 4.25), ("mxfp4", 4.25),
     ("bf16", 16), ("fp16", 16), ("fp8", 8), ("int8", 8), ("int4", 4), ("nf4", 4.5), ("fp32", 32), ("16", 16), (4, 4),
     ("8bit", 8), ("Q4_0", 4.5)],
)  # fmt: skip
def test_bits(name, bits):
    assert parse_precision(name).bits == pytest.approx(bits)


def test_file_type_mix_uses_llama_quantize_sizes():
    # Q4_K_M: 4.58 GiB for Llama-3-8B's 8.03e9 parameters
    assert parse_precision("q4_k_m").bits == pytest.approx(4.58 * 2**30 * 8 / 8.03e9)
    assert parse_precision("q4_k_m").bits > parse_precision("q4_k").bits


@pytest.mark.parametrize("bad", ["q9_9", "fp7", "-4", "0", "nan", "inf", "100", ""])
def test_unknown_or_absurd_is_an_error(bad):
    with pytest.raises(SpeedlimitError):
        parse_precision(bad)
