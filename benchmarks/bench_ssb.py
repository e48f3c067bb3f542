"""Benchmark: single-sideband ptychography, time and peak memory, against FFT throughput.

Run from the repository root::

    python benchmarks/bench_ssb.py                  # 128x128 and 256x256 scans, 128x128 detector
    python benchmarks/bench_ssb.py --scans 64       # a quick run

Data (written once to ``bench-data/``, git-ignored): a weak phase object
(smooth random phase, 0.3 rad peak, band-limited inside the SSB band),
a 20 mrad probe at 300 kV with C10 = 50 Å, scan step = one object pixel,
the probe window = the 128 x 128 detector (BF disk radius 16.3 px);
intensities are rounded to u16 counts (about 1000 counts per BF pixel, no
Poisson noise).  The object is periodic over the scan.

Each configuration runs in a fresh subprocess so that its peak RSS is its own:

* ``ssb``: ``qf.compute(ssb(...), client="synchronous")`` from the ``.npy``
  (the gather pass over the whole file, then the SSB stage);
* ``ssb (memmap)``: the same with ``gather_memory_mib=0``: the gathered
  pixels go to a disk-backed memory map and the SSB stage reads it block by
  block;
* ``fft alone``: the same number of scan-sized real FFTs (``scipy.fft.rfft2``
  on float64, in blocks of ``pixel_block``, all cores), nothing else: the
  machine's FFT throughput for this workload, measured in the same run.

Printed: the table, with the SSB stage's FFT+accumulation time over the
FFT-alone time, and the phase correlation with the truth (a sanity check).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import quantem_flow as qf  # noqa: E402
from quantem_flow.calibration import electron_wavelength_angstrom  # noqa: E402
from quantem_flow.operators.ssb import ssb  # noqa: E402

DATA_DIR = ROOT / "bench-data"
KV = 300.0
ALPHA_MRAD = 20.0
ALPHA_PX = 16.3
C10 = 50.0


def geometry(det: int) -> dict[str, float]:
    lam = electron_wavelength_angstrom(KV)
    dk = ALPHA_MRAD * 1e-3 / lam / ALPHA_PX
    return {"lam": lam, "dk": dk, "dx": 1.0 / (det * dk), "det_mrad": lam * dk * 1e3}


def calibration(det: int) -> qf.Calibration:
    """The data's calibration: scan step in Å, detector pixels in mrad, the voltage."""
    g = geometry(det)
    return qf.Calibration(
        scan_sampling=g["dx"],
        scan_units="Å",
        detector_sampling=g["det_mrad"],
        detector_units="mrad",
        accelerating_voltage_kV=KV,
    )


