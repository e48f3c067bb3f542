"""What the content digest costs against the pass (issue 12, item 8).

Writes a 512 MiB uint16 ``.npy`` (128 x 128 scan of 128 x 128 frames) and
measures, in ONE process on a warm page cache:

- xxh3_128 and xxh3_64 over one 128 MiB chunk (as the chunk task hashes it:
  one digest per scan row), against ``np.sum`` and a copy of the same block
  (memory ceilings);
- a BF + ADF + CoM pass (``client="synchronous"``, CPU runtime): the sums of
  the per-chunk ``read_s``, ``hash_s``, ``compile_s`` and ``kernel_s`` and
  the pass wall time, so the hashing share of the pass is read off directly;
- xxh3_128 over the compressed bytes of the same chunk held ``encoded``
  (bitshuffle + LZ4).

The first pass of the process also shows chunk 0's JIT time (``compile_s``)
apart from its ``kernel_s``.  Medians of ``--repeat`` runs after one warm-up.
Usage: ``python benchmarks/bench_content_digest.py DIR [--repeat N] [--json FILE]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import xxhash


def _median_s(fn: Callable[[], Any], repeat: int) -> float:
    fn()
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    """Run the measurements and print a table (and write JSON when asked)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("directory", type=Path)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    import quantem_flow as qf
    from quantem_flow.graphs.digest import payload_digests
    from quantem_flow.representations import get_representation

    rng = np.random.default_rng(8)
    path = args.directory / "bench_digest.npy"
    scan, det = (128, 128), (128, 128)
    arr = np.lib.format.open_memmap(path, mode="w+", dtype=np.uint16, shape=(*scan, *det))
    for r in range(scan[0]):
        arr[r] = rng.poisson(3.0, size=(scan[1], *det)).astype(np.uint16)
    arr.flush()
    del arr
    out: dict[str, Any] = {"dataset": {"shape": [*scan, *det], "dtype": "uint16"}}

    ds = qf.open(path, chunk_rows=32)  # 4 chunks of 128 MiB
    lazy = [
        qf.virtual_bf(ds, radius=14, center=(64, 64)),
        qf.virtual_adf(ds, inner=28, outer=60, center=(64, 64)),
        qf.center_of_mass(ds, center=(64, 64)),
    ]

    def one_pass() -> dict[str, Any]:
        t = time.perf_counter()
        bf, *_ = qf.compute(*lazy, client="synchronous", backend="cpu")
        wall = time.perf_counter() - t
        ex = bf.provenance.execution
        return {
            "wall_s": wall,
            "pass_s": bf.provenance.timings["pass_s"],
            "read_s": ex["read_s_total"],
            "hash_s": ex["hash_s_total"],
            "compile_s": ex["compile_s_total"],
            "kernel_s": ex["kernel_s_total"],
            "digest": ex["content_digest"]["digest"],
            "chunks": [
                {k: r[k] for k in ("chunk", "read_s", "hash_s", "compile_s", "kernel_s")}
                for r in ex["chunks"]
            ],
        }

    first = one_pass()  # the process's first pass: JIT compile (or cache load) on chunk 0
    out["first_pass_chunks"] = first["chunks"]
    passes = [one_pass() for _ in range(args.repeat)]
    assert len({p["digest"] for p in [first, *passes]}) == 1
    pass_med = {
        k: statistics.median(p[k] for p in passes)
        for k in ("wall_s", "pass_s", "read_s", "hash_s", "kernel_s")
    }
    out["pass"] = pass_med
    out["digest"] = first["digest"]

    block = np.load(path, mmap_mode="r")[:32]
    block = np.array(block)  # 128 MiB in memory
    nbytes = block.nbytes
    hash_128 = _median_s(lambda: payload_digests("dense", block, (0, 32)), args.repeat)
    hash_64 = _median_s(
        lambda: [xxhash.xxh3_64_hexdigest(block[i]) for i in range(32)], args.repeat
    )
    np_sum = _median_s(lambda: block.sum(dtype=np.uint64), args.repeat)
    dst = np.empty_like(block)
    copy = _median_s(lambda: np.copyto(dst, block), args.repeat)
    enc = get_representation("encoded").from_dense(block)
    enc_s = _median_s(lambda: payload_digests("encoded", enc, (0, 32)), args.repeat)
    out["block"] = {
        "bytes": nbytes,
        "xxh3_128_per_row_s": hash_128,
        "xxh3_64_per_row_s": hash_64,
        "np_sum_s": np_sum,
        "copy_s": copy,
        "encoded_compressed_bytes": int(enc.compressed_nbytes),
        "encoded_xxh3_128_s": enc_s,
    }

    def gbs(n: float, s: float) -> str:
        return f"{n / s / 1e9:6.2f} GB/s"

    print(f"128 MiB block: xxh3_128 per row {hash_128:.4f} s = {gbs(nbytes, hash_128)}")
    print(f"               xxh3_64 per row  {hash_64:.4f} s = {gbs(nbytes, hash_64)}")
    print(f"               np.sum (u64)     {np_sum:.4f} s = {gbs(nbytes, np_sum)}")
    print(f"               copy             {copy:.4f} s = {gbs(nbytes, copy)}")
    print(
        f"encoded chunk: {enc.compressed_nbytes / 2**20:.1f} MiB compressed, xxh3_128 "
        f"{enc_s:.4f} s = {gbs(enc.compressed_nbytes, enc_s)}"
    )
    pm = pass_med
    print(
        f"pass (512 MiB, 4 chunks, synchronous): pass {pm['pass_s']:.3f} s, read "
        f"{pm['read_s']:.3f} s, hash {pm['hash_s']:.3f} s "
        f"({100 * pm['hash_s'] / pm['pass_s']:.1f} % of the pass), kernel {pm['kernel_s']:.3f} s"
    )
    for r in first["chunks"]:
        print(
            f"first pass chunk {r['chunk']}: compile {r['compile_s']:.3f} s, kernel "
            f"{r['kernel_s']:.3f} s, hash {r['hash_s']:.4f} s"
        )
    if args.json is not None:
        args.json.write_text(json.dumps(out, indent=2))
    path.unlink()


if __name__ == "__main__":
    main()
