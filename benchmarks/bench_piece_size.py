"""Benchmark (issue 24): a streamed file pass against the piece size and the read method.

BF + ADF + CoM through the embedded default on the ``.npy`` of
``bench_default_vs_process.py`` (2 GiB, page-cached), every piece size and
read method once per round in shuffled order; medians of the rounds, with
the chunk records' summed read, hash and kernel thread-seconds.  With
``--map-sizes``, the map also with pieces of ``--sizes``' first value and
each mapped piece size (``map_piece_mib``: what a pass maps at a time where
the kernel carries the digest, docs/digest-in-kernel.md).

    python benchmarks/bench_piece_size.py --sizes 0.5,1,2,4,8 --methods pread,mmap --rounds 3
    python benchmarks/bench_piece_size.py --sizes 2 --methods pread,mmap \
        --map-sizes 4,8,16,32,64 --rounds 7
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--npy", type=Path, default=Path("/tmp/qf-bench14/data_256x256x128x128.npy"))
    ap.add_argument("--sizes", default="0.5,1,2,4,8", help="piece sizes, MiB")
    ap.add_argument("--methods", default="pread,mmap")
    ap.add_argument(
        "--map-sizes",
        default="",
        help="mapped piece sizes, MiB (map_piece_mib; the map with pieces of --sizes' first)",
    )
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_read_method import _ops  # BF + ADF + CoM, as every issue-24 benchmark runs it

    import quantem_flow as qf

    ds = qf.open(a.npy)
    ops = _ops(ds, ds.shape[2])
    sizes = [float(x) for x in a.sizes.split(",")]
    # (stream_piece_mib, map_piece_mib, read_method); map_piece_mib equal to the piece: the
    # map reads cache-sized pieces as before
    modes = [(size, size, method) for size in sizes for method in a.methods.split(",")]
    modes += [(sizes[0], float(m), "mmap") for m in a.map_sizes.split(",") if m]
    modes = list(dict.fromkeys(modes))

    def one(mode: tuple[float, float, str]) -> tuple[float, ...]:
        size, mapped, method = mode
        with qf.config.set(stream_piece_mib=size, map_piece_mib=mapped, read_method=method):
            t = time.perf_counter()
            out = qf.compute(*ops, progress=False)
            dt = time.perf_counter() - t
        ex = out[0].provenance.execution
        pieces = {int(ch["streamed"]["piece_frames"]) for ch in ex["chunks"]}
        return (dt, ex["read_s_total"], ex["hash_s_total"], ex["kernel_s_total"], max(pieces))

    for mode in modes:  # warm-up: kernels, the worker's probes
        one(mode)
    res: dict[tuple[float, float, str], list[tuple[float, ...]]] = {m: [] for m in modes}
    for _ in range(a.rounds):
        random.shuffle(modes)
        for mode in modes:
            res[mode].append(one(mode))
    report = []
    for (size, mapped, method), v in sorted(res.items()):
        med = [statistics.median(x[i] for x in v) for i in range(4)]
        rates = sorted(ds.nbytes / x[0] / 1e9 for x in v)
        frames = v[0][4]
        print(
            f"{size:4} MiB {method:5s} (mapped {mapped:4} MiB; pieces of {frames} frames) "
            f"{med[0]:.3f} s = {ds.nbytes / med[0] / 1e9:5.2f} GB/s "
            f"({rates[0]:.2f}-{rates[-1]:.2f}); "
            f"read {med[1]:.3f} hash {med[2]:.3f} kernel {med[3]:.3f} thread-s"
        )
        report.append(
            {
                "stream_piece_mib": size,
                "map_piece_mib": mapped,
                "read_method": method,
                "piece_frames": frames,
                "GBps_median": ds.nbytes / med[0] / 1e9,
                "GBps_per_round": [round(r, 3) for r in rates],
            }
        )
    if a.json:
        a.json.write_text(json.dumps({"rounds": a.rounds, "modes": report}, indent=1))


if __name__ == "__main__":
    main()