def generate(scan: int, det: int, seed: int = 11) -> tuple[Path, Path]:
    """Write the dataset (u16 .npy) and its true phase (once)."""
    DATA_DIR.mkdir(exist_ok=True)
    stem = DATA_DIR / f"ssb_{scan}x{scan}x{det}x{det}_u16"
    npy, truth_path = stem.with_suffix(".npy"), Path(f"{stem}_phase.npy")
    if npy.exists() and truth_path.exists():
        return npy, truth_path
    g = geometry(det)
    rng = np.random.default_rng(seed)
    k = np.fft.fftfreq(scan, d=g["dx"])
    kr, kc = np.meshgrid(k, k, indexing="ij")
    kmax = 1.6 * ALPHA_PX * g["dk"]  # inside 2 alpha / lambda
    filt = np.exp(-(kr**2 + kc**2) / (2 * (kmax / 2.5) ** 2)) * (np.hypot(kr, kc) < kmax)
    phi = np.fft.ifft2(np.fft.fft2(rng.standard_normal((scan, scan))) * filt).real
    phi -= phi.mean()
    phi *= 0.3 / np.abs(phi).max()
    obj = np.exp(1j * phi)
    kd = np.fft.fftfreq(det, d=g["dx"])
    dr, dc = np.meshgrid(kd, kd, indexing="ij")
    th2 = (g["lam"] * dr) ** 2 + (g["lam"] * dc) ** 2
    chi = 2 * math.pi / g["lam"] * C10 * th2 / 2
    probe = np.fft.fftshift(np.fft.ifft2((th2 < (ALPHA_MRAD * 1e-3) ** 2) * np.exp(-1j * chi)))
    # the window of scan position (i, j) starts det/2 before it (periodic object)
    ext = np.pad(obj, ((det // 2, det - det // 2), (det // 2, det - det // 2)), mode="wrap")
    windows = np.lib.stride_tricks.sliding_window_view(ext, (det, det))
    mm = np.lib.format.open_memmap(
        npy.with_suffix(".tmp.npy"), mode="w+", dtype=np.uint16, shape=(scan, scan, det, det)
    )
    scale = None
    for i in range(scan):
        psi = np.fft.fftshift(np.fft.fft2(windows[i, :scan] * probe[None]), axes=(-2, -1))
        inten = np.abs(psi) ** 2
        if scale is None:
            scale = 1000.0 * (th2 < (ALPHA_MRAD * 1e-3) ** 2).sum() / inten[0].sum()
        mm[i] = np.rint(inten * scale).astype(np.uint16)
    mm.flush()
    del mm
    os.replace(npy.with_suffix(".tmp.npy"), npy)
    np.save(truth_path, phi)
    return npy, truth_path


def correlation(a: np.ndarray, b: np.ndarray) -> float:
    a = a - a.mean()
    b = b - b.mean()
    return float((a * b).sum() / math.sqrt((a * a).sum() * (b * b).sum()))


def one(kind: str, scan: int, det: int, pixel_block: int, backend: str) -> dict[str, Any]:
    """One configuration (run in its own subprocess)."""
    npy, truth_path = generate(scan, det)
    if kind == "fft":
        meta = json.loads(os.environ["BENCH_SSB_NPIX"])
        n_pix = int(meta)
        import scipy.fft

        rng = np.random.default_rng(0)
        block = rng.standard_normal((min(pixel_block, n_pix), scan, scan))
        scipy.fft.rfft2(block[:1], axes=(-2, -1), workers=os.cpu_count())  # plan warm-up
        t = time.perf_counter()
        for b0 in range(0, n_pix, pixel_block):
            nb = min(pixel_block, n_pix - b0)
            scipy.fft.rfft2(block[:nb], axes=(-2, -1), workers=os.cpu_count())
        seconds = time.perf_counter() - t
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        return {"fft_alone_s": seconds, "n_fft": n_pix, "peak_rss_bytes": rss}
    ds = qf.open(npy, calibration=calibration(det))
    lazy = ssb(
        ds,
        voltage_kV=KV,
        semiangle_mrad=ALPHA_MRAD,
        defocus_A=C10,
        pixel_block=pixel_block,
        backend=backend,
        allow_complex64=backend == "mps",
    )
    limit = 0.0 if kind == "memmap" else 1024.0
    t = time.perf_counter()
    with qf.config.set(gather_memory_mib=limit, progress=False):
        (res,) = qf.compute(lazy, client="synchronous")
    total = time.perf_counter() - t
    p, tm = res.provenance.parameters, res.provenance.timings
    truth = np.load(truth_path)
    return {
        "total_s": total,
        "pass_s": tm["pass_s"],
        "ssb_stage_s": tm["ssb_stage_s"],
        "ssb_read_s": tm["ssb_read_s"],
        "ssb_fft_accumulate_s": tm["ssb_fft_accumulate_s"],
        "n_pixels": p["blocks"]["n_pixels"],
        "bytes_read": res.provenance.execution["bytes_read"],
        "dataset_bytes": ds.nbytes,
        "gathered": p["gathered"]["storage"],
        "gathered_bytes": p["gathered"]["nbytes"],
        "stage_peak_traced_bytes": p["memory"]["ssb_stage_peak_traced_bytes"],
        "block_spectra_bytes": p["memory"]["block_spectra_bytes"],
        "peak_rss_bytes": p["memory"]["process_peak_rss_bytes"],
        "loss": p["double_overlap_loss"],
        "correlation": correlation(res.phase, truth),
        "backend": p["ssb_backend"]["chosen"],
    }


def sub(kind: str, scan: int, args: argparse.Namespace, env: dict[str, str]) -> dict[str, Any]:
    cmd = [
        sys.executable,
        __file__,
        "--one",
        kind,
        "--scans",
        str(scan),
        "--det",
        str(args.det),
        "--pixel-block",
        str(args.pixel_block),
        "--backend",
        args.backend,
    ]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env={**os.environ, **env})
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scans", default="128,256", help="scan sizes (square), comma-separated")
    ap.add_argument("--det", type=int, default=128)
    ap.add_argument("--pixel-block", type=int, default=256)
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    scans = [int(s) for s in args.scans.split(",")]
    if args.one:
        print(json.dumps(one(args.one, scans[0], args.det, args.pixel_block, args.backend)))
        return
    print(
        f"# {platform.platform()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"NumPy {np.__version__}; backend={args.backend}, pixel_block={args.pixel_block}, "
        f"median of {args.repeat}"
    )
    rows: list[dict[str, Any]] = []
    for scan in scans:
        t = time.perf_counter()
        generate(scan, args.det)
        print(f"# data {scan}x{scan}x{args.det}x{args.det} ready ({time.perf_counter() - t:.1f} s)")
        runs: dict[str, list[dict[str, Any]]] = {"ssb": [], "memmap": [], "fft": []}
        for _ in range(args.repeat):
            for kind in ("ssb", "memmap"):
                runs[kind].append(sub(kind, scan, args, {}))
            npix = runs["ssb"][0]["n_pixels"]
            runs["fft"].append(sub("fft", scan, args, {"BENCH_SSB_NPIX": json.dumps(npix)}))
        fft_s = statistics.median(r["fft_alone_s"] for r in runs["fft"])
        for kind in ("ssb", "memmap"):
            rs = runs[kind]

            def med(key: str, rs: list[dict[str, Any]] = rs) -> float:
                return float(statistics.median(r[key] for r in rs))

            rows.append(
                {
                    "scan": f"{scan}x{scan}",
                    "mode": "ssb" if kind == "ssb" else "ssb (memmap)",
                    **{k: med(k) for k in rs[0] if isinstance(rs[0][k], (int, float))},
                    "gathered": rs[0]["gathered"],
                    "fft_alone_s": fft_s,
                    "fft_ratio": med("ssb_fft_accumulate_s") / fft_s,
                    "fft_peak_rss_bytes": statistics.median(
                        r["peak_rss_bytes"] for r in runs["fft"]
                    ),
                }
            )
    mib = 2**20
    head = (
        f"{'scan':>8} {'mode':>13} {'BF px':>6} {'data MiB':>9} {'total s':>8} {'pass s':>7} "
        f"{'SSB s':>6} {'read s':>7} {'FFT+acc s':>9} {'FFT alone s':>11} {'ratio':>6} "
        f"{'traced MiB':>10} {'RSS MiB':>8} {'corr':>6} {'loss':>7}"
    )
    print(head)
    for r in rows:
        print(
            f"{r['scan']:>8} {r['mode']:>13} {int(r['n_pixels']):>6} "
            f"{r['dataset_bytes'] / mib:>9.0f} {r['total_s']:>8.2f} {r['pass_s']:>7.2f} "
            f"{r['ssb_stage_s']:>6.2f} {r['ssb_read_s']:>7.2f} {r['ssb_fft_accumulate_s']:>9.2f} "
            f"{r['fft_alone_s']:>11.2f} {r['fft_ratio']:>6.2f} "
            f"{r['stage_peak_traced_bytes'] / mib:>10.1f} {r['peak_rss_bytes'] / mib:>8.0f} "
            f"{r['correlation']:>6.3f} {r['loss']:>7.4f}"
        )
    print(
        "# ratio = SSB FFT+accumulation / the same number of rfft2 alone; traced = host "
        "allocations in the SSB stage (tracemalloc); RSS = peak of the process (subprocess per run)"
    )


if __name__ == "__main__":
    main()
