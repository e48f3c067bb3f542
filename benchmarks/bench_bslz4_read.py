"""Dense bitshuffle+LZ4 reads: h5py's filter, the old check-then-filter path, io/bslz4_read.py.

Reads the first ``--frames`` frames of the bitshuffle file written by
``bench_default_vs_process.py`` (one 128 x 128 uint16 frame per chunk),
page cache warm, interleaved per repeat:

* ``h5py``: ``read_direct`` through the HDF5 bitshuffle filter, unchecked;
* ``old``: every chunk checked (``check_bitshuffle_chunks``), then ``h5py``;
* ``new1``/``new2``: :func:`quantem_flow.io.bslz4_read.read_bitshuffle` on
  1 and 2 decode threads (each chunk read once, checked, decoded).

    python benchmarks/bench_bslz4_read.py /tmp/qf-bench14/data_256x256x128x128_bslz4.h5
"""

from __future__ import annotations

import argparse
import time

import numpy as np


def main() -> None:
    """Print GB/s per repeat of each read."""
    import h5py
    import hdf5plugin  # noqa: F401  (registers the filter)

    from quantem_flow.io import bslz4_read
    from quantem_flow.io.encoded_chunks import check_bitshuffle_chunks

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("path")
    p.add_argument("--frames", type=int, default=8192)
    p.add_argument("--repeats", type=int, default=4)
    a = p.parse_args()
    with h5py.File(a.path, "r") as f:
        d = f["data"]
        n = min(a.frames, d.shape[0])
        bounds = [(0, n), (0, d.shape[1]), (0, d.shape[2])]
        ref = np.empty((n, *d.shape[1:]), d.dtype)
        out = np.empty_like(ref)

        def h5() -> None:
            d.read_direct(ref, source_sel=np.s_[0:n])

        def old() -> None:
            check_bitshuffle_chunks(d, bounds, "bench")
            d.read_direct(ref, source_sel=np.s_[0:n])

        def new(threads: int) -> None:
            bslz4_read.read_bitshuffle(d, bounds, out, where="bench", threads=threads)

        runs = {"h5py": h5, "old": old, "new1": lambda: new(1), "new2": lambda: new(2)}
        for fn in runs.values():  # warm-up: plugin load, index, compilation
            fn()
        rates: dict[str, list[float]] = {k: [] for k in runs}
        for _ in range(a.repeats):
            for name, fn in runs.items():
                t = time.perf_counter()
                fn()
                rates[name].append(ref.nbytes / (time.perf_counter() - t) / 1e9)
        assert np.array_equal(out, ref)
    for name, v in rates.items():
        print(f"{name:>5}: GB/s {[round(x, 2) for x in v]} median {np.median(v):.2f}")


if __name__ == "__main__":
    main()
