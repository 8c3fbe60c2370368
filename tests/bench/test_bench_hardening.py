"""bench against bad input and misbehaving servers: nothing lost, nothing created by a bad flag, one line and exit 2
for what cannot work, exit 130 with the summary of what finished when interrupted."""

from __future__ import annotations

import http.server
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from faulty_server import free_port
from speedlimit.bundled import default_gguf_path

ROOT = Path(__file__).resolve().parents[2]


def bench(run_cli, url, *argv):
    return run_cli(["bench", "--url", url, "--no-progress", *argv])


# --- --out never loses a run -----------------------------------------------------------------------------------


def test_out_holding_a_run_is_refused_and_force_replaces_it_whole(faulty_server, tmp_path, run_cli):
    out = tmp_path / "run"
    assert bench(run_cli, faulty_server.url("ok"), "--requests", "8", "--out", str(out))[0] == 0
    (out / "report").mkdir()
    (out / "notes.txt").write_text("mine")
    code, _, err = bench(run_cli, faulty_server.url("ok"), "--requests", "1", "--out", str(out))
    assert code == 2 and err.count("\n") == 1 and "--force" in err and "fresh directory" in err
    assert len((out / "requests.jsonl").read_text().splitlines()) == 8  # the first run is intact

    code, _, _ = bench(run_cli, faulty_server.url("ok"), "--requests", "1", "--out", str(out), "--force")
    assert code == 0
    assert len((out / "requests.jsonl").read_text().splitlines()) == 1
    assert not (out / "report").exists()  # no stale report of the replaced run
    assert (out / "notes.txt").read_text() == "mine"  # only the run's own files go


def test_out_that_is_a_file_is_one_line(faulty_server, tmp_path, run_cli):
    target = tmp_path / "summary.json"
    target.write_text("{}")
    code, _, err = bench(run_cli, faulty_server.url("ok"), "--out", str(target))
    assert code == 2 and err.count("\n") == 1 and "is a file" in err
    assert target.read_text() == "{}"


# --- bad numbers: one line, before anything is created -----------------------------------------------------------


@pytest.mark.parametrize("argv, message", [
    (["--rate", "nan"], "--rate must be a number"),
    (["--rate", "nan", "--requests", "3"], "--rate must be a number"),
    (["--rate", "1", "--burstiness", "nan"], "--burstiness"),
    (["--rate", "1", "--burstiness", "inf"], "--burstiness"),
    (["--timeout", "nan"], "--timeout"),
    (["--timeout", "inf"], "--timeout"),
    (["--duration", "nan"], "--duration"),
    (["--requests", "1000000000000"], "--requests must be between 1 and 1,000,000"),
    (["--concurrency", "1000000000"], "--concurrency must be between"),
    (["--prompt-tokens", "100000000"], "--prompt-tokens asks for prompts of up to 100,000,000"),
    (["--prompt-tokens", "uniform:1:100000000"], "--prompt-tokens"),
    (["--output-tokens", "0"], "--output-tokens"),
    (["--output-tokens", "100000000"], "--output-tokens"),
    (["--rate", "1000000", "--duration", "1000000"], "--rate × --duration"),
    (["--sweep", "rate=nan"], "bad --sweep"),
    (["--sweep", "concurrency=inf"], "whole numbers"),
    (["--sweep", "concurrency=1,1000000000"], "--concurrency must be between"),
    (["--knee-fraction", "nan"], "--knee-fraction"),
    (["--tokenizer", "/nonexistent/tokenizer.json"], "no such file"),
])
def test_bad_numbers_are_one_line_before_anything_is_created(faulty_server, tmp_path, run_cli, argv, message):
    out = tmp_path / "out"
    code, out_text, err = bench(run_cli, faulty_server.url("ok"), "--out", str(out), *argv)
    assert code == 2 and out_text == ""
    assert err.count("\n") == 1 and err.startswith("error: ") and message in err, err
    assert not out.exists()


def test_a_file_that_is_no_tokenizer_is_one_line(faulty_server, tmp_path, run_cli):
    junk = tmp_path / "tokenizer.json"
    junk.write_text('{"not": "a tokenizer"}')
    code, _, err = bench(run_cli, faulty_server.url("ok"), "--tokenizer", str(junk))
    assert code == 2 and err.count("\n") == 1 and "is not a Hugging Face tokenizer.json" in err


