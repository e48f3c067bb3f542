"""Full and read-only disks give the project's error, leave nothing behind, keep earlier results.

Issue 23, item 7: a save onto a full disk gave a builtin ``OSError`` or h5py's
``RuntimeError: Disable slist on flush dest failure failed``, naming neither the target
nor a fix, and a failed Zarr save left its hidden temporary store on the full disk.  The
scenarios run on a real 2 MiB tmpfs in a private mount namespace (tests/full_disk_scenarios.py):
a save the free space cannot hold (refused before writing), one that fills the disk midway
(the pre-check fooled), and one onto a read-only remount; HDF5 and Zarr.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="tmpfs and mount namespaces are Linux's"
)


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("fd") / "report.json"
    unshare = shutil.which("unshare")
    assert unshare is not None, "unshare (util-linux) is not installed"
    argv = [sys.executable, "-m", "tests.full_disk_scenarios", str(out)]
    run = subprocess.run(
        [unshare, "--user", "--map-root-user", "--mount", *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if run.returncode != 0 and os.geteuid() == 0:  # user namespaces off: a root mount instead
        run = subprocess.run(
            [unshare, "--mount", *argv],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    data: dict[str, Any] = json.loads(out.read_text())
    return data


@pytest.mark.parametrize("fmt", ["hdf5", "zarr"])
def test_a_save_the_free_space_cannot_hold_is_refused_before_writing(
    report: dict[str, Any], fmt: str
) -> None:
    case = report[fmt]
    assert case["raised"] == "StorageError", case
    assert case["oserror"] is True  # still an OSError for callers catching that
    text = case["message"]
    assert "is full" in text and "bytes needed" in text and "free" in text, text
    assert "Free space there, or save to another disk" in text
    assert case["needed"] > case["free"] > 0
    assert case["intact"] is True  # the earlier results at the target
    assert case["leftovers"] == []  # no hidden temporary file or store


@pytest.mark.parametrize("fmt", ["hdf5", "zarr"])
def test_a_disk_that_fills_midway_leaves_nothing_behind(report: dict[str, Any], fmt: str) -> None:
    case = report[fmt]
    assert case["midway"]["raised"] == "StorageError", case["midway"]
    assert "is full" in case["midway"]["message"], case["midway"]
    assert case["leftovers_after_midway"] == [], case


def test_a_read_only_file_system_is_named(report: dict[str, Any]) -> None:
    case = report["readonly"]
    assert case["raised"] == "StorageError", case
    assert "read-only file system" in case["message"] and "writable directory" in case["message"]
