"""Benchmark (issue 24): a streamed file pass against the piece size and the read method.

BF + ADF + CoM through the embedded default on the ``.npy`` of
``bench_default_vs_process.py`` (2 GiB, page-cached), every piece size and
read method once per round, interleaved; medians of the rounds, with the
chunk records' summed read, hash and kernel thread-seconds.

    python benchmarks/bench_piece_size.py --sizes 0.5,1,2,4,8 --methods pread,mmap --rounds 3
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--npy", type=Path, default=Path("/tmp/qf-bench14/data_256x256x128x128.npy"))
    ap.add_argument("--sizes", default="0.5,1,2,4,8", help="piece sizes, MiB")
    ap.add_argument("--methods", default="pread,mmap")
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    import quantem_flow as qf

    ds = qf.open(a.npy)
    k = ds.shape[2]
    c = (k / 2, k / 2)
    ops = [
        qf.virtual_bf(ds, radius=k / 6, center=c),
        qf.virtual_adf(ds, inner=k / 4, outer=k / 2, center=c),
        qf.center_of_mass(ds, center=c),
    ]
    qf.compute(*ops, progress=False)
    sizes = [float(x) for x in a.sizes.split(",")]
    methods = a.methods.split(",")
    res: dict[tuple[float, str], list[tuple[float, ...]]] = {}
    for _ in range(a.rounds):
        for size in sizes:
            for method in methods:
                with qf.config.set(stream_piece_mib=size, read_method=method):
                    t = time.perf_counter()
                    out = qf.compute(*ops, progress=False)
                    dt = time.perf_counter() - t
                ex = out[0].provenance.execution
                res.setdefault((size, method), []).append(
                    (dt, ex["read_s_total"], ex["hash_s_total"], ex["kernel_s_total"])
                )
    for (size, method), v in res.items():
        med = [statistics.median(x[i] for x in v) for i in range(4)]
        print(
            f"{size:4} MiB {method:5s} {med[0]:.3f} s = {ds.nbytes / med[0] / 1e9:5.2f} GB/s; "
            f"read {med[1]:.3f} hash {med[2]:.3f} kernel {med[3]:.3f} thread-s"
        )


if __name__ == "__main__":
    main()
