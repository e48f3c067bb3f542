"""Encoded representation: decode throughput against h5py's filter pipeline, and codec ratios.

One file, Dectris layout (one bitshuffle + LZ4 chunk per frame), written by
this script from :func:`quantem_flow.synthetic.synthetic_dataset` (a probe
disk with Poisson noise; ``--dose`` sets the electrons per frame).  Timed on
one thread, medians of ``--repeat`` runs after a warm-up:

- h5py filter pipeline: ``dset.read_direct`` of every frame (read + decode);
- native chunk read: :meth:`Hdf5Source.read_payload` (``read_direct_chunk``,
  no decoding);
- our decode: :func:`decode_piece` over every piece (bitshuffle library,
  after checking the block lengths);
- fused pass (5 weight rows, sum and max): dense kernel on the decoded array
  against :func:`frame_pass_encoded` on the payload (decode inside the pass).

Then the compressed size of the same frames with each codec of
:meth:`Encoded.from_dense` and of ``quantem-flow convert`` (Zarr).

Usage::

    python benchmarks/bench_encoded.py --scan 64 64 --detector 128 128 --repeat 5
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np


def _median(fn: Callable[[], Any], repeat: int) -> float:
    fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    import h5py
    import hdf5plugin
    import numba

    import quantem_flow as qf
    from quantem_flow.io.hdf5 import Hdf5Source
    from quantem_flow.representations.encoded import Encoded, decode_piece
    from quantem_flow.runtimes.cpu import CpuRuntime
    from quantem_flow.runtimes.cpu.encoded_kernels import frame_pass_encoded
    from quantem_flow.synthetic import synthetic_dataset

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--scan", nargs=2, type=int, default=(64, 64))
    ap.add_argument("--detector", nargs=2, type=int, default=(128, 128))
    ap.add_argument("--dose", type=float, default=4000.0, help="electrons per frame")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--json", type=Path, help="write the figures here")
    args = ap.parse_args()
    numba.set_num_threads(1)

    data, _ = synthetic_dataset(
        scan_shape=tuple(args.scan),
        detector_shape=tuple(args.detector),
        dose_per_frame=args.dose,
        probe_radius_px=min(args.detector) / 8,
        dtype="uint16",
    )
    R, C, kr, kc = data.shape
    frames = data.reshape(R * C, kr, kc)
    nbytes = frames.nbytes
    out: dict[str, Any] = {
        "shape": [R, C, kr, kc],
        "dtype": "uint16",
        "dose_per_frame": args.dose,
        "mean_count": float(frames.mean()),
        "zero_fraction": float(np.mean(frames == 0)),
        "decoded_bytes": nbytes,
    }
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "dectris_like.h5"
        with h5py.File(path, "w") as f:
            f.create_dataset(
                "/entry/data/data",
                data=frames,
                chunks=(1, kr, kc),
                **hdf5plugin.Bitshuffle(cname="lz4"),
            )
        out["file_bytes"] = path.stat().st_size
        src = Hdf5Source(path, dataset_path="/entry/data/data", scan_shape=(R, C))
        dset = src._dset()
        dest = np.empty_like(frames)
        t_h5 = _median(lambda: dset.read_direct(dest), args.repeat)
        assert np.array_equal(dest, frames)
        t_read = _median(lambda: src.read_payload("encoded", (0, R), (0, C)), args.repeat)
        payload = src.read_payload("encoded", (0, R), (0, C))
        buf = np.empty((1, kr, kc), dtype=np.uint16)

        def decode_all() -> None:
            for i in range(payload.n_pieces):
                decode_piece(payload, i, out=buf)

        t_dec = _median(decode_all, args.repeat)
        assert np.array_equal(Encoded().to_dense(payload).reshape(frames.shape), frames)
        yy, xx = np.mgrid[:kr, :kc]
        r = np.hypot(yy - kr / 2, xx - kc / 2)
        w = np.stack(
            [r < kr / 8, (r > kr / 4) & (r < kr / 2), yy * (r < kr / 8), xx * (r < kr / 8), r]
        ).astype(np.float64)
        w = w.reshape(5, -1)
        rt = CpuRuntime()
        flat = frames.reshape(R * C, -1)
        t_dense = _median(lambda: rt.frame_pass(flat, w, want_sum=True, want_max=True), args.repeat)
        t_enc = _median(
            lambda: frame_pass_encoded(payload, w, want_sum=True, want_max=True), args.repeat
        )
        a = rt.frame_pass(flat, w, want_sum=True, want_max=True)
        b = frame_pass_encoded(payload, w, want_sum=True, want_max=True)
        assert np.array_equal(a.per_frame, b.per_frame)
        assert np.array_equal(a.pattern_sum, b.pattern_sum)
        assert np.array_equal(a.pattern_max, b.pattern_max)
        gb = nbytes / 1e9
        out["timings_s"] = {
            "h5py_filter_pipeline_read_decode": t_h5,
            "native_read_direct_chunk": t_read,
            "our_decode_pieces": t_dec,
            "dense_fused_pass_on_decoded": t_dense,
            "encoded_fused_pass_decode_inside": t_enc,
        }
        out["decoded_GB_per_s"] = {
            "h5py_filter_pipeline_read_decode": gb / t_h5,
            "our_read_plus_decode": gb / (t_read + t_dec),
            "our_decode_only": gb / t_dec,
            "dense_fused_pass": gb / t_dense,
            "encoded_fused_pass": gb / t_enc,
            "h5py_decode_then_dense_pass": gb / (t_h5 + t_dense),
        }
        out["payload_bytes"] = payload.nbytes
        ratios: dict[str, float] = {}
        block = data
        for codec in ("bitshuffle-lz4", "bitshuffle-zstd", "zstd", "lz4"):
            p = Encoded().from_dense(block, codec=codec)
            ratios[f"from_dense {codec}"] = nbytes / p.compressed_nbytes
        ratios["dectris file (bitshuffle-lz4, 1 frame/chunk)"] = nbytes / payload.compressed_nbytes
        ds = qf.open(path, dataset_path="/entry/data/data", scan_shape=(R, C))
        from quantem_flow.convert import convert
        from quantem_flow.io.base import path_size

        for codec in ("bitshuffle-lz4", "bitshuffle-zstd", "zstd", "lz4"):
            z = convert(ds, Path(tmp) / f"{codec}.zarr", codec=codec)
            ratios[f"convert zarr {codec}"] = nbytes / path_size(z)
        out["compression_ratio"] = ratios
    print(json.dumps(out, indent=2))
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
