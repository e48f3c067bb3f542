"""Cost of checking bitshuffle chunks before the HDF5 filter decodes them (issue 11, item 2).

Writes 4096 Poisson(2) frames of 128 x 128 uint16 (128 MiB) as a 3-D HDF5
dataset chunked one frame per chunk with bitshuffle + LZ4, and reads it with
``ds.load_block`` in 8 blocks of 8 scan rows, with and without the check
(best of 3, page cache warm).  Usage: ``python benchmarks/bench_bitshuffle_guard.py DIR``.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np


def main(directory: Path) -> None:
    """Write the file under ``directory`` and print both timings."""
    import h5py
    import hdf5plugin

    import quantem_flow as qf
    from quantem_flow.io import encoded_chunks

    path = directory / "bitshuffle_guard.h5"
    frames = np.random.default_rng(0).poisson(2, size=(4096, 128, 128)).astype(np.uint16)
    with h5py.File(path, "w") as f:
        f.create_dataset(
            "data", data=frames, chunks=(1, 128, 128), **hdf5plugin.Bitshuffle(cname="lz4")
        )
    ds = qf.open(path, dataset_path="/data", scan_shape=(64, 64))

    def run() -> float:
        t = time.perf_counter()
        for r in range(0, 64, 8):
            ds.load_block((r, r + 8))
        return time.perf_counter() - t

    run()
    on = min(run() for _ in range(3))
    guard = encoded_chunks.needs_bitshuffle_guard
    encoded_chunks.needs_bitshuffle_guard = lambda layout: False  # type: ignore[assignment]
    try:
        off = min(run() for _ in range(3))
    finally:
        encoded_chunks.needs_bitshuffle_guard = guard  # type: ignore[assignment]
    print(f"checked {on:.3f} s, unchecked {off:.3f} s, overhead {100 * (on / off - 1):.0f} %")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "."))
