"""The published-measurements CSV of benchmarks/accuracy is well-formed and score.py can score it."""

from __future__ import annotations

import csv
import dataclasses
import importlib.util
import math
import sys
from pathlib import Path
from urllib.parse import urlparse

import pytest

from speedlimit.catalog import catalog_engine, engine_for_device, resolve_hardware, resolve_model
from speedlimit.estimator import estimate
from speedlimit.precision import WeightFormats, parse_precision, parse_weights

ACCURACY_DIR = Path(__file__).resolve().parents[2] / "benchmarks" / "accuracy"
CSV_PATH = ACCURACY_DIR / "measurements.csv"
COLUMNS = [
    "device", "model", "weights", "engine", "quantity", "fold", "prompt_tokens", "output_tokens", "concurrency", "tp",
    "decode_tok_s", "prefill_tok_s", "throughput_tok_s", "ttft_ms", "tpot_ms", "model_file_bytes", "metric", "source", "notes", "device_share",
    "threads", "engine_args", "requests",
]  # fmt: skip
# The measured figure(s) each quantity must carry; a serving row needs at least one of its three.
FIGURES = {"decode": ("decode_tok_s",), "prefill": ("prefill_tok_s",), "serving": ("throughput_tok_s", "ttft_ms", "tpot_ms")}
XIONGJIEDAI = "github.com/XiongjieDai/GPU-Benchmarks-on-LLM-Inference"
LLAMA_CPP_MXFP4_MOE = "mxfp4_moe"  # LLAMA_FTYPE_MOSTLY_MXFP4_MOE: experts MXFP4, other tensors Q8_0 (llama-quant.cpp)