# --- the pre-flight says what is wrong ---------------------------------------------------------------------------


def test_wrong_model_fails_before_sending_and_names_the_served_models(faulty_server, run_cli):
    served_before = len(faulty_server.modes_served)
    code, _, err = bench(run_cli, faulty_server.url("ok"), "--model", "llama-9000", "--requests", "2")
    assert code == 2 and err.count("\n") == 1
    assert "'llama-9000'" in err and "fake-model" in err
    assert len(faulty_server.modes_served) == served_before + 1  # GET /v1/models only: no request was sent


def test_url_without_v1_says_404_and_suggests_v1(faulty_server, run_cli):
    url = faulty_server.url("ok").removesuffix("/v1")
    code, _, err = bench(run_cli, url, "--model", "fake-model")
    assert code == 2 and err.count("\n") == 1
    assert "HTTP 404" in err and f"--url {url}/v1" in err


def test_server_that_hangs_at_preflight_is_a_timeout_not_unreachable(faulty_server, run_cli):
    started = time.monotonic()
    code, _, err = bench(run_cli, faulty_server.url("mute"), "--timeout", "1")
    assert time.monotonic() - started < 10
    assert code == 2 and err.count("\n") == 1
    assert "timed out after 1 s" in err and "cannot reach" not in err and "()" not in err


def test_plain_http_server_is_a_404_not_an_empty_model_list(run_cli, tmp_path):
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(tmp_path), **kwargs)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        code, _, err = bench(run_cli, f"http://127.0.0.1:{server.server_address[1]}/v1")
    finally:
        server.shutdown()
    assert code == 2 and err.count("\n") == 1
    assert "HTTP 404" in err and "lists no model" not in err


# --- token counts: warned when they are chunk counts, exact with --tokenizer -----------------------------------


def test_multi_token_chunks_warn_and_tokenizer_counts_exactly(faulty_server, tmp_path, run_cli):
    url = faulty_server.url("multi-4")  # 4 tokens per chunk, no usage, no tokenizer endpoint
    code, out, err = bench(run_cli, url, "--requests", "3", "--output-tokens", "16", "--json")
    chunks = json.loads(out)
    assert code == 0 and chunks["output_tokens"] == 3 * 4 and chunks["token_count_source"] == "chunks"
    assert "warning:" in err and "contradict the forced --output-tokens 16" in err and "--tokenizer" in err
    assert chunks["warnings"] and "contradict" in chunks["warnings"][0]

    code, out, err = bench(run_cli, url, "--requests", "3", "--output-tokens", "16", "--json",
                           "--tokenizer", str(default_gguf_path()), "--out", str(tmp_path / "gguf"))
    exact = json.loads(out)
    assert code == 0 and "warning" not in err
    assert exact["output_tokens"] == 3 * 16 and exact["token_count_source"] == "tokenizer"
    assert exact["prompt_token_source"] == "tokenizer"  # prompts cut to length with the same tokenizer
    assert exact["itl_token_s"]["mean"] == pytest.approx(exact["itl_s"]["mean"] / 4)
    rows = [json.loads(line) for line in (tmp_path / "gguf" / "requests.jsonl").read_text().splitlines()]
    assert [row["output_tokens"] for row in rows] == [16, 16, 16]


def test_local_tokenizer_json_and_gguf_agree(tmp_path):
    import asyncio

    from speedlimit.bench.tokenizer import load_local_tokenizer

    from_gguf = load_local_tokenizer(default_gguf_path())
    path = tmp_path / "tokenizer.json"
    from_gguf._tokenizer.save(str(path))
    from_json = load_local_tokenizer(path)
    assert from_json.kind == "tokenizer.json" and from_gguf.kind == "gguf"
    text = "Hello world, it's 2026: the of and to 12345 ünïcode"
    assert from_json.encode(text) == from_gguf.encode(text)
    assert asyncio.run(from_gguf.count_generated(" the of and to")) == 4


