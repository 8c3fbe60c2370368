"""`speedlimit simulate` with bad input: one line on stderr, exit code 2, never a traceback."""

from __future__ import annotations

import pytest

from tests.simulate.test_cli import BASE, cli  # noqa: F401  (the fixture)


@pytest.mark.parametrize("argv,needle", [
    (("--rate", "-1"), "--rate"),
    (("--rate", "1e-300", "--requests", "3"), "simulated time"),
    (("--rate", "1e-8", "--burstiness", "0.01", "--requests", "50"), "simulated time"),
    (("--concurrency", "2", "--rate", "3"), "exactly one"),
    (("--concurrency", "0"), "--concurrency"),
    (("--requests", "0"), "--requests"),
    (("--prompt-tokens", "abc"), "token length"),
    (("--output-tokens", "0"), "token length"),
    (("--engine", "warp"), "--engine"),
    (("--engine", "serial", "--max-seqs", "4"), "serial"),
    (("--max-seqs", "64", "--max-batched-tokens", "32"), "--max-batched-tokens"),
    (("--kv-tokens", "256"), "can never be admitted"),
    (("--sweep", "concurrency=1,x"), "--sweep"),
    (("--sweep", "rate=1,2", "--rate", "2"), "--sweep"),
    (("--slo", "ttft=fast"), "duration"),
    (("--duration", "nan"), "--duration"),
    (("--burstiness", "0"), "--burstiness"),
    (("--rate", "inf", "--duration", "5"), "--duration"),
    (("--dataset", "/nonexistent.jsonl"), "does not exist"),
    (("--no-chunked-prefill", "--prompt-tokens", "9000"), "--max-batched-tokens"),
    (("--sequence-overhead", "5"), "--sequence-overhead"),
    (("--block-size", "0"), "--block-size"),
    (("--knee-fraction", "2"), "--knee-fraction"),
])
def test_bad_input_is_one_line_and_exit_2(cli, argv, needle):
    code, out, err = cli(*BASE, *argv)
    assert code == 2, (out, err)
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err
    assert needle in err


def test_model_that_leaves_no_kv_memory_is_an_error(cli):
    code, out, err = cli("simulate", "-m", "llama-3.1-70b", "-H", "l4", "--requests", "2")
    assert code == 2 and err.count("\n") == 1 and ("no memory" in err or "does not fit" in err)


def test_no_hardware_is_an_error(cli):
    code, out, err = cli("simulate", "-m", "7B")
    assert code == 2 and "--hardware" in err