def _records() -> list[dict[str, str]]:
    with CSV_PATH.open(newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def score_module():
    """benchmarks/accuracy/score.py, imported once (it is a script, not a package module)."""
    if "accuracy_score" not in sys.modules:
        spec = importlib.util.spec_from_file_location("accuracy_score", ACCURACY_DIR / "score.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    return sys.modules["accuracy_score"]


@pytest.fixture(scope="module")
def score():
    return score_module()


def test_csv_has_the_documented_columns_and_enough_rows():
    with CSV_PATH.open(newline="", encoding="utf-8") as handle:
        header = next(csv.reader(handle))
    assert header == COLUMNS
    assert len(_records()) >= 30
    quantities = {record["quantity"] for record in _records()}
    assert quantities <= set(FIGURES) and {"decode", "prefill"} <= quantities


@pytest.mark.parametrize("record", _records(), ids=lambda r: f"{r['device']}-{r['model']}-{r['weights']}-{r['engine']}")
def test_every_row_is_well_formed(record):
    assert resolve_hardware(record["device"]).memory_bandwidth_Bps > 0
    assert resolve_model(record["model"]).total_params > 0
    weights = parse_weights(record["weights"])
    # per-group formats only where the source states them (SOURCES.md, MLX addenda): llama.cpp's "MXFP4 MoE" file
    # type (llama-quant.cpp: experts MXFP4, other tensors Q8_0), or notes that name each group ("MXFP4 experts,
    # 8-bit other weights"); and every row quoting that file type carries them
    assert ("MXFP4 MoE" in record["notes"]) == (record["weights"] == LLAMA_CPP_MXFP4_MOE)
    if isinstance(weights, WeightFormats):
        named = [part.split("=")[0] for part in record["weights"].split(",") if not part.startswith("default=")]
        assert record["weights"] == LLAMA_CPP_MXFP4_MOE or (named and all(group in record["notes"] for group in named))
        assert all(fmt.bits > 0 for fmt in weights.formats)
    else:
        assert weights.bits > 0
    assert record["quantity"] in FIGURES
    given = [name for name in FIGURES[record["quantity"]] if record[name]]
    assert given, f"a {record['quantity']} row needs {' or '.join(FIGURES[record['quantity']])}"
    for name in ("decode_tok_s", "prefill_tok_s", "throughput_tok_s", "ttft_ms", "tpot_ms"):
        if record[name]:
            value = float(record[name])
            assert math.isfinite(value) and value > 0, name
            assert name in FIGURES[record["quantity"]], f"{name} on a {record['quantity']} row"
    # folds are fixed by source (SOURCES.md): fold A is the XiongjieDai repository, everything else fold B
    assert record["fold"] == ("A" if XIONGJIEDAI in record["source"] else "B")
    assert record["metric"]
    concurrency, tp = int(record["concurrency"] or 1), int(record["tp"] or 1)
    assert concurrency >= 1 and tp >= 1
    if record["quantity"] == "serving":
        assert concurrency > 1 and record["concurrency"] and record["tp"] and record["prompt_tokens"]
    else:
        assert concurrency == 1
    if record["quantity"] == "prefill":
        assert int(record["prompt_tokens"]) > 0
    url = urlparse(record["source"])
    assert url.scheme == "https" and url.netloc, record["source"]
    assert record["engine"] and record["notes"]
    if record["prompt_tokens"]:
        assert int(record["prompt_tokens"]) >= 0
    assert int(record["output_tokens"]) >= 1
    if record["model_file_bytes"]:
        bits = 8 * int(record["model_file_bytes"]) / resolve_model(record["model"]).total_params
        assert 2.0 < bits < 17.0  # a real file's bits per parameter is within the range of the formats used
        # and near its weight type's own bits (embeddings and mixes move it by a few percent; the ik_llama.cpp
        # README's Mixtral sizes, at twice their type's bits, were the reason for this check: SOURCES.md erratum)
        if isinstance(weights, WeightFormats):
            # per-group formats put the file's bytes where they are: their total is the file's size
            priced = estimate(record["model"], record["device"], weights=record["weights"]).weights_bytes
            assert priced == pytest.approx(int(record["model_file_bytes"]), rel=0.02)
        else:
            nominal = parse_precision(record["weights"]).bits
            assert 0.75 * nominal < bits < 1.35 * nominal, (bits, nominal)
    assert 0 < float(record["device_share"]) <= 1
    # a CPU run's thread count is a run condition like its lengths: recorded where the source states it, and only
    # on CPU rows (the number the notes quote)
    if record["threads"]:
        assert resolve_hardware(record["device"]).kind == "cpu"
        assert f"threads {int(record['threads'])}" in record["notes"]
    elif resolve_hardware(record["device"]).kind == "cpu":
        assert "threads" not in record["notes"], "a CPU row whose notes state its threads must carry them"
    # a serving run's request count is a run condition too: the --num-prompts its notes quote
    if record["requests"]:
        assert record["quantity"] == "serving" and f"--num-prompts {int(record['requests'])}" in record["notes"]
    elif record["quantity"] == "serving":
        assert "--num-prompts" not in record["notes"], "a serving row whose notes state its requests must carry them"
    # engine settings are a serving row's run conditions, each one printed in its notes (the command line)
    if record["engine_args"]:
        assert record["quantity"] == "serving"
        flags = {"max_seqs": ("--max-num-seqs", "--max-running-requests", "--max_batch_size"),
                 "max_batched_tokens": ("--max-num-batched-tokens", "--chunked-prefill-size", "--max_num_tokens"),
                 "chunked_prefill": ("--enable-chunked-prefill", "--no-enable-chunked-prefill", "enable_chunked_prefill"),
                 "kv": ("--kv-cache-dtype", "kv_cache_config"),
                 "dp_attention": ("--enable-dp-attention",)}
        if "vLLM 0.7." in record["notes"]:  # V0 with MLA: no chunked prefill, the step budget is --max-model-len (SOURCES.md)
            flags["max_batched_tokens"] += ("--max-model-len",)
        for key, value in score_module().parse_engine_args(record["engine_args"]):
            assert any(flag in record["notes"] for flag in flags[key]), (key, record["notes"][:200])
            if not isinstance(value, bool):
                assert str(value) in record["notes"], (key, value)


def test_xiongjiedai_llama2_rows_carry_their_notebook_run_lengths(score):
    """Issue 13: those rows ran -n 1024 --ignore-eos on a 494-token prompt (M1 Max, Aug 2023: 265 / 512), README pinned."""
    rows = [r for r in score.load_rows(CSV_PATH) if "LLaMA 2" in r.notes and XIONGJIEDAI in r.source and r.quantity == "decode"]
    assert len(rows) == 23
    for row in rows:
        assert (row.prompt_tokens, row.output_tokens) == ((265, 512) if row.device == "apple-m1-max" else (494, 1024))
        assert "/blob/eafac9d26ac593f8e7dd353415dddf0c19de84b2/README.md" in row.source


def test_end_to_end_rows_are_kept_out_of_the_decode_median(score):
    rows = score.load_rows(CSV_PATH)
    e2e = [r for r in rows if r.e2e]
    assert e2e and all("llmfit" in r.source for r in e2e)
    assert not set(map(id, e2e)) & set(map(id, score.decode_rows(rows)))


def test_other_quantities_are_scored(score):
    rows = score.load_rows(CSV_PATH)
    prefill = next(r for r in rows if r.quantity == "prefill")
    assert score.predict_prefill_tok_s(prefill) > 0
    assert score.predict_prefill_tok_s(prefill, ideal=True) > score.predict_prefill_tok_s(prefill)
    records = score.score_other_quantities(rows, with_llm_analysis=False)
    assert {"prefill", "decode, E2E-derived"} <= {r["what"] for r in records}
    for record in records:
        assert record["measured"] > 0 and record["fold"] in ("A", "B")
    serving = [r for r in rows if r.quantity == "serving"]
    if serving:
        predicted = score.predict_serving(serving[0])
        assert predicted["throughput_tok_s"] > 0 and predicted["tpot_ms"] > 0


def test_scoring_runs_on_a_few_rows(score):
    rows = score.load_rows(CSV_PATH)[:3] + [r for r in score.load_rows(CSV_PATH) if r.device_share != 1.0][:1]
    for row in rows:
        ideal = score.predict_tok_s(row, ideal=True)
        default = score.predict_tok_s(row)
        assert ideal > default > 0  # efficiencies < 1 and an overhead only slow the estimate down
        assert score.ape(default, row.decode_tok_s) >= 0
    gcd = rows[-1]
    assert score.row_hardware(gcd).memory_bandwidth_Bps == pytest.approx(0.5 * resolve_hardware(gcd.device).memory_bandwidth_Bps)


def test_ape_and_summary(score):
    assert score.ape(110.0, 100.0) == pytest.approx(10.0)
    assert score.ape(90.0, 100.0) == pytest.approx(10.0)
    assert score.summary([1.0, 2.0, 9.0]) == (2.0, 4.0)


def test_fit_recovers_a_known_kernel_cost(score):
    import numpy as np

    t_peak = np.array([0.002, 0.005, 0.02, 0.05])
    kernels = np.array([700.0, 700.0, 1800.0, 1800.0])
    bw = np.full(4, 0.8)
    inputs = score.FitInputs(
        t_peak_s=t_peak, kernels=kernels, bw_efficiency=bw, measured_tok_s=1.0 / (t_peak / bw + 4.2e-6 * kernels),
        kinds=np.array(["apple"] * 4), folds=np.array(["A", "A", "B", "B"]),
    )  # fmt: skip
    assert score.fit_kernel_cost_s(inputs, np.ones(4, bool)) == pytest.approx(4.2e-6)
    assert score.fold_fits(inputs) == {"A": {"apple": pytest.approx(4.2e-6)}, "B": {"apple": pytest.approx(4.2e-6)}}
    assert inputs.predict_tok_s({"apple": 4.2e-6}) == pytest.approx(inputs.measured_tok_s)


def test_gemm_fit_takes_the_nvidia_llama_cpp_prefill_rows_and_recovers_a_known_efficiency(score):
    import dataclasses

    rows = score.load_rows(CSV_PATH)
    chosen = score.gemm_fit_rows(rows)
    assert chosen and all(r.quantity == "prefill" and resolve_hardware(r.device).vendor == "nvidia" for r in chosen)
    assert not [r for r in chosen if resolve_hardware(r.device).kind == "apple"]
    few = [r for r in chosen if r.fold == "A"][:4]
    truth = score.predict_prefill_at_gemm(few, 0.3)
    synthetic = [dataclasses.replace(r, prefill_tok_s=float(t)) for r, t in zip(few, truth)]
    assert score.fit_gemm_efficiency(synthetic) == pytest.approx(0.3)
    assert (score.predict_prefill_at_gemm(few, 0.15) < truth).all()  # a lower GEMM rate prices a slower prefill


def test_metal_gemm_fit_takes_the_apple_llama_cpp_prefill_rows_and_recovers_a_known_efficiency(score):
    import dataclasses

    chosen = score.gemm_fit_rows(score.load_rows(CSV_PATH), "llama-cpp-metal")
    assert chosen and {resolve_hardware(r.device).kind for r in chosen} == {"apple"}
    assert {r.fold for r in chosen} == {"A", "B"}
    few = [r for r in chosen if r.fold == "A"][:4]
    truth = score.predict_prefill_at_gemm(few, 0.45, "llama-cpp-metal")
    synthetic = [dataclasses.replace(r, prefill_tok_s=float(t)) for r, t in zip(few, truth)]
    assert score.fit_gemm_efficiency(synthetic, "llama-cpp-metal") == pytest.approx(0.45)
    assert (score.predict_prefill_at_gemm(few, 0.3, "llama-cpp-metal") < truth).all()
    assert score.catalog_engine("llama-cpp-metal").gemm_efficiency.fitted == "A"


def test_shipped_fitted_kernel_cost_is_the_fold_a_fit(score, capsys):
    """The catalog's fitted per-kernel costs must be what score.py fits on fold A (it exits 1 otherwise)."""
    assert score.main(["--quiet"]) == 0
    out = capsys.readouterr().out
    assert "held-out fold B" in out and "MISMATCH" not in out
    for profile in score.GEMM_FIT_PROFILES:
        assert f"shipped {profile}: {score.shipped_gemm_efficiency(profile):.3f} = the fold-A fit" in out
    for quantity in ("decode:", "prefill:", "serving throughput:", "TPOT under load:", "TTFT under load:"):
        assert quantity in out


def test_engine_args_parse_to_simulate_settings_and_reject_anything_else(score):
    assert score.parse_engine_args("max_seqs=1024;max_batched_tokens=32768") == (("max_seqs", 1024), ("max_batched_tokens", 32768))
    assert score.parse_engine_args(" chunked_prefill=false ; kv=fp8 ") == (("chunked_prefill", False), ("kv", "fp8"))
    assert score.parse_engine_args("") == ()
    for bad in ("gpu_memory_utilization=0.9", "max_seqs", "chunked_prefill=yes", "max_seqs=many"):
        with pytest.raises(ValueError):
            score.parse_engine_args(bad)
    # the loaded rows carry the settings their command lines state (the notes quote them: test_every_row_is_well_formed)
    rows = {row.index: row for row in score.load_rows()}
    recipes = [row for row in rows.values() if "vllm-project/recipes" in row.source]
    assert recipes and all(dict(row.engine_args) == {"max_seqs": 1024, "max_batched_tokens": 32768} for row in recipes)
    trtllm = [row for row in rows.values() if "dstackai" in row.source and row.engine == "tensorrt-llm"]
    assert trtllm and all(dict(row.engine_args) == {"max_seqs": 512, "max_batched_tokens": 16384} for row in trtllm)
    # every row whose server ran SGLang's --enable-dp-attention says so, and no other (SOURCES.md, fold D amendment 2)
    dp_rows = {row.index for row in rows.values() if dict(row.engine_args).get("dp_attention")}
    assert dp_rows and dp_rows == {row.index for row in rows.values() if "--enable-dp-attention" in row.notes}
    assert {(rows[i].device, rows[i].engine) for i in dp_rows} == {("h200", "sglang")}


def test_a_dp_attention_layout_is_attention_data_parallel_and_experts_over_every_gpu(score):
    assert score.layout(8, (("dp_attention", True),)) == {"tp": 1, "dp": 8, "ep": 8}
    assert score.layout(8, (("dp_attention", False), ("max_seqs", 4))) == {"tp": 8}
    assert score.layout(1, (("dp_attention", True),)) == {"tp": 1}  # one GPU: nothing to spread
    assert score.simulate_args((("dp_attention", True), ("max_seqs", 4))) == {"max_seqs": 4}
    # the fold-D lines whose server ran it are priced in it: all three of SGLang PR #2643's (the batch-8 and
    # batch-32 lines' notes say "as the batch-1 line", whose server command has the flag)
    lines = score.load_engine_steps()
    assert {line.source for line in lines if dict(line.engine_args).get("dp_attention")} == {
        "https://github.com/sgl-project/sglang/pull/2643"}
    assert sum(1 for line in lines if dict(line.engine_args).get("dp_attention")) == 3


# --------------------------------------------------------------------------------------------
# fold C: llama.cpp's CPU kernel rates (cpu_kernels.csv, benchmarks/cpu_kernel_rates.py)

# each measured llama.cpp version's file and the commit its rows must name (SOURCES.md, fold C and its amendment)
KERNEL_FILES = {"cpu_kernels.csv": "0c1e570", "cpu_kernels_b3441.csv": "081fe43", "cpu_kernels_portable.csv": "0c1e570",
                # amendment 7: MXFP4 with a q8_0 anchor, the same llama.cpp, another machine
                "cpu_kernels_mxfp4.csv": "0c1e570", "cpu_kernels_mxfp4_portable.csv": "0c1e570",
                # amendment 8: the portable build on an Intel core
                "cpu_kernels_portable_intel.csv": "0c1e570"}


def _kernel_records(name: str) -> list[dict[str, str]]:
    with (ACCURACY_DIR / name).open(newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


@pytest.mark.parametrize("name", KERNEL_FILES)
def test_each_kernel_rate_is_its_runs_arithmetic(name: str) -> None:
    """macs_per_cycle_per_thread = tok/s x MACs per token / (threads x clock), and a prompt counts the head once."""
    records = _kernel_records(name)
    assert {(r["model"], r["test"]) for r in records} == {("in-cache-narrow", "tg512"), ("in-cache-wide", "tg512"),
                                                          ("8b-matrices", "pp512"), ("8b-matrices", "tg32")}
    for model in ("in-cache-narrow", "in-cache-wide", "8b-matrices"):
        assert len({r["macs_per_token"] for r in records if r["model"] == model and r["test"].startswith("tg")}) == 1
    for r in records:
        rate = float(r["tok_s"]) * int(r["macs_per_token"]) / (int(r["threads"]) * float(r["clock_hz"]))
        assert float(r["macs_per_cycle_per_thread"]) == pytest.approx(rate, rel=1e-3), r
        assert 1e9 < float(r["clock_hz"]) < 7e9 and float(r["tok_s"]) >= float(r["tok_s_mean"]) > 0  # the fastest repetition


@pytest.mark.parametrize("name", KERNEL_FILES)
def test_every_type_was_run_at_one_thread_and_at_all_threads_by_the_files_llama_cpp(name: str) -> None:
    records = _kernel_records(name)
    assert {r["llama_cpp"].split()[0] for r in records} == {KERNEL_FILES[name]}
    for kind in {r["type"] for r in records}:
        runs = {(r["model"], r["test"], int(r["threads"])) for r in records if r["type"] == kind}
        cores = int(next(r["cores"] for r in records if r["type"] == kind))
        assert {("in-cache-narrow", "tg512", 1), ("in-cache-wide", "tg512", 1), ("8b-matrices", "pp512", cores)} <= runs, kind


def test_each_kernel_file_ships_as_its_profile(score) -> None:
    assert {path.name for paths in score.KERNEL_FILES.values() for path in paths} == set(KERNEL_FILES)
    for profile, paths in score.KERNEL_FILES.items():
        fitted = score.kernel_rates_from(paths[0])
        assert fitted["q4_0"] == list(score.catalog_engine(profile).kernel_rate("q4_0")), profile


def test_a_later_kernel_file_adds_types_and_never_replaces_the_main_files(score) -> None:
    """Amendment 7: MXFP4 comes from its own file; that file's q8_0 anchor (another machine) prices nothing."""
    for profile in ("llama-cpp-cpu", "llama-cpp-cpu-avx2"):
        main, later = score.KERNEL_FILES[profile]
        engine = score.catalog_engine(profile)
        assert list(engine.kernel_rate("mxfp4")) == score.kernel_rates_from(later)["mxfp4"], profile
        assert list(engine.kernel_rate("q8_0")) == score.kernel_rates_from(main)["q8_0"], profile
        assert score.profile_kernel_rates((main, later))["q8_0"] == score.kernel_rates_from(main)["q8_0"]


def test_a_cpu_row_of_a_per_group_file_type_is_priced_from_its_groups_formats(score) -> None:
    """A single-type CPU row travels as a .gguf of its file's bytes and type; an MXFP4_MOE row keeps its groups'
    formats (experts 4.25 bits, the rest 8.5), as a GPU row does, not the file's bytes spread evenly."""
    rows = [row for row in score.load_rows() if row.device == "amd-ryzen-9-7950x" and row.model_file_bytes]
    grouped = [row for row in rows if row.weights == "mxfp4_moe"]
    assert len(grouped) == 2
    for row in grouped:
        assert (score.row_model(row), score.row_weights(row)) == ("gpt-oss-20b", "mxfp4_moe")
    single = next(row for row in rows if row.weights == "q4_k_m")
    arch = score.row_model(single)
    assert score.row_weights(single) is None and arch.weight_bytes.file_type == "q4_k_m"
    # the even spread put the attention every token reads at the file's mean bits: fewer bytes a token than the groups'
    row = grouped[0]
    per_group = estimate(row.model, "amd-ryzen-9-7950x", weights="mxfp4_moe", threads=16)
    mean_bits = 8.0 * row.model_file_bytes / resolve_model(row.model).total_params
    assert per_group.bytes_per_token > estimate(row.model, "amd-ryzen-9-7950x", weights=mean_bits, threads=16).bytes_per_token


def test_rows_naming_build_3441_are_priced_with_its_profile_in_profiles_mode(score) -> None:
    rows = score.load_rows()
    cpu = [row for row in rows if row.device == "amd-ryzen-9-7950x"]
    named = [row for row in cpu if "(3441)" in row.notes]
    assert named and {score.row_engine(row) for row in named} == {"llama-cpp-cpu-b3441"}
    unnamed = [row for row in cpu if "build not stated" in row.notes]
    assert unnamed and {score.row_engine(row) for row in unnamed} == {"llama-cpp"}
    # a GPU row of another build keeps its engine's current profile
    assert {score.row_engine(row) for row in rows if row.device == "rtx-5090" and row.engine == "llama.cpp"} == {"llama-cpp"}


def test_llama_cpp_cuda_rows_of_late_2023_to_mid_2024_are_priced_as_those_builds(score) -> None:
    """The rows a llama.cpp CUDA run dates between November 2023 and June 2024 convert quantized weights to fp16 before
    their prefill GEMMs (SOURCES.md): every fold-A NVIDIA row (XiongjieDai), PR #4766's held-out rows and issue #6763's
    April-2024 H100 PCIe row (rule C5), no other."""
    rows = [row for row in score.load_rows() if row.engine == "llama.cpp" and score.row_hardware(row).vendor == "nvidia"]
    early = {row.index for row in rows if score.row_engine(row) == "llama-cpp-cuda-2024"}
    dated = ("ggml-org/llama.cpp/pull/4766", "ggml-org/llama.cpp/issues/6763")
    assert early == {row.index for row in rows if row.fold == "A" or any(source in row.source for source in dated)}
    assert {row.fold for row in rows if row.index in early} == {"A", "B"}
    assert {score.row_engine(row) for row in rows if row.index not in early} == {"llama-cpp"}


def test_shipped_kernel_rates_are_the_fold_c_fit(score, capsys) -> None:
    assert score.print_cpu_kernel_fit() == 0, capsys.readouterr().out


def test_the_graph_overhead_fit_differences_the_layer_counts_and_prices_the_macs(score, tmp_path) -> None:
    """Per node: the 32 extra layers' time less their MACs at the in-cache f16 rate, over 32 x 22 nodes; per step:
    the 1-layer model's time less its 28 nodes and its MACs (SOURCES.md, "Fold C amendment 5")."""
    kernels = tmp_path / "k.csv"
    kernels.write_text(
        "type,model,test,threads,tok_s,macs_per_token,clock_hz,macs_per_cycle_per_thread\n"
        "f16,in-cache-narrow,tg512,1,1000,1000000,1e9,1.0\n"
        "f16,in-cache-wide,tg512,1,333.3333333,5000000,1e9,1.67\n"  # 2.0 MACs per cycle (see below)
        "f16,8b-matrices,pp512,2,100,1000,1e9,12.3\n")
    graph = tmp_path / "g.csv"
    # 1 thread: 1 layer 200 us a token with 2e4 MACs, 33 layers 200 + 32 x 100 us with 2e4 + 32 x 1e4 MACs (1e4 MACs
    # at 2 MACs/cycle at 1 GHz = 5 us), so a layer's 22 nodes cost 95 us; 2 threads: 1 layer 100 us, each layer's
    # MACs 2.5 us, so 97.5 us for 22 nodes, which leave the 1-layer model nothing for its step
    graph.write_text(
        "model,layers,test,threads,tok_s,macs_per_token,clock_hz\n"
        "tiny-1-layer,1,tg256,1,5000,20000,1e9\n"
        "tiny-33-layers,33,tg256,1,294.1176471,340000,1e9\n"
        "tiny-1-layer,1,tg256,2,10000,20000,1e9\n"
        "tiny-33-layers,33,tg256,2,303.0303030,340000,1e9\n")
    fitted = score.graph_overhead_from(graph, kernels)
    node_1, node_2 = 95e-6 / 22, 97.5e-6 / 22
    assert fitted[1] == (pytest.approx(node_1, rel=2e-3), pytest.approx(200e-6 - 28 * node_1 - 10e-6, rel=5e-3))
    assert fitted[2] == (pytest.approx(node_2, rel=2e-3), 0.0)  # a negative remainder is no cost


def test_each_graph_overhead_file_ships_as_its_profile(score) -> None:
    for profile, (path, kernels_path) in score.GRAPH_FILES.items():
        measured = score.graph_overhead_from(path, kernels_path)
        engine = score.catalog_engine(profile)
        assert (engine.kernel_overhead_s.value, engine.step_overhead_s.value) == measured[max(measured)], profile
        assert engine.kernel_overhead_s.fitted == engine.step_overhead_s.fitted == "C"
        assert all(0 < node < 1e-5 and 0 <= step < 1e-3 for node, step in measured.values())


def test_the_attention_fit_differences_the_depths_at_all_threads_and_averages_the_head_widths(score, tmp_path) -> None:
    """Per model at the most threads: the extra seconds between the two depths over the extra pairs' MACs (pairs x
    layers x heads x 2 x head width), per cycle per thread; the mean of the models (SOURCES.md, "Fold C amendment
    9"). The 1-thread rows are on record and in no price."""
    path = tmp_path / "a.csv"
    # 64 wide: decode 3,072 more cached tokens x 4 x 16 x 128 = 25.17 M MACs in 10 ms more at 1 GHz x 2 threads:
    # 1.258 per cycle; 128 wide: 50.33 M MACs in 25.17 ms: 1.0; prefill 512 x 2,048 more pairs: 8.59 G MACs (64 wide)
    # in 0.8592 s more: 5.0, and 17.18 G (128 wide) in 1.432 s more: 6.0
    path.write_text(
        "model,phase,head_dim,heads,kv_heads,layers,depth,tokens,threads,tok_s,clock_hz\n"
        "a64,decode,64,16,4,4,1024,32,2,100,1e9\n"
        "a64,decode,64,16,4,4,4096,32,2,50,1e9\n"
        "a64,decode,64,16,4,4,1024,32,1,1,1e9\n"
        "a64,decode,64,16,4,4,4096,32,1,0.1,1e9\n"
        "a64,prefill,64,16,4,4,0,512,2,1000,1e9\n"
        "a64,prefill,64,16,4,4,2048,512,2,377.3584906,1e9\n"
        "a128,decode,128,16,4,4,1024,32,2,100,1e9\n"
        "a128,decode,128,16,4,4,4096,32,2,28.43602,1e9\n"
        "a128,prefill,128,16,4,4,0,512,2,1000,1e9\n"
        "a128,prefill,128,16,4,4,2048,512,2,263.5 ,1e9\n".replace(" ,", ","))
    decode_64, decode_128 = 3072 * 4 * 16 * 128 / 0.01 / 2e9, 3072 * 4 * 16 * 256 / (1 / 28.43602 - 0.01) / 2e9
    prefill_64 = 512 * 2048 * 4 * 16 * 128 / (512 / 377.3584906 - 0.512) / 2e9
    prefill_128 = 512 * 2048 * 4 * 16 * 256 / (512 / 263.5 - 0.512) / 2e9
    assert score.attention_rates_from(path) == [float(f"{(decode_64 + decode_128) / 2:.3g}"),
                                                float(f"{(prefill_64 + prefill_128) / 2:.3g}")]
    assert score.attention_rates_from(path)[0] == pytest.approx(1.13, abs=0.01)


def test_each_attention_file_ships_as_its_profile_and_build_3441_has_none(score) -> None:
    for profile, path in score.ATTENTION_FILES.items():
        engine = score.catalog_engine(profile)
        assert list(engine.attention_rate()) == score.attention_rates_from(path) and engine.attention_rates.fitted == "C"
    assert score.catalog_engine("llama-cpp-cpu-intel").attention_rate() == score.catalog_engine("llama-cpp-cpu-avx2").attention_rate()
    assert score.catalog_engine("llama-cpp-cpu-b3441").attention_rate() is None  # measured without flash attention


def test_the_kernel_fit_differences_the_in_cache_runs_and_takes_all_threads_for_prefill(score, tmp_path) -> None:
    path = tmp_path / "k.csv"
    path.write_text(
        "type,model,test,threads,tok_s,macs_per_token,clock_hz,macs_per_cycle_per_thread\n"
        # narrow: 1 ms per token for 1 M MACs; wide: 3 ms for 5 M -> 4 M MACs in 2 ms = 2e9 MAC/s at 1e9 Hz = 2.0
        "q4_0,in-cache-narrow,tg512,1,1000,1000000,1e9,1.0\n"
        "q4_0,in-cache-wide,tg512,1,333.3333333,5000000,1e9,1.67\n"
        "q4_0,in-cache-wide,tg512,2,600,5000000,1e9,1.5\n"
        "q4_0,8b-matrices,pp512,2,100,1000,1e9,12.3456\n"
        "q4_0,8b-matrices,pp512,1,100,1000,1e9,99\n")
    assert score.kernel_rates_from(path) == {"q4_0": [2.0, 12.3]}


def test_a_decode_rate_is_never_below_the_same_kernel_from_dram(score, tmp_path) -> None:
    # fold C amendment 2: the 8B matrices' one-thread decode does the kernel's work plus memory stalls, so its rate
    # bounds the kernel's from below; a difference of the in-cache timings under it gives way to it
    path = tmp_path / "k.csv"
    rows = ("type,model,test,threads,tok_s,macs_per_token,clock_hz,macs_per_cycle_per_thread\n"
            "q8_0,in-cache-narrow,tg512,1,1000,1000000,1e9,1.0\n"
            "q8_0,in-cache-wide,tg512,1,333.3333333,5000000,1e9,1.67\n"   # differenced: 2.0
            "q8_0,8b-matrices,pp512,2,100,1000,1e9,12.3456\n"
            "q8_0,8b-matrices,tg32,1,5,600000000,1e9,{dram}\n"
            "q8_0,8b-matrices,tg32,2,5,600000000,1e9,9.0\n")        # two threads: not the bound
    path.write_text(rows.format(dram=3.0))
    assert score.kernel_rates_from(path) == {"q8_0": [3.0, 12.3]}
    path.write_text(rows.format(dram=1.5))
    assert score.kernel_rates_from(path) == {"q8_0": [2.0, 12.3]}


# fold C amendment 3: llama.cpp's prefill at 2-16 threads (cpu_threads*.csv, benchmarks/cpu_thread_scaling.py)

THREAD_FILES = {"cpu_threads.csv": "0c1e570", "cpu_threads_b3441.csv": "081fe43"}


@pytest.mark.parametrize("name", THREAD_FILES)
def test_each_thread_sweep_is_its_runs_arithmetic_on_its_builds_llama_cpp(name: str) -> None:
    records = _kernel_records(name)
    assert {r["llama_cpp"].split()[0] for r in records} == {THREAD_FILES[name]}
    assert {(r["model"], r["test"]) for r in records} == {("8b-matrices", "pp512")}
    for kind in {r["type"] for r in records}:
        counts = {int(r["threads"]) for r in records if r["type"] == kind}
        assert {2, 4, 8, 16} <= counts, kind  # SOURCES.md: 2, 4, 8 and 16 threads for every type
    for r in records:
        rate = float(r["tok_s"]) * int(r["macs_per_token"]) / (int(r["threads"]) * float(r["clock_hz"]))
        assert float(r["macs_per_cycle_per_thread"]) == pytest.approx(rate, rel=1e-3), r
        assert 1e9 < float(r["clock_hz"]) < 7e9 and int(r["cores"]) == 16, r  # the register-add clock, 16 cores


def test_each_thread_sweep_ships_as_its_profile(score) -> None:
    assert {path.name for path in score.THREAD_FILES.values()} == set(THREAD_FILES)
    for profile, path in score.THREAD_FILES.items():
        assert score.thread_scaling_from(path) == score.catalog_engine(profile).prefill_thread_scaling.value, profile


def test_the_thread_fit_is_the_median_over_types_of_each_counts_rate_over_two_threads(score, tmp_path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("type,threads,macs_per_cycle_per_thread\n"
                    "q4_0,1,20\nq4_0,2,10\nq4_0,16,7\n"
                    "q8_0,2,10\nq8_0,16,5\n"
                    "f16,2,20\nf16,16,18\n")
    assert score.thread_scaling_from(path) == [[2, 1.0], [16, 0.7]]  # median of 0.7, 0.5, 0.9; 1 thread not taken


# --------------------------------------------------------------------------------------------
# fold D: per-version step costs of serving engines (engine_steps.csv)


def test_fold_d_lines_come_from_sources_no_fold_b_row_uses(score) -> None:
    lines = score.load_engine_steps()
    held_out = {row.source for row in score.load_rows() if row.fold == "B"}
    assert lines and not {line.source for line in lines} & held_out
    for line in lines:
        assert line.source.startswith("https://") and line.batch >= 1 and line.value > 0
        assert line.metric in score.ENGINE_STEP_METRICS


def test_a_fold_d_figure_is_read_as_the_time_it_measures(score) -> None:
    line = score.load_engine_steps()[0]
    as_step = dataclasses.replace(line, metric="decode_tok_s", batch=8, value=200.0)
    as_offline = dataclasses.replace(line, metric="offline_output_tok_s", batch=100, output_tokens=1000, value=500.0)
    as_latency = dataclasses.replace(line, metric="batch_latency_s", value=7.5)
    assert as_step.measured_s == pytest.approx(0.04)  # 8 tokens per step at 200 tok/s
    assert as_offline.measured_s == pytest.approx(200.0)  # 100 x 1,000 tokens at 500 tok/s
    assert as_latency.measured_s == 7.5


def test_an_unknown_fold_d_metric_is_refused(score, tmp_path) -> None:
    path = tmp_path / "steps.csv"
    path.write_text("profile,engine_version,device,model,weights,tp,batch,prompt_tokens,output_tokens,metric,value,source,notes\n"
                    "vllm-0.7,x,h200,deepseek-r1,fp8,8,1,32,128,tokens_per_joule,3,https://example.org,\n", encoding="utf-8")
    with pytest.raises(ValueError, match="unknown metric"):
        score.load_engine_steps(path)


def test_shipped_engine_step_costs_are_the_fold_d_fit(score, capsys) -> None:
    assert score.print_engine_step_fit() == 0, capsys.readouterr().out


def test_a_slower_kernel_floor_predicts_slower_steps(score) -> None:
    """The fit's levers move the prediction the way they should (so the grid search can find a minimum)."""
    line = score.load_engine_steps()[0]
    assert score.predict_line_s(line, 50e-6) > score.predict_line_s(line, 10e-6) > score.predict_line_s(line, 0.0)
    batched = next(line for line in score.load_engine_steps() if line.batch > 1)
    assert score.predict_line_s(batched, 0.0, 1e-3) > score.predict_line_s(batched, 0.0, 1e-4) > score.predict_line_s(batched, 0.0, 0.0)


@pytest.mark.parametrize("metric", ["decode_tok_s", "offline_output_tok_s", "batch_latency_s"])
def test_a_fold_d_line_is_linear_in_both_step_costs(score, metric) -> None:
    """What lets the fit evaluate its whole grid from three estimates per line: the two costs are additive terms."""
    line = next(line for line in score.load_engine_steps() if line.metric == metric)
    base, per_kernel, per_sequence = score.step_cost_terms(line)
    assert per_kernel > 0 and per_sequence > 0
    assert score.predict_line_s(line, 37e-6, 410e-6) == pytest.approx(base + 37e-6 * per_kernel + 410e-6 * per_sequence, rel=1e-9)


def test_lines_of_one_batch_size_fit_the_per_kernel_cost_and_hold_the_parents_per_sequence_cost(score) -> None:
    """A per-kernel and a per-sequence cost add the same multiple to every step of lines at one batch size, so such a
    profile fits only the first and keeps its parent's second (fold D amendment 4); lines at several batch sizes fit
    both."""
    lines = score.load_engine_steps()
    rocm = [line for line in lines if line.profile == "sglang-0.4-rocm"]
    assert len(rocm) == 2 and {line.batch for line in rocm} == {4}
    parent = catalog_engine("sglang-0.4").sequence_overhead_s.value
    assert score.inherited_sequence_overhead_s(rocm) == parent
    kernel, sequence = score.fit_step_costs(rocm)
    assert sequence == parent and kernel > 0
    assert catalog_engine("sglang-0.4-rocm").kernel_overhead_s.value == pytest.approx(kernel)
    several = [line for line in lines if line.profile == "sglang-0.4"]
    assert len({line.batch for line in several}) > 1 and score.inherited_sequence_overhead_s(several) is None
    # the fitted floor prices both lines of the run, the decode step and the batch's latency with its prefill
    for line in rocm:
        assert score.predict_line_s(line, kernel, sequence) == pytest.approx(line.measured_s, rel=0.05)


def test_a_root_profiles_one_batch_lines_hold_its_own_per_sequence_cost_and_share_the_floor(score, capsys) -> None:
    """[sglang] inherits no profile: its batch-1 lines (fold D amendment 5) fit the per-kernel floor and keep its own
    cited per-sequence cost; [vllm] and [tensorrt-llm] ship that floor, and a sharer that drifts from it fails."""
    late = [line for line in score.load_engine_steps() if line.profile == "sglang"]
    assert late and {line.batch for line in late} == {1} and catalog_engine("sglang").inherits is None
    own = catalog_engine("sglang").sequence_overhead_s.value
    assert score.inherited_sequence_overhead_s(late) == own
    kernel, sequence = score.fit_step_costs(late)
    assert sequence == own and kernel > 0
    for key in ("sglang", *score.SHARED_KERNEL_FIT["sglang"]):
        shipped = catalog_engine(key).kernel_overhead_s
        assert shipped.fitted == "D" and shipped.value == pytest.approx(kernel)
    shared = score.SHARED_KERNEL_FIT
    try:
        score.SHARED_KERNEL_FIT = {"sglang": ("sglang-0.4",)}  # a profile with another floor
        assert score.print_engine_step_fit() == 1
        assert "shared per-kernel fit, shipped sglang-0.4" in capsys.readouterr().out
    finally:
        score.SHARED_KERNEL_FIT = shared


def test_s4_rows_are_closed_loops_or_full_length_bursts(score) -> None:
    """Rule S4 (SOURCES.md): a GPUStack row is a closed loop at concurrency 2-8 scored at its mean lengths, or a
    one-shot burst whose concurrency is its request count and in which every request ran to its output length."""
    rows = [row for row in score.load_rows() if "gpustack/gpustack/blob/1f37f1b8" in row.source]
    assert len(rows) == 20 and all(row.fold == "B" and "rule S4" in row.notes for row in rows)
    for row in rows:
        if row.concurrency == row.requests:
            assert f"= {row.requests} x {row.output_tokens}: every request ran to its length" in row.notes
        else:
            assert 2 <= row.concurrency <= 8 and row.requests == 100 and "APPROXIMATION" in row.notes
        for banned in ("--async-scheduling", "--speculative", "--enable-torch-compile", "--attention-backend", "-pp "):
            assert banned not in row.notes


def test_fold_d_lines_run_their_platforms_build(score) -> None:
    """A fold-D line names the profile it fits, and that is the profile the estimate runs on its device: vLLM 0.7's
    CUDA lines fit [vllm-0.7], its MI300X lines [vllm-0.7-rocm] (SOURCES.md, fold D amendment 3)."""
    lines = score.load_engine_steps()
    for line in lines:
        assert engine_for_device(catalog_engine(line.profile), resolve_hardware(line.device)).key == line.profile
    by_profile = {profile: {line.device for line in lines if line.profile == profile} for profile in {l.profile for l in lines}}
    assert by_profile["vllm-0.7-rocm"] == {"mi300x"} and "mi300x" not in by_profile["vllm-0.7"]
    # SGLang 0.4 likewise (fold D amendment 4): PR #2643's H200 lines and PR #3237's MI300X ones
    assert by_profile["sglang-0.4-rocm"] == {"mi300x"} and by_profile["sglang-0.4"] == {"h200"}
    # the CUDA build's small-batch lines are DeepSeek-Coder-V2-Lite's (the only ones published)
    assert {line.model for line in lines if line.profile == "vllm-0.7"} == {"deepseek-r1", "deepseek-coder-v2-lite-instruct"}


def test_rows_naming_sglang_0_4_are_priced_with_its_profile_in_profiles_mode(score) -> None:
    rows = [row for row in score.load_rows() if row.engine == "sglang"]
    early = [row for row in rows if "sglang 0.4.3.post2" in row.notes or "sglang 0.4.2.post4" in row.notes]
    assert len(early) == 18
    # each platform's build (fold D amendment 4): CUDA on the H200s, ROCm on the MI300Xs
    assert {score.row_engine(row) for row in early if row.device == "h200"} == {"sglang-0.4"}
    assert {score.row_engine(row) for row in early if row.device == "mi300x"} == {"sglang-0.4-rocm"}
    later = [row for row in rows if row not in early]  # gpt-oss-20b (Aug 2025), DeepSeek-V3 on B200 (Jun 2025)
    assert later and {score.row_engine(row) for row in later} == {"sglang"}


def test_rows_naming_vllm_0_7_are_priced_with_its_profile_in_profiles_mode(score) -> None:
    rows = [row for row in score.load_rows() if row.engine == "vllm"]
    early = [row for row in rows if "vLLM 0.7.3.dev138" in row.notes or "vLLM nightly 0.7.4.dev181" in row.notes]
    assert len(early) == 18
    # each platform's build (SOURCES.md, fold D amendment 3): CUDA on the H200s, ROCm on the MI300Xs
    assert {score.row_engine(row) for row in early if row.device == "h200"} == {"vllm-0.7"}
    assert {score.row_engine(row) for row in early if row.device == "mi300x"} == {"vllm-0.7-rocm"}
    later = [row for row in rows if row not in early]  # the vLLM recipes' MI300X rows (later builds)
    assert later and {score.row_engine(row) for row in later} == {"vllm"}
    # V0 with MLA: --max-model-len is the step's token budget (SOURCES.md, engine_args)
    assert {dict(row.engine_args).get("max_batched_tokens") for row in early if row.device == "mi300x"} == {32768}


def test_rule_k1_gives_the_logged_kv_capacity_to_exactly_the_rows_that_ran_its_configuration(score) -> None:
    """Rule K1 (SOURCES.md): vLLM's own log of DeepSeek-R1 at TP 8 (PR #14842: 4,739 blocks, 1.85x of 163,840
    tokens) is a run condition of dstack's H200 vLLM 0.7 rows, which set no memory option; no other row gets it."""
    (logged,) = score.LOGGED_KV_CAPACITIES
    assert logged.kv_tokens == 4739 * logged.block_size
    # the log's own arithmetic fixes the block: 1.85x of 163,840 tokens in 4,739 blocks
    assert round(1.85 * 163840 / 4739) == logged.block_size == 64
    given = {row.index: score.logged_kv_capacity(row, score.row_engine(row)) for row in score.load_rows()}
    chosen = {index for index, settings in given.items() if settings}
    rows = {row.index: row for row in score.load_rows()}
    assert chosen == {index for index, row in rows.items() if row.engine == "vllm" and row.device == "h200"
                      and "vLLM nightly 0.7.4.dev181" in row.notes}
    assert len(chosen) == 9
    assert all(given[index] == {"kv_tokens": 303_296, "block_size": 64} for index in chosen)
    # a row that sets its own options, or runs another build, is not given it
    row = rows[min(chosen)]
    assert score.logged_kv_capacity(dataclasses.replace(row, engine_args=(("max_seqs", 64),)), "vllm-0.7") == {}
    assert score.logged_kv_capacity(row, "vllm") == {}


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the fold-A fits have no rows in this two-row file
def test_per_row_table_gives_each_targets_mode_and_its_signed_error(score, capsys, tmp_path):
    """Without --quiet, every row prints the prediction of the mode its target is judged in (decode and prefill:
    profiles; serving: simulate+profiles) and the signed error, so a per-row figure in the docs reruns from score.py."""
    header = CSV_PATH.read_text(encoding="utf-8").splitlines()[0]
    picked = [r for r in score.load_rows() if r.quantity == "serving" and r.engine == "vllm" and r.concurrency == 4][:1]
    picked += [r for r in score.load_rows() if r.quantity == "prefill" and r.fold == "B"][:1]
    lines = CSV_PATH.read_text(encoding="utf-8").splitlines()
    small = tmp_path / "few.csv"
    small.write_text("\n".join([header] + [lines[r.index] for r in picked]) + "\n", encoding="utf-8")
    assert score.main(["--csv", str(small)]) in (0, 1)  # 1: the fold-A fits have no rows to fit here
    out = capsys.readouterr().out
    picked = score.load_rows(small)  # numbered as in the small file
    serving = picked[0]
    simulated = score.predict_serving_simulated(serving, engine=score.row_engine(serving))
    expected = 100.0 * (simulated["tpot_ms"] - serving.tpot_ms) / serving.tpot_ms
    tpot_line = next(line for line in out.splitlines() if line.lstrip().startswith(f"{serving.index} ") and "TPOT under load" in line)
    assert tpot_line.split("/")[-1].strip() == f"{expected:+.1f}"
    prefill = picked[1]
    predicted = score.predict_prefill_tok_s(prefill, engine=score.row_engine(prefill))
    prefill_line = next(line for line in out.splitlines() if line.lstrip().startswith(f"{prefill.index} ") and "prefill" in line)
    assert f"{100.0 * (predicted - prefill.prefill_tok_s) / prefill.prefill_tok_s:+.1f} /     n/a" in prefill_line
