"""Every CUDA raw-kernel source compiles for Hopper (sm_90) with nvcc.

This checks syntax and types only: it is not evidence that the kernels are
correct on a GPU (the conformance suite's CUDA cases are, when a GPU answers).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from quantem_flow.runtimes.cuda import KERNEL_DIR, CudaRuntime, kernel_sources

SOURCES = sorted(KERNEL_DIR.glob("*.cu"))


def test_there_are_kernel_sources() -> None:
    assert {p.name for p in SOURCES} >= {"frame_pass.cu", "paired.cu"}
    assert set(kernel_sources()) == {p.name for p in SOURCES}
    assert all('#include "common.cuh"' not in s for s in kernel_sources().values())


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.name)
def test_kernel_compiles_for_sm90(source: Path, tmp_path: Path) -> None:
    out = tmp_path / (source.stem + ".cubin")
    proc = subprocess.run(
        [
            "nvcc",
            "-arch=sm_90",
            "-cubin",
            "-std=c++17",
            "-Werror",
            "all-warnings",
            "-I",
            str(KERNEL_DIR),
            "-o",
            str(out),
            str(source),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert out.stat().st_size > 1000


def test_unavailable_cuda_says_why() -> None:
    ok, why = CudaRuntime.available()
    if ok:
        pytest.skip(f"a CUDA device answers here: {why}")
    assert why  # e.g. "CuPy is not installed" or "no CUDA device answers"
