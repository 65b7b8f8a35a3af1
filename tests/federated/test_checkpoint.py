"""A checkpoint resumes only under the params and the code that wrote it: DVC re-runs
``fedsieve train --resume`` when the code changed, and must then train anew."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

from federated.checkpoint import (
    ENGINE_PACKAGES,
    SOURCE_ROOT,
    code_digest,
    read_checkpoint,
    stale_checkpoint,
)


def test_the_code_digest_follows_the_engine_sources_and_nothing_else(tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    for package in ENGINE_PACKAGES:
        shutil.copytree(SOURCE_ROOT / package, copy / package)
    (copy / "README.md").write_text("not code")
    (copy / "federated" / "notes.txt").write_text("not code either")
    assert code_digest(copy) == code_digest()

    changed = tmp_path / "changed"
    shutil.copytree(copy, changed)
    server = changed / "federated" / "server.py"
    server.write_text(server.read_text() + "\n# a changed line\n")
    assert code_digest(changed) != code_digest()


def test_a_checkpoint_of_other_params_or_other_code_is_not_resumed(tmp_path: Path) -> None:
    path = tmp_path / "train.pt"
    written = {"params_hash": "abc", "code": code_digest(), "run_id": None, "state": {"round": 3}}

    torch.save(written, path)
    assert read_checkpoint(path, "abc") is not None
    assert read_checkpoint(path, "other") is None
    assert "other params" in stale_checkpoint(written, "other")

    torch.save({**written, "code": "0123456789abcdef"}, path)  # an older fedsieve's rounds
    assert read_checkpoint(path, "abc") is None
    assert "other code" in stale_checkpoint({**written, "code": "x"}, "abc")
