"""Pipeline YAML: alias bombs and duplicate keys are refused (issue 11, item 4)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from quantem_flow.errors import FormatError
from quantem_flow.pipeline import MAX_YAML_NODES, load_pipeline, strict_yaml_load


def _bomb(levels: int = 8) -> str:
    """Nested anchors under ``description``, each level repeating the one below 10 times."""
    lines = ["version: 1", "description:", '  - &a0 ["x", "x", "x", "x", "x", "x", "x", "x"]']
    for i in range(1, levels + 1):
        lines.append(f"  - &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]")
    lines += ["input: {path: data.npy}", "outputs: {bf: {op: virtual_bf}}"]
    return "\n".join(lines) + "\n"


def test_an_alias_bomb_is_refused_quickly(tmp_path: Path) -> None:
    yml = tmp_path / "bomb.yaml"
    yml.write_text(_bomb())
    assert len(yml.read_bytes()) < 1024
    outcome: dict[str, Any] = {}

    def load() -> None:
        try:
            load_pipeline(yml)
        except BaseException as exc:
            outcome["error"] = exc

    t0 = time.perf_counter()
    worker = threading.Thread(target=load, daemon=True)
    worker.start()
    worker.join(timeout=20)
    assert not worker.is_alive(), "load_pipeline hung on 8 levels of nested aliases"
    assert time.perf_counter() - t0 < 5
    err = outcome.get("error")
    assert isinstance(err, FormatError), repr(err)
    assert "alias" in str(err) and str(MAX_YAML_NODES) in str(err) and "bomb.yaml" in str(err)


def test_duplicate_keys_are_refused(tmp_path: Path) -> None:
    yml = tmp_path / "dup.yaml"
    yml.write_text(
        "version: 1\ninput: {path: data.npy}\noutputs:\n  bf: {op: virtual_bf}\n"
        "  bf: {op: virtual_adf}\n"
    )
    with pytest.raises(FormatError, match=r"key 'bf' appears twice.*lines 4 and 5"):
        load_pipeline(yml)
    with pytest.raises(FormatError, match="key 'version' appears twice"):
        strict_yaml_load("version: 1\nversion: 2\n")


def test_ordinary_anchors_and_merge_keys_still_load(tmp_path: Path) -> None:
    np.save(tmp_path / "data.npy", np.zeros((2, 3, 8, 8), dtype=np.uint16))
    yml = tmp_path / "ok.yaml"
    yml.write_text(
        "version: 1\n"
        "input: {path: data.npy}\n"
        "base: &c {center: [4.0, 4.0], units: px}\n"
        "outputs:\n"
        "  bf: {op: virtual_bf, radius: 2, <<: *c}\n"
        "  adf: {op: virtual_adf, inner: 3, outer: 5, <<: *c, units: px}\n"
    )
    doc = strict_yaml_load(yml.read_text())
    assert doc["outputs"]["adf"]["center"] == [4.0, 4.0]
    assert strict_yaml_load("") is None
    assert strict_yaml_load("a: &x [1, 2]\nb: *x\n") == {"a": [1, 2], "b": [1, 2]}
