"""K2 IS on the camera's geometry: opening and ``read_frames`` throughput.

Writes ``--frames`` frames of 1860 x 2048 in 930 x 16 blocks (the camera's
0x5758-byte blocks) with the independent test writer, then times opening and
reading them four frames at a time (best of ``--repeat``).

    python benchmarks/bench_k2is_unpack.py /tmp/k2cam --frames 32
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    from quantem_flow.io.k2is import K2isSource
    from tests.io.writers_k2is import write_k2is

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scratch", type=Path)
    parser.add_argument("--frames", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    n = args.frames - args.frames % 4
    args.scratch.mkdir(parents=True, exist_ok=True)
    gtg = args.scratch / "capture.gtg"
    if not gtg.exists():
        frames = (np.arange(n * 1860 * 2048, dtype=np.uint32) % 4096).astype(np.uint16)
        write_k2is(args.scratch, frames.reshape(n, 1860, 2048), block=(930, 16))
    opens = []
    for _ in range(5):
        t = time.perf_counter()
        source = K2isSource(gtg, scan_shape=(1, n))
        opens.append(time.perf_counter() - t)
    source.read_frames(0, 4)  # compile
    reads = []
    for _ in range(args.repeat):
        t = time.perf_counter()
        for a in range(0, n, 4):
            source.read_frames(a, a + 4)
        reads.append(time.perf_counter() - t)
    decoded = n * 1860 * 2048 * 2
    print(
        json.dumps(
            {
                "frames": n,
                "open_ms_median": round(1e3 * statistics.median(opens), 2),
                "read_s_best": round(min(reads), 3),
                "decoded_gib_per_s": round(decoded / min(reads) / 2**30, 2),
            }
        )
    )


if __name__ == "__main__":
    main()
