"""The android/ Vulkan worker's ctest suite (C++ codec, kernels on lavapipe, the worker over pipes).

``scripts/install-toolchains.sh`` builds ``android/build``; a missing build is a
failure saying how to build it, not a skip: Vulkan runs here on Mesa lavapipe.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

BUILD = Path(__file__).resolve().parents[2] / "android" / "build"

pytestmark = pytest.mark.slow


def test_android_ctest_suite_passes() -> None:
    ctest = shutil.which("ctest")
    assert ctest is not None, "ctest is not on PATH: apt-get install cmake"
    assert (BUILD / "qf-vulkan-worker").is_file(), (
        "android/build/qf-vulkan-worker is missing: run `bash scripts/install-toolchains.sh` "
        "(cmake -S android -B android/build && cmake --build android/build)"
    )
    run = subprocess.run(
        [ctest, "--test-dir", str(BUILD), "--output-on-failure"],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-6000:]
    summary = re.search(r"(\d+)% tests passed, (\d+) tests failed out of (\d+)", out)
    assert summary is not None, out[-3000:]
    assert int(summary.group(2)) == 0
    assert int(summary.group(3)) >= 15, out[-3000:]
    assert "Not Run" not in out and "***Skipped" not in out, "a skipped ctest is not evidence"
