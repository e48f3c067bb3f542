"""SSB on the CUDA runtime against the CPU runtime, 256 x 256 and 512 x 512 scans (GPU machine).

The data are ``bench_ssb.py``'s (a weak phase object, 0.3 rad peak, 20 mrad
probe at 300 kV, C10 = 50 Å, 128 x 128 detector, about 1000 counts per
bright-field pixel), simulated here on the GPU with CuPy by the same formulas
so that a 512 x 512 scan (8.6 GB of u16) takes seconds instead of the CPU's
minutes, then held in host memory and opened with ``qf.open(array)``.

For each scan size and backend (``cuda``, ``cpu``): ``qf.compute(ssb(...),
client="synchronous")`` runs twice (cold: first in this process; warm: the
second), and the provenance's timings are printed: the gather pass over the
frames, the SSB stage (host gather to object), and its FFT + accumulation
part.  The phase must correlate with the truth (> 0.9) and the CUDA phase must
equal the CPU phase to 1e-9 rad.

Usage on the device machine: ``python3 benchmarks/bench_gpu_ssb.py --json OUT``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


def simulate_on_gpu(scan: int, det: int, seed: int = 11) -> tuple[np.ndarray, np.ndarray]:
    """``bench_ssb.generate``'s data, computed with CuPy; returns (u16 frames, true phase)."""
    import cupy as cp
    from bench_ssb import ALPHA_MRAD, ALPHA_PX, C10, geometry

    g = geometry(det)
    rng = np.random.default_rng(seed)
    k = np.fft.fftfreq(scan, d=g["dx"])
    kr, kc = np.meshgrid(k, k, indexing="ij")
    kmax = 1.6 * ALPHA_PX * g["dk"]
    filt = np.exp(-(kr**2 + kc**2) / (2 * (kmax / 2.5) ** 2)) * (np.hypot(kr, kc) < kmax)
    phi = np.fft.ifft2(np.fft.fft2(rng.standard_normal((scan, scan))) * filt).real
    phi -= phi.mean()
    phi *= 0.3 / np.abs(phi).max()
    kd = np.fft.fftfreq(det, d=g["dx"])
    dr, dc = np.meshgrid(kd, kd, indexing="ij")
    th2 = (g["lam"] * dr) ** 2 + (g["lam"] * dc) ** 2
    chi = 2 * math.pi / g["lam"] * C10 * th2 / 2
    aperture = th2 < (ALPHA_MRAD * 1e-3) ** 2
    probe = cp.asarray(np.fft.fftshift(np.fft.ifft2(aperture * np.exp(-1j * chi))))
    obj = np.exp(1j * phi)
    ext = cp.asarray(
        np.pad(obj, ((det // 2, det - det // 2), (det // 2, det - det // 2)), mode="wrap")
    )
    out = np.empty((scan, scan, det, det), dtype=np.uint16)
    s0, s1 = ext.strides
    scale = None
    for i in range(scan):
        win = cp.lib.stride_tricks.as_strided(ext[i:], shape=(scan, det, det), strides=(s1, s0, s1))
        psi = cp.fft.fftshift(cp.fft.fft2(win * probe[None]), axes=(-2, -1))
        inten = cp.abs(psi) ** 2
        if scale is None:
            scale = 1000.0 * float(aperture.sum()) / float(inten[0].sum())
        out[i] = cp.asnumpy(cp.rint(inten * scale).astype(cp.uint16))
    return out, phi


def correlation(a: np.ndarray, b: np.ndarray) -> float:
    a = a - a.mean()
    b = b - b.mean()
    return float((a * b).sum() / math.sqrt((a * a).sum() * (b * b).sum()))


def run_once(frames: np.ndarray, det: int, backend: str) -> tuple[Any, float]:
    from bench_ssb import ALPHA_MRAD, C10, KV, calibration

    import quantem_flow as qf
    from quantem_flow.operators.ssb import ssb

    ds = qf.open(frames, calibration=calibration(det))
    lazy = ssb(ds, voltage_kV=KV, semiangle_mrad=ALPHA_MRAD, defocus_A=C10, backend=backend)
    t = time.perf_counter()
    with qf.config.set(progress=False):
        (res,) = qf.compute(lazy, client="synchronous")
    return res, time.perf_counter() - t


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scans", type=int, nargs="+", default=[256, 512])
    ap.add_argument("--det", type=int, default=128)
    ap.add_argument("--backends", nargs="+", default=["cuda", "cpu"])
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    report: dict[str, Any] = {"rows": [], "failures": []}

    def save() -> None:
        if args.json:
            args.json.write_text(json.dumps(report, indent=2))

    for scan in args.scans:
        try:
            t = time.perf_counter()
            frames, truth = simulate_on_gpu(scan, args.det)
            print(
                f"simulated {scan}x{scan}x{args.det}x{args.det} u16 ({frames.nbytes / 1e9:.1f} GB) "
                f"on the GPU in {time.perf_counter() - t:.1f} s",
                flush=True,
            )
        except Exception:
            report["failures"].append(
                {"scan": scan, "stage": "simulate", "error": traceback.format_exc()}
            )
            print(traceback.format_exc(), flush=True)
            save()
            continue
        phases: dict[str, np.ndarray] = {}
        for backend in args.backends:
            for attempt in ("cold", "warm"):
                try:
                    res, total = run_once(frames, args.det, backend)
                except Exception:
                    report["failures"].append(
                        {"scan": scan, "backend": backend, "error": traceback.format_exc()}
                    )
                    print(traceback.format_exc(), flush=True)
                    break
                tm, p = res.provenance.timings, res.provenance.parameters
                phases[backend] = np.asarray(res.phase)
                row = {
                    "scan": scan,
                    "det": args.det,
                    "backend": p["ssb_backend"]["chosen"],
                    "attempt": attempt,
                    "total_s": total,
                    "pass_s": tm.get("pass_s"),
                    "ssb_stage_s": tm.get("ssb_stage_s"),
                    "ssb_read_s": tm.get("ssb_read_s"),
                    "ssb_fft_accumulate_s": tm.get("ssb_fft_accumulate_s"),
                    "ssb_assemble_s": tm.get("ssb_assemble_s"),
                    "n_pixels": p["blocks"]["n_pixels"],
                    "correlation": correlation(phases[backend], truth),
                }
                report["rows"].append(row)
                print(
                    f"SSB {scan}x{scan} {row['backend']:4s} {attempt}: total {total:.3f} s, "
                    f"pass {row['pass_s']:.3f} s, stage {row['ssb_stage_s'] * 1e3:.1f} ms "
                    f"(FFT+accumulate {row['ssb_fft_accumulate_s'] * 1e3:.1f} ms), "
                    f"{row['n_pixels']} pixels, phase corr {row['correlation']:.4f}",
                    flush=True,
                )
                save()
        if "cuda" in phases and "cpu" in phases:
            diff = float(np.abs(phases["cuda"] - phases["cpu"]).max())
            report.setdefault("parity", []).append({"scan": scan, "max_abs_rad": diff})
            print(f"SSB {scan}x{scan}: max |phase_cuda - phase_cpu| = {diff:.3e} rad", flush=True)
            if not diff <= 1e-9:
                report["failures"].append({"scan": scan, "stage": "parity", "error": f"{diff}"})
        del frames
        save()
    save()
    return 1 if report["failures"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
