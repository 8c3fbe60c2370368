"""Bad input to `verify`/`calibrate` exits 2 with one line on stderr and no traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from speedlimit.errors import SpeedlimitError
from speedlimit.verify.run import ModelInfo, check_fits


def assert_one_line_error(done, *needles: str) -> None:
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("error: ")
    assert "Traceback" not in done.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_missing_model_file(cli, tmp_path: Path) -> None:
    assert_one_line_error(cli(["verify", "--model", str(tmp_path / "nope.gguf")]), "no such model file", "--model")


def test_unreadable_gguf(cli, tmp_path: Path) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf file at all" * 50)
    assert_one_line_error(cli(["verify", "--model", str(bad)]), "not a readable GGUF")


def test_missing_engine_says_what_to_install(cli) -> None:
    done = cli(["verify", "--quick"], prelude="sys.modules['llama_cpp'] = None  # makes `import llama_cpp` fail")
    assert_one_line_error(done, 'CMAKE_ARGS="-DGGML_NATIVE=OFF" pip install --no-cache-dir llama-cpp-python==0.3.36')


def test_model_larger_than_ram(cli) -> None:
    prelude = "import speedlimit.verify.membench as m\nm.machine_memory_bytes = lambda: 50e6"
    assert_one_line_error(cli(["verify", "--quick"], prelude=prelude), "GiB of RAM", "smaller --model")


def test_check_fits_counts_kv_cache() -> None:
    model = ModelInfo(path="/m.gguf", name="m", file_bytes=10**9, kv_bytes_per_token=1e6)
    assert check_fits(model, 1000, 4e9) > 2e9
    with pytest.raises(SpeedlimitError, match="KV cache at 4000 tokens"):
        check_fits(model, 4000, 4e9)


@pytest.mark.parametrize("flag", [["--contexts", "128,x"], ["--runs", "0"], ["--threads", "0"], ["--decode-tokens", "1"],
                                  ["--batch-sequences", "2,x"], ["--batch-sequences", "0,4"], ["--batch-sequences", "65"]])
def test_bad_settings(cli, flag: list[str]) -> None:
    assert_one_line_error(cli(["verify", *flag]))


def test_context_beyond_model_limit(cli) -> None:
    assert_one_line_error(cli(["verify", "--contexts", "9000"]), "supports 8192 tokens")


def test_calibrate_missing_file(cli, tmp_path: Path) -> None:
    assert_one_line_error(cli(["calibrate", str(tmp_path / "none.json")]), "no such file")


def test_calibrate_not_json(cli, tmp_path: Path) -> None:
    path = tmp_path / "x.json"
    path.write_text("{ not json")
    assert_one_line_error(cli(["calibrate", str(path)]), "not valid JSON")


def test_calibrate_unknown_shape(cli, tmp_path: Path) -> None:
    path = tmp_path / "x.json"
    path.write_text(json.dumps({"hello": 1}))
    assert_one_line_error(cli(["calibrate", str(path)]), "neither")


def test_calibrate_bad_profile_name(cli, tmp_path: Path) -> None:
    path = tmp_path / "x.json"
    path.write_text("{}")
    assert_one_line_error(cli(["calibrate", str(path), "--name", "../evil"]), "profile name")
