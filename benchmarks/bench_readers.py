"""Open time and bright-field throughput of every registered reader (issue 15).

For each format registered in :mod:`quantem_flow.io` (built-in tables and
``quantem_flow.readers`` entry points) that a test writer in
``tests/io/writers*.py`` can produce, writes a 256 x 256 scan with a small
detector (``--detector``, default 64 x 64; EMPAD is always 128 x 128 float32)
under a scratch directory, then measures:

- ``open_ms``: ``qf.open(path)`` (metadata only, format detected by content),
  median of 5, page cache warm; ``open_format_given_ms`` the same with
  ``format=`` given (no detection);
- ``bf_s``: ``qf.compute(qf.virtual_bf(ds, radius=k/8, center=(k/2, k/2)),
  client="synchronous")`` (one pass over every frame, in this process, no
  cluster), best of 3 after a first pass; throughput in decoded GiB/s and in
  frames/s.  The BF kernels are compiled (JIT) for the common dtypes before
  any format is measured, and every file was just written, so the first pass
  reads from the page cache too.

Each file is deleted after its measurement.  Formats that are registered
but have no writer here are listed as skipped, with why.

Usage: ``python benchmarks/bench_readers.py SCRATCH_DIR [--detector 64] [--scan 256]
[--formats npy,hdf5,...] [--json out.json]``.
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the test writers live in tests/io

Maker = Callable[[Path, int, int], tuple[Path, dict[str, Any], str]]


def _pattern(scan: int, k: int, dtype: str) -> np.ndarray:
    """A probe disk on a weak background, varying a little per position."""
    rr, cc = np.mgrid[:k, :k]
    disk = ((rr - k / 2) ** 2 + (cc - k / 2) ** 2 <= (k / 6) ** 2).astype(np.float32)
    frame = 2 + 100 * disk
    a = np.empty((scan, scan, k, k), dtype=dtype)
    for r in range(scan):
        a[r] = (frame + (np.arange(scan) % 7)[:, None, None]).astype(dtype)
    return a


def _npy(d: Path, s: int, k: int) -> tuple[Path, dict[str, Any], str]:
    from tests.io import writers

    return writers.write_npy(d / "b.npy", _pattern(s, k, "uint16")), {}, "uint16, 4-D"


def _raw(d: Path, s: int, k: int) -> tuple[Path, dict[str, Any], str]:
    from tests.io import writers

    p = writers.write_raw(d / "b.raw", _pattern(s, k, "uint16").reshape(-1, k, k), dtype="<u2")
    opts = {"format": "raw", "dtype": "<u2", "frame_shape": (k, k), "scan_shape": (s, s)}
    return p, opts, "uint16, format= given"


def _hdf5(d: Path, s: int, k: int) -> tuple[Path, dict[str, Any], str]:
    from tests.io import writers

    p = writers.write_hdf5(d / "b.h5", _pattern(s, k, "uint16"), dataset_path="/data")
    return p, {}, "uint16, 4-D, bitshuffle+LZ4 chunks"


def _dectris(d: Path, s: int, k: int) -> tuple[Path, dict[str, Any], str]:
    from tests.io import writers

    frames = _pattern(s, k, "uint16").reshape(-1, k, k)
    p = writers.write_dectris(d, "b", frames, frames_per_file=10000)
    return p, {"scan_shape": (s, s)}, "uint16, bitshuffle+LZ4, 1 frame/chunk"


def _zarr(d: Path, s: int, k: int) -> tuple[Path, dict[str, Any], str]:
    from tests.io import writers

    p = writers.write_zarr(d / "b.zarr", _pattern(s, k, "uint16"), chunks=(8, s, k, k))
    return p, {}, "uint16, 4-D, blosc"


def _empad(d: Path, s: int, k: int) -> tuple[Path, dict[str, Any], str]:
    from tests.io import writers

    # The XML from the writer; the raw file (4 GiB at 256 x 256) written here in blocks.
    xml = writers.write_empad(d, "b", np.zeros((1, 1, 128, 128), np.float32))
    xml.write_text(
        xml.read_text()
        .replace(">1</scan_resolution_x>", f">{s}</scan_resolution_x>")
        .replace(">1</scan_resolution_y>", f">{s}</scan_resolution_y>")
    )
    block = _pattern(1, 128, "float32")[0, 0]
    rec = np.zeros((s, 130, 128), "<f4")
    rec[:, :128] = block
    with open(d / "b.raw", "wb") as f:
        for _ in range(s):
            f.write(rec.tobytes())
    return xml, {}, "float32 128 x 128 (fixed)"


def _mib(d: Path, s: int, k: int) -> tuple[Path, dict[str, Any], str]:
    from tests.io import writers

    frames = _pattern(s, k, "uint16").reshape(-1, k, k)
    return writers.write_mib(d / "b.mib", frames, depth="U16"), {"scan_shape": (s, s)}, "U16"


def _counted(d: Path, s: int, k: int) -> tuple[Path, dict[str, Any], str]:
    from tests.io import writers

    rng = np.random.default_rng(0)
    events = [rng.integers(0, k * k, size=16, dtype=np.uint32) for _ in range(s * s)]
    p = writers.write_stempy(d / "b.h5", events, (s, s), (k, k))
    return p, {}, "16 events per frame (paired)"


def _raw_csr(d: Path, s: int, k: int) -> tuple[Path, dict[str, Any], str]:
    from tests.io.writers_raw_csr import write_raw_csr

    rng = np.random.default_rng(0)
    frames = np.zeros((s * s, k, k), dtype=np.uint16)
    flat = frames.reshape(s * s, k * k)
    for f in range(s * s):  # 16 counted electrons per frame, as the counted row
        np.add.at(flat[f], rng.integers(0, k * k, size=16), 1)
    return write_raw_csr(d, frames, nav_shape=(s, s)), {}, "16 events per frame (paired)"


def _seq(d: Path, s: int, k: int) -> tuple[Path, dict[str, Any], str]:
    from tests.io.writers_seq import write_seq

    frames = _pattern(s, k, "uint16").reshape(-1, k, k)
    return write_seq(d / "b.seq", frames), {"scan_shape": (s, s)}, "uint16, timestamps between"


def _frms6(d: Path, s: int, k: int) -> tuple[Path, dict[str, Any], str]:
    from tests.io.writers_frms6 import write_frms6

    frames = _pattern(s, k, "uint16").reshape(-1, k, k)
    hdr = write_frms6(d, frames, frames[:8], stem_image_size=(s, s), per_file=8192)
    return hdr, {}, "uint16, unfolded from the readout"


def _k2is(d: Path, s: int, k: int) -> tuple[Path, dict[str, Any], str]:
    from tests.io.writers_k2is import write_k2is

    frames = (_pattern(s, k, "uint16") % 4096).reshape(-1, k, k)
    gtg = write_k2is(d, frames, block=(k // 2, k // 8 // 2))  # 8 sectors, 4 blocks each
    return gtg, {"scan_shape": (s, s)}, "12-bit, 8 sectors, header-declared geometry"


def _blockfile(d: Path, s: int, k: int) -> tuple[Path, dict[str, Any], str]:
    from tests.io.writers_blockfile import write_blockfile

    return write_blockfile(d / "b.blo", _pattern(s, k, "uint8")), {}, "uint8"


def _ser(d: Path, s: int, k: int) -> tuple[Path, dict[str, Any], str]:
    from tests.io.writers_ser import write_emi, write_ser

    p = write_ser(d / "b_1.ser", _pattern(s, k, "uint16"))
    write_emi(d / "b.emi")
    return p, {}, "uint16"


def _tvips(d: Path, s: int, k: int) -> tuple[Path, dict[str, Any], str]:
    from tests.io.writers_tvips import write_tvips

    frames = _pattern(s, k, "uint16").reshape(-1, k, k)
    return write_tvips(d, "b", frames, frames_per_file=20000), {"scan_shape": (s, s)}, "uint16"


def _mrc(d: Path, s: int, k: int) -> tuple[Path, dict[str, Any], str]:
    from tests.io.writers_mrc import write_mrc

    frames = _pattern(s, k, "uint16").reshape(-1, k, k)
    return write_mrc(d / "b.mrc", frames), {"scan_shape": (s, s)}, "uint16"


def _dm4(d: Path, s: int, k: int) -> tuple[Path, dict[str, Any], str]:
    from tests.io.writers_dm4 import write_dm4_4d

    return write_dm4_4d(d / "b.dm4", _pattern(s, k, "uint16")), {}, "uint16"


def _emd(d: Path, s: int, k: int) -> tuple[Path, dict[str, Any], str]:
    from tests.io.writers_emd import write_emd

    a = _pattern(s, k, "uint16")
    return write_emd(d / "b.emd", a, chunks=(1, s, k, k)), {}, "uint16, EMD 1.0, row chunks"


def _velox(d: Path, s: int, k: int) -> tuple[Path, dict[str, Any], str]:
    from tests.io.writers_velox import write_velox

    p = write_velox(d / "b.emd", _pattern(s, k, "uint16"), chunks=True)
    return p, {}, "uint16, (k_r, k_c, frames) frame chunks"


#: Format name -> how the benchmark writes a file of it (with the test writers).
MAKERS: dict[str, Maker] = {
    "npy": _npy,
    "raw": _raw,
    "hdf5": _hdf5,
    "dectris": _dectris,
    "zarr": _zarr,
    "empad": _empad,
    "mib": _mib,
    "counted": _counted,
    "raw_csr": _raw_csr,
    "seq": _seq,
    "frms6": _frms6,
    "k2is": _k2is,
    "blockfile": _blockfile,
    "ser": _ser,
    "tvips": _tvips,
    "mrc": _mrc,
    "dm4": _dm4,
    "emd": _emd,
    "velox": _velox,
}


def measure(fmt: str, maker: Maker, scratch: Path, scan: int, k: int) -> dict[str, Any]:
    """Write one file, time opening it and a bright-field pass, delete it."""
    import quantem_flow as qf

    d = scratch / fmt
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    try:
        t = time.perf_counter()
        path, opts, what = maker(d, scan, k)
        write_s = time.perf_counter() - t
        opens = []
        for _ in range(5):
            t = time.perf_counter()
            ds = qf.open(path, **opts)
            opens.append(time.perf_counter() - t)
        if ds.source.format != fmt:
            raise AssertionError(f"opened as {ds.source.format!r}, not {fmt!r}")
        given = []
        for _ in range(5):
            t = time.perf_counter()
            qf.open(path, **{"format": fmt, **opts})
            given.append(time.perf_counter() - t)
        kr, kc = ds.detector_shape
        bf = qf.virtual_bf(ds, radius=min(kr, kc) / 8, center=(kr / 2, kc / 2))
        t = time.perf_counter()
        (first,) = qf.compute(bf, client="synchronous")
        first_s = time.perf_counter() - t
        runs = []
        for _ in range(3):
            t = time.perf_counter()
            qf.compute(bf, client="synchronous")
            runs.append(time.perf_counter() - t)
        best = min(runs)
        size = sum(f.stat().st_size for f in d.rglob("*") if f.is_file())
        frames = ds.shape[0] * ds.shape[1]
        return {
            "format": fmt,
            "data": what,
            "shape": list(ds.shape),
            "dtype": str(ds.dtype),
            "representation": ds.representation,
            "file_mib": round(size / 2**20, 1),
            "decoded_mib": round(ds.nbytes / 2**20, 1),
            "write_s": round(write_s, 2),
            "open_ms": round(1e3 * statistics.median(opens), 2),
            "open_format_given_ms": round(1e3 * statistics.median(given), 2),
            "format_from": ds.describe()["format_from"],
            "bf_first_s": round(first_s, 3),
            "bf_best_s": round(best, 3),
            "bf_gib_per_s": round(ds.nbytes / 2**30 / best, 3),
            "bf_frames_per_s": round(frames / best),
            "bf_finite": bool(np.isfinite(first.data).all()),
        }
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _warm_up_kernels() -> None:
    """Compile the BF kernels of the common dtypes first, so no format pays the JIT."""
    import quantem_flow as qf

    for dtype in ("uint8", "uint16", "uint32", "float32", "int32"):
        ds = qf.open(np.ones((2, 3, 8, 8), dtype=dtype))
        qf.compute(qf.virtual_bf(ds, radius=2, center=(4, 4)), client="synchronous")


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark and print a Markdown table (and JSON with --json)."""
    from quantem_flow.io import reader_names

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("scratch", type=Path)
    ap.add_argument("--scan", type=int, default=256)
    ap.add_argument("--detector", type=int, default=64)
    ap.add_argument("--formats", default="", help="comma-separated subset")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    registered = [n for n in reader_names() if n != "memory"]
    _warm_up_kernels()
    wanted = [f for f in args.formats.split(",") if f] or registered
    results: list[dict[str, Any]] = []
    skipped: dict[str, str] = {}
    for fmt in wanted:
        if fmt not in registered:
            skipped[fmt] = "not a registered reader here"
            continue
        maker = MAKERS.get(fmt)
        if maker is None:
            skipped[fmt] = "no benchmark writer for it (add one to MAKERS)"
            continue
        try:
            res = measure(fmt, maker, args.scratch, args.scan, args.detector)
        except Exception as exc:  # one format failing does not stop the others
            skipped[fmt] = f"{type(exc).__name__}: {str(exc)[:200]}"
            print(f"{fmt}: skipped ({skipped[fmt]})", flush=True)
            continue
        results.append(res)
        print(json.dumps(res), flush=True)
    print()
    print(
        "| format | data | file MiB | open ms (detected) | open ms (format=) | BF first s "
        "| BF best s | GiB/s | frames/s |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        print(
            f"| {r['format']} | {r['data']} | {r['file_mib']} | {r['open_ms']} | "
            f"{r['open_format_given_ms']} | {r['bf_first_s']} | {r['bf_best_s']} | "
            f"{r['bf_gib_per_s']} | {r['bf_frames_per_s']} |"
        )
    for fmt, why in skipped.items():
        print(f"- {fmt}: skipped: {why}")
    if args.json is not None:
        doc = {
            "machine": {"platform": platform.platform(), "python": platform.python_version()},
            "scan": args.scan,
            "detector": args.detector,
            "results": results,
            "skipped": skipped,
        }
        args.json.write_text(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
