"""verify's description of the model it runs."""

from __future__ import annotations

import shutil
from pathlib import Path

from speedlimit.bundled import default_gguf_path
from speedlimit.verify.run import load_model_info


def test_bundled_model_is_named_by_its_catalog_entry() -> None:
    arch, info = load_model_info(default_gguf_path())
    assert info.name.startswith("smollm2-135m")
    assert info.name != arch.name  # the GGUF's own general.name is a training-run label


def test_other_files_keep_their_own_name(tmp_path: Path) -> None:
    copy = tmp_path / "my-model.gguf"
    shutil.copyfile(default_gguf_path(), copy)
    arch, info = load_model_info(copy)
    assert info.name == arch.name
