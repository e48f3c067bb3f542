"""Reading a page-cached ``.npy`` with ``pread`` into a staging buffer (issue 11, item 1).

Writes 1 GiB of uint16 frames (32768 x 128 x 128) as a 3-D ``.npy`` and
reads it with ``ds.load_block`` in 32 MiB blocks into one reused buffer
(as chunk tasks do), then sums each block in uint64 (so a memory-mapped
read, which returns views, touches the data too); best of 3, page cache
warm.  Prints the throughput and this process's file-backed resident
memory afterwards.
Usage: ``python benchmarks/bench_npy_pread.py DIR``.
"""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

import numpy as np


def _rss_file_mib() -> float:
    text = Path("/proc/self/status").read_text()
    m = re.search(r"^RssFile:\s+(\d+) kB", text, re.MULTILINE)
    return int(m.group(1)) / 1024 if m else float("nan")


def main(directory: Path) -> None:
    """Write the file under ``directory`` and print the read throughput."""
    import quantem_flow as qf

    path = directory / "bench_pread.npy"
    arr = np.lib.format.open_memmap(path, mode="w+", dtype=np.uint16, shape=(32768, 128, 128))
    for i in range(0, 32768, 4096):
        arr[i : i + 4096] = i % 251
    arr.flush()
    del arr
    ds = qf.open(path, scan_shape=(128, 256))
    rows = 4  # 4 x 256 frames of 32 KiB = 32 MiB blocks
    buf = np.empty(ds.raw_block_shape((0, rows)), dtype=np.uint16)
    total = 0

    def run() -> float:
        nonlocal total
        t = time.perf_counter()
        for r in range(0, 128, rows):
            block = ds.load_block((r, r + rows), buffer=buf)
            total += int(block.sum(dtype=np.uint64))
        return time.perf_counter() - t

    run()
    best = min(run() for _ in range(3))
    size = path.stat().st_size / 2**30
    print(
        f"{size:.2f} GiB in {best:.3f} s = {size / best:.2f} GiB/s; "
        f"RssFile after: {_rss_file_mib():.0f} MiB"
    )
    path.unlink()


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "."))
