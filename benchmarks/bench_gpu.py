"""Time the CUDA runtime's kernels on a 512 x 512 x 192 x 192 uint16 dataset (18 GiB).

Run on a machine with an NVIDIA GPU (see gpu_check.sh).  Measures, side by
side in one run: the device's own bandwidth (a device-to-device copy and a
plain CuPy sum over the same bytes), the resident virtual image (1 weight
row), BF + ADF + CoM (5 rows), the same with the sum and max patterns,
stacked masks through cuBLAS (32 rows), a 512 x 512 iDPC FFT integration,
and loading the dataset from the page cache onto the device through pinned
staging with several reader threads.  Parity with the CPU runtime is checked
on the first 4096 frames before any timing.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def timed(fn: Any, repeat: int, sync: Any) -> tuple[float, list[float]]:
    fn()
    sync()
    ts = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        sync()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts), ts


def main() -> int:
    import cupy

    from quantem_flow.runtimes.cpu import CpuRuntime
    from quantem_flow.runtimes.cuda import CudaRuntime

    ap = argparse.ArgumentParser()
    ap.add_argument("--scan", type=int, default=512)
    ap.add_argument("--det", type=int, default=192)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--skip-load", action="store_true")
    args = ap.parse_args()
    ok, why = CudaRuntime.available()
    print("cuda:", ok, why, flush=True)
    if not ok:
        return 2
    rt = CudaRuntime()
    sync = cupy.cuda.Device().synchronize
    n, k = args.scan * args.scan, args.det * args.det
    gib = n * k * 2 / 2**30

    # data: a probe disk with Poisson noise, generated on the device in blocks
    rr, cc = np.indices((args.det, args.det))
    d = np.hypot(rr - 0.47 * args.det, cc - 0.53 * args.det)
    lam = cupy.asarray(0.05 + 30.0 * (d < args.det / 8) + 2.0 * np.exp(-d / 20.0)).ravel()
    frames = cupy.empty((n, k), dtype=cupy.uint16)
    t = time.perf_counter()
    rng = cupy.random.default_rng(7)
    block = 4096
    for i in range(0, n, block):
        m = min(block, n - i)
        frames[i : i + m] = rng.poisson(cupy.broadcast_to(lam, (m, k))).astype(cupy.uint16)
    sync()
    print(f"generated {gib:.1f} GiB on the device in {time.perf_counter() - t:.1f} s", flush=True)

    masks = (
        np.stack(
            [
                (d < args.det / 8),
                (d >= args.det / 4),
                np.ones_like(d, dtype=bool),
                rr - 0.47 * args.det,
                cc - 0.53 * args.det,
            ]
        )
        .reshape(5, k)
        .astype(np.float64)
    )

    # parity with the CPU runtime on a subset
    sub = cupy.asnumpy(frames[:4096])
    ref = CpuRuntime().frame_pass(sub, masks, want_sum=True, want_max=True)
    got = rt.frame_pass(frames[:4096], masks, want_sum=True, want_max=True)
    np.testing.assert_array_equal(got.per_frame[:, :3], ref.per_frame[:, :3])
    np.testing.assert_allclose(got.per_frame, ref.per_frame, rtol=1e-12)
    np.testing.assert_array_equal(got.pattern_sum, ref.pattern_sum)
    np.testing.assert_array_equal(got.pattern_max, ref.pattern_max)
    print("parity with the CPU runtime on 4096 frames: OK", flush=True)

    rows: list[tuple[str, float, float]] = []

    def add(name: str, s: float, nbytes: float) -> None:
        rows.append((name, s, nbytes / s / 1e9))
        print(f"{name:55s} {s * 1e3:9.2f} ms {nbytes / s / 1e9:8.1f} GB/s", flush=True)

    nbytes = float(frames.nbytes)
    half = frames[: n // 2]
    dst = cupy.empty_like(half)
    s, _ = timed(lambda: cupy.copyto(dst, half), args.repeat, sync)
    add("device copy (read + write), half the data", s, 2 * half.nbytes)
    s, _ = timed(lambda: frames.view(cupy.uint64).sum(), args.repeat, sync)
    add("cupy sum over the data (read)", s, nbytes)
    one = masks[:1]
    s, _ = timed(
        lambda: rt.frame_pass(frames, one, want_sum=False, want_max=False), args.repeat, sync
    )
    add("resident virtual image (1 weight row)", s, nbytes)
    s, _ = timed(
        lambda: rt.frame_pass(frames, masks, want_sum=False, want_max=False), args.repeat, sync
    )
    add("BF + ADF + CoM (5 weight rows)", s, nbytes)
    s, _ = timed(
        lambda: rt.frame_pass(frames, masks, want_sum=True, want_max=True), args.repeat, sync
    )
    add("BF + ADF + CoM + sum and max patterns", s, nbytes)
    many = np.random.default_rng(1).random((32, k))
    s, _ = timed(
        lambda: rt.frame_pass(frames[: n // 8], many, want_sum=False, want_max=False),
        args.repeat,
        sync,
    )
    add("32 stacked masks via cuBLAS (1/8 of the data)", s, nbytes / 8)
    # other representations on a subset, parity with the CPU runtime first
    from quantem_flow.representations import chunk_of, get_representation

    sub_n = min(n, 16384)
    host = cupy.asnumpy(frames[:sub_n]).reshape(1, sub_n, args.det, args.det)
    low = (host > 40).astype(np.uint16) * host  # sparse: the bright-field disk only
    cpu = CpuRuntime()
    for rep_name, block in (("paired", low), ("packed", host), ("encoded", host)):
        rep = get_representation(rep_name)
        payload = (
            rep.from_dense(block)
            if rep_name != "encoded"
            else rep.from_dense(block, codec="bitshuffle-lz4")
        )
        host = chunk_of(rep_name, payload)
        want = cpu.run_frame_pass(host, masks, want_sum=True, want_max=True)
        resident = rt.put(host)  # the arrays move to the device once
        have = rt.run_frame_pass(resident, masks, want_sum=True, want_max=True)
        np.testing.assert_allclose(have.per_frame, want.per_frame, rtol=1e-12)
        np.testing.assert_array_equal(have.pattern_sum, want.pattern_sum)
        np.testing.assert_array_equal(have.pattern_max, want.pattern_max)

        def run(resident: Any = resident) -> Any:
            return rt.run_frame_pass(resident, masks, want_sum=False, want_max=False)

        def streamed(host: Any = host) -> Any:
            handle = rt.put(host)
            try:
                return rt.run_frame_pass(handle, masks, want_sum=False, want_max=False)
            finally:
                rt.release(handle)

        s, _ = timed(run, args.repeat, sync)
        add(f"BF + ADF + CoM on {rep_name} ({sub_n} frames, resident)", s, float(block.nbytes))
        s, _ = timed(streamed, args.repeat, sync)
        add(
            f"BF + ADF + CoM on {rep_name} ({sub_n} frames, put + run + release)",
            s,
            float(block.nbytes),
        )
        rt.release(resident)
    print("parity of paired, packed, encoded with the CPU runtime: OK", flush=True)

    field = cupy.asarray(np.random.default_rng(2).standard_normal((2, args.scan, args.scan)))

    def idpc() -> Any:
        q = cupy.fft.fftfreq(args.scan)
        q2 = q[:, None] ** 2 + q[None, :] ** 2
        q2[0, 0] = 1
        num = q[:, None] * cupy.fft.fft2(field[0]) + q[None, :] * cupy.fft.fft2(field[1])
        return cupy.fft.ifft2(num / (2j * np.pi * q2)).real

    s, _ = timed(idpc, args.repeat, sync)
    add("iDPC Fourier integration 512 x 512 (cuFFT)", s, field.nbytes)

    if not args.skip_load:
        path = Path("/tmp/qf_bench_gpu.npy")
        t = time.perf_counter()
        mm = np.lib.format.open_memmap(path, mode="w+", dtype=np.uint16, shape=(n, k))
        for i in range(0, n, 8192):
            mm[i : i + 8192] = cupy.asnumpy(frames[i : i + 8192])
        mm.flush()
        del mm
        print(f"wrote {path} in {time.perf_counter() - t:.1f} s (now in the page cache)")
        src = np.load(path, mmap_mode="r")
        out = cupy.empty((n, k), dtype=cupy.uint16)
        n_threads = 8
        per = (n + n_threads - 1) // n_threads
        step = 2048

        def load() -> None:
            def work(lo: int, hi: int) -> None:
                stream = cupy.cuda.Stream(non_blocking=True)
                pinned = [cupy.cuda.alloc_pinned_memory(step * k * 2) for _ in range(2)]
                bufs = [
                    np.frombuffer(p, dtype=np.uint16, count=step * k).reshape(step, k)
                    for p in pinned
                ]
                events = [None, None]
                for j, i in enumerate(range(lo, hi, step)):
                    m = min(step, hi - i)
                    b = j % 2
                    if events[b] is not None:
                        events[b].synchronize()
                    np.copyto(bufs[b][:m], src[i : i + m])
                    out[i : i + m].set(bufs[b][:m], stream=stream)
                    ev = cupy.cuda.Event()
                    ev.record(stream)
                    events[b] = ev
                stream.synchronize()

            threads = [
                threading.Thread(target=work, args=(t * per, min(n, (t + 1) * per)))
                for t in range(n_threads)
            ]
            for th in threads:
                th.start()
            for th in threads:
                th.join()

        s, _ = timed(load, max(2, args.repeat // 2), sync)
        add("load the .npy from page cache onto the device", s, nbytes)
        assert bool((out[::997] == frames[::997]).all())
        path.unlink()

    report = {
        "gpu": why,
        "shape": [args.scan, args.scan, args.det, args.det],
        "rows": [{"name": a, "s": b, "GBps": c} for a, b, c in rows],
    }
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