@pytest.mark.engine
def test_gguf_tokenizer_matches_llama_cpp_on_the_bundled_model():
    llama_cpp = pytest.importorskip("llama_cpp")
    from speedlimit.bench.tokenizer import load_local_tokenizer
    from speedlimit.bench.workload import WORDS

    ours = load_local_tokenizer(default_gguf_path())
    reference = llama_cpp.Llama(str(default_gguf_path()), vocab_only=True, verbose=False)
    texts = ["Hello world, 12345 tokens!", "It's a test. Don't   stop\n\nnow\t2026 ünïcode 😀 <|im_end|>",
             " ".join(WORDS[::7]) + " (x) #3.14 é"]
    for text in texts:
        assert ours.encode(text) == reference.tokenize(text.encode(), add_bos=False, special=True), text


# --- Ctrl-C / SIGTERM: exit 130, nothing lost --------------------------------------------------------------------


def _start_bench(*argv: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.Popen([sys.executable, "-m", "speedlimit.cli", "bench", "--no-progress", *argv],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _wait_for(predicate, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out waiting for the bench subprocess"
        time.sleep(0.05)


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_sigint_mid_run_records_in_flight_as_cancelled_writes_summary_exits_130(faulty_server, tmp_path):
    out = tmp_path / "run"
    # 20 chunks 100 ms apart: each request takes ~2 s; 2 at a time
    process = _start_bench("--url", faulty_server.url("paced-100"), "--output-tokens", "20", "--concurrency", "2",
                           "--requests", "6", "--out", str(out))
    try:
        _wait_for(lambda: len(_rows(out / "requests.jsonl")) >= 2)  # the first two finished, two more in flight
        time.sleep(0.5)
        process.send_signal(signal.SIGINT)
        stdout, stderr = process.communicate(timeout=30)
    finally:
        process.kill()
    assert process.returncode == 130, stderr
    assert "Traceback" not in stderr
    assert "interrupted by SIGINT" in stderr and str(out) in stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["interrupted"] == "SIGINT"
    assert summary["completed"] >= 2 and summary["cancelled"] == 2
    assert summary["requests"] == summary["completed"] + summary["cancelled"]
    rows = _rows(out / "requests.jsonl")
    assert len(rows) == summary["requests"]
    cancelled = [row for row in rows if row["error_kind"] == "cancelled"]
    assert len(cancelled) == 2 and all(row["output_chunks"] >= 1 for row in cancelled)  # what arrived is kept
    assert "cancelled by SIGINT" in stdout  # the table of what finished is printed too


def test_sigterm_mid_sweep_writes_the_point_and_the_sweep_of_points_done(faulty_server, tmp_path):
    out = tmp_path / "sweep"
    process = _start_bench("--url", faulty_server.url("paced-50"), "--output-tokens", "20", "--sweep",
                           "concurrency=1,2,4", "--requests", "2", "--out", str(out), "--json")
    try:
        _wait_for(lambda: (out / "concurrency_1" / "summary.json").exists()
                  and len(_rows(out / "concurrency_2" / "requests.jsonl")) == 0)
        time.sleep(0.5)  # concurrency=2: both requests in flight
        process.send_signal(signal.SIGTERM)
        stdout, stderr = process.communicate(timeout=30)
    finally:
        process.kill()
    assert process.returncode == 130, stderr
    assert "Traceback" not in stderr and "interrupted by SIGTERM" in stderr
    sweep = json.loads((out / "summary.json").read_text())
    assert json.loads(stdout) == sweep
    assert sweep["interrupted"] == "SIGTERM"
    assert [p["sweep_value"] for p in sweep["points"]] == [1, 2]
    first, partial = sweep["points"]
    assert first["completed"] == 2 and first["interrupted"] is None
    assert partial["interrupted"] == "SIGTERM" and partial["cancelled"] == 2
    assert sweep["sweep"]["knee_load"] == 1  # the knee comes from the levels that ran to the end
    assert json.loads((out / "concurrency_2" / "summary.json").read_text())["cancelled"] == 2
    assert not (out / "concurrency_4").exists()


def test_sigint_during_a_hanging_preflight_exits_130_without_traceback(faulty_server):
    before = faulty_server.modes_served.count("mute")
    process = _start_bench("--url", faulty_server.url("mute"))
    try:
        _wait_for(lambda: faulty_server.modes_served.count("mute") > before)  # the pre-flight is waiting
        time.sleep(0.2)
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=30)
    finally:
        process.kill()
    assert process.returncode == 130 and "Traceback" not in stderr, stderr
    assert stderr.count("\n") == 1 and "interrupted" in stderr
