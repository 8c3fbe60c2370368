"""Shared fixtures for verify/calibrate tests: an isolated config dir and a CLI runner in a child process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def isolated_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Profiles go to tmp_path, never the real user config dir."""
    config = tmp_path / "config"
    monkeypatch.setenv("SPEEDLIMIT_CONFIG_DIR", str(config))
    return config


def run_cli(args: list[str], *, prelude: str = "", timeout: float = 300) -> subprocess.CompletedProcess:
    """`speedlimit ARGS` in a child process (optionally after a Python prelude that patches something)."""
    code = f"import sys\n{prelude}\nsys.argv = ['speedlimit', *{args!r}]\nfrom speedlimit.cli import main\nmain()\n"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, env=dict(os.environ))


@pytest.fixture
def cli():
    return run_cli
