"""Physical monotonicity of the estimator, checked by hypothesis over catalog models and devices."""

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from speedlimit.catalog import catalog_model, hardware_names, model_names
from speedlimit.estimator import estimate
from speedlimit.hardware import custom_hardware

models = st.sampled_from(model_names())
devices = st.sampled_from(hardware_names())
bits = st.sampled_from([32, 16, 8, 4.5, 4])
batches = st.integers(min_value=1, max_value=4096)
prompts = st.integers(min_value=0, max_value=32_768)
outputs = st.integers(min_value=1, max_value=4096)
ideal = st.booleans()
REL = 1e-9


@settings(max_examples=150, deadline=None)
@given(models, devices, bits, bits, batches, prompts, outputs, ideal)
def test_more_bits_never_faster(model, device, bits_a, bits_b, batch, prompt, output, ideal):
    """Where both formats' matmuls run at one rate. llama.cpp's measured CPU kernels (engines.toml kernel_rates) are
    the exception by design: a wider type can run a faster kernel (bf16's GEMM 33 MAC/cycle against q8_0's 17.9 on Zen
    4), so a compute-bound CPU step is not ordered by bits; tests/estimator/test_cpu_kernels.py checks those."""
    low, high = sorted((bits_a, bits_b))
    fast = estimate(model, device, weights=low, batch=batch, prompt=prompt, output=output, ideal=ideal)
    slow = estimate(model, device, weights=high, batch=batch, prompt=prompt, output=output, ideal=ideal)
    assume(fast.cpu_kernels is None and slow.cpu_kernels is None)
    assert slow.decode_tok_s <= fast.decode_tok_s * (1 + REL)


@settings(max_examples=150, deadline=None)
@given(models, st.floats(1e10, 1e13), st.floats(1.0, 10.0), st.floats(1e12, 1e15), batches, prompts, ideal)
def test_more_bandwidth_never_slower(model, bandwidth, factor, flops, batch, prompt, ideal):
    slow = estimate(model, custom_hardware(bandwidth, flops), batch=batch, prompt=prompt, ideal=ideal)
    fast = estimate(model, custom_hardware(bandwidth * factor, flops), batch=batch, prompt=prompt, ideal=ideal)
    assert fast.decode_tok_s >= slow.decode_tok_s * (1 - REL)
    assert fast.ttft_s <= slow.ttft_s * (1 + REL)


@settings(max_examples=100, deadline=None)
@given(models, devices, batches, batches, prompts, outputs, ideal)
def test_batch_raises_throughput_until_memory_runs_out_and_lowers_per_user_speed(model, device, b1, b2, prompt, output, ideal):
    small_batch, big_batch = sorted((b1, b2))
    small = estimate(model, device, batch=small_batch, prompt=prompt, output=output, ideal=ideal)
    big = estimate(model, device, batch=big_batch, prompt=prompt, output=output, ideal=ideal)
    assert big.decode_tok_s <= small.decode_tok_s * (1 + REL)
    if big.fits:
        assert big.throughput_tok_s >= small.throughput_tok_s * (1 - REL)


@settings(max_examples=100, deadline=None)
@given(models, devices, batches, prompts, prompts, ideal)
def test_ttft_non_decreasing_in_prompt(model, device, batch, p1, p2, ideal):
    short, long = sorted((p1, p2))
    assert estimate(model, device, batch=batch, prompt=long, ideal=ideal).ttft_s >= estimate(
        model, device, batch=batch, prompt=short, ideal=ideal
    ).ttft_s * (1 - REL)


def test_catalog_models_all_estimate():
    for name in model_names():
        result = estimate(name, "h200")
        shipped = catalog_model(name).shipped_weights  # a quantized checkpoint is priced as it ships, else bf16
        bf16_bytes = catalog_model(name).total_params * 2
        assert result.decode_tok_s > 0
        if shipped:
            assert result.weights == shipped and result.weights_bytes < bf16_bytes
        else:
            assert result.weights_bytes == bf16_bytes
