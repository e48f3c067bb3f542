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


def test_host_mirror_of_the_bslz4_kernels_matches_the_bitshuffle_library(
    tmp_path: Path,
) -> None:
    """The table + LZ4 + unshuffle steps the CUDA kernels take give the library's frames."""
    import numpy as np

    import quantem_flow as qf
    from quantem_flow.errors import CorruptChunkError
    from quantem_flow.runtimes.cuda.bslz4 import block_table, decode_host
    from tests.io.writers import write_dectris

    rng = np.random.default_rng()
    for dtype, det in ((np.uint16, (19, 23)), (np.uint32, (16, 16)), (np.uint8, (33, 9))):
        frames = rng.poisson(1.5, (12, *det)).astype(dtype)
        frames[0, 0, :3] = np.iinfo(dtype).max
        master = write_dectris(
            tmp_path,
            f"d{np.dtype(dtype).itemsize}",
            frames,
            frames_per_file=5,
            bit_depth=8 * np.dtype(dtype).itemsize,
        )
        ds = qf.open(master, scan_shape=(3, 4)).to_representation("encoded")
        payload, _ = ds.load_payload((0, 3))
        pieces = np.arange(payload.offsets.size - 1)
        decoded = decode_host(payload, pieces).reshape(-1, *det)
        np.testing.assert_array_equal(decoded, frames)  # the stored order is scan order here
        table = block_table(payload, pieces)
        assert table.src_off.size >= pieces.size and int(table.piece_out[-1]) == frames.nbytes
    # from_dense pieces holding several frames and odd element counts (raw tails)
    block = rng.poisson(3.0, (2, 3, 7, 9)).astype(np.uint16)
    from quantem_flow.representations import get_representation

    payload = get_representation("encoded").from_dense(block, codec="bitshuffle-lz4")
    pieces = np.arange(payload.offsets.size - 1)
    np.testing.assert_array_equal(decode_host(payload, pieces).reshape(block.shape), block)
    # a damaged block size is reported with its piece (LZ4 literals carry no checksum)
    bad = payload.data.copy()
    bad[12:16] = 0xFF
    import dataclasses

    damaged = dataclasses.replace(payload, data=bad)
    with pytest.raises(CorruptChunkError, match="piece 0"):
        decode_host(damaged, pieces)
