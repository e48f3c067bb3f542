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

ANDROID = Path(__file__).resolve().parents[2] / "android"
BUILD = ANDROID / "build"

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("build", ["build", "build-sanitize"])
def test_android_ctest_suite_passes(build: str) -> None:
    """The release build, and the same tests built with AddressSanitizer + UBSan."""
    ctest = shutil.which("ctest")
    assert ctest is not None, "ctest is not on PATH: apt-get install cmake"
    assert (ANDROID / build / "qf-vulkan-worker").is_file(), (
        f"android/{build}/qf-vulkan-worker is missing: run `bash scripts/install-toolchains.sh`"
    )
    run = subprocess.run(
        [ctest, "--test-dir", str(ANDROID / build), "--output-on-failure"],
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


def test_protocol_parser_survives_a_bounded_libfuzzer_run(tmp_path: Path) -> None:
    """A few seconds of libFuzzer (ASan + UBSan) over the parser, seeded with the golden vectors."""
    fuzzer = ANDROID / "build-fuzz" / "qfv-fuzz-protocol"
    assert fuzzer.is_file(), (
        "android/build-fuzz/qfv-fuzz-protocol is missing: run `bash scripts/install-toolchains.sh`"
    )
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    vectors = sorted((ANDROID.parent / "docs" / "protocol" / "vectors").glob("*.bin"))
    assert len(vectors) >= 20
    for v in vectors:
        (corpus / v.name).write_bytes(v.read_bytes())
    run = subprocess.run(
        [str(fuzzer), "-max_total_time=5", "-rss_limit_mb=1024", "-timeout=5", str(corpus)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=tmp_path,
    )
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-4000:]
    done = re.search(r"Done (\d+) runs", out)
    assert done is not None and int(done.group(1)) > 1000, out[-2000:]
