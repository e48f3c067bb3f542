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
import traceback
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
    ap.add_argument("--load-gib", type=float, default=8.0)
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

    rows: list[tuple[str, float, float]] = []
    failures: list[dict[str, str]] = []

    def save() -> None:
        if args.json:
            report = {
                "gpu": why,
                "shape": [args.scan, args.scan, args.det, args.det],
                "rows": [{"name": a, "s": b, "GBps": c} for a, b, c in rows],
                "failures": failures,
            }
            args.json.write_text(json.dumps(report, indent=2))

    def section(name: str, fn: Any) -> None:
        """Run one part; a failure is printed and recorded, and the next part runs."""
        try:
            fn()
        except Exception:
            failures.append({"section": name, "error": traceback.format_exc()})
            print(f"FAILED: {name}\n{traceback.format_exc()}", flush=True)
        save()

    def parity() -> None:
        sub = cupy.asnumpy(frames[:4096])
        ref = CpuRuntime().frame_pass(sub, masks, want_sum=True, want_max=True)
        got = rt.frame_pass(frames[:4096], masks, want_sum=True, want_max=True)
        np.testing.assert_array_equal(got.per_frame[:, :3], ref.per_frame[:, :3])
        np.testing.assert_allclose(got.per_frame, ref.per_frame, rtol=1e-12)
        np.testing.assert_array_equal(got.pattern_sum, ref.pattern_sum)
        np.testing.assert_array_equal(got.pattern_max, ref.pattern_max)
        print("parity with the CPU runtime on 4096 frames: OK", flush=True)

    section("parity of the dense pass with the CPU runtime", parity)

    def add(name: str, s: float, nbytes: float) -> None:
        rows.append((name, s, nbytes / s / 1e9))
        print(f"{name:60s} {s * 1e3:9.2f} ms {nbytes / s / 1e9:8.1f} GB/s", flush=True)

    nbytes = float(frames.nbytes)

    def ceilings() -> None:
        half = frames[: n // 2]
        dst = cupy.empty_like(half)
        s, _ = timed(lambda: cupy.copyto(dst, half), args.repeat, sync)
        add("device copy (read + write), half the data", s, 2 * half.nbytes)
        s, _ = timed(lambda: frames.view(cupy.uint64).sum(), args.repeat, sync)
        add("cupy sum over the data (read)", s, nbytes)

    def dense() -> None:
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

    section("device ceilings", ceilings)
    section("dense resident passes", dense)

    # the same operation on this machine's CPUs, through the CPU runtime, for the ratio
    sub_n = min(n, 16384)
    host = cupy.asnumpy(frames[:sub_n]).reshape(1, sub_n, args.det, args.det)

    def cpu_dense() -> None:
        import os

        cpu = CpuRuntime()
        flat = host.reshape(sub_n, k)
        s, _ = timed(
            lambda: cpu.frame_pass(flat, masks, want_sum=False, want_max=False), args.repeat, _noop
        )
        add(f"CPU runtime: BF + ADF + CoM ({sub_n} frames, {os.cpu_count()} CPUs)", s, flat.nbytes)
        s, _ = timed(
            lambda: rt.frame_pass(frames[:sub_n], masks, want_sum=False, want_max=False),
            args.repeat,
            sync,
        )
        add(f"CUDA runtime: BF + ADF + CoM ({sub_n} frames, resident)", s, flat.nbytes)

    section("CPU runtime beside it", cpu_dense)

    # other representations on a subset, parity with the CPU runtime first
    from quantem_flow.representations import chunk_of, get_representation

    low = (host > 40).astype(np.uint16) * host  # sparse: the bright-field disk only

    def representation(rep_name: str) -> None:
        cpu = CpuRuntime()
        block = low if rep_name == "paired" else host
        rep = get_representation(rep_name)
        payload = (
            rep.from_dense(block)
            if rep_name != "encoded"
            else rep.from_dense(block, codec="bitshuffle-lz4")
        )
        chunk = chunk_of(rep_name, payload)
        want = cpu.run_frame_pass(chunk, masks, want_sum=True, want_max=True)
        resident = rt.put(chunk)  # the arrays move to the device once
        have = rt.run_frame_pass(resident, masks, want_sum=True, want_max=True)
        np.testing.assert_allclose(have.per_frame, want.per_frame, rtol=1e-12)
        np.testing.assert_array_equal(have.pattern_sum, want.pattern_sum)
        np.testing.assert_array_equal(have.pattern_max, want.pattern_max)
        print(f"parity of {rep_name} with the CPU runtime: OK", flush=True)

        def run(resident: Any = resident) -> Any:
            return rt.run_frame_pass(resident, masks, want_sum=False, want_max=False)

        def streamed(chunk: Any = chunk) -> Any:
            handle = rt.put(chunk)
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
        s, _ = timed(
            lambda: cpu.run_frame_pass(chunk, masks, want_sum=False, want_max=False),
            args.repeat,
            _noop,
        )
        add(f"CPU runtime: BF + ADF + CoM on {rep_name} ({sub_n} frames)", s, float(block.nbytes))
        rt.release(resident)

    def dense_sub() -> None:
        dense_chunk = chunk_of("dense", host)
        resident = rt.put(dense_chunk)
        s, _ = timed(
            lambda: rt.run_frame_pass(resident, masks, want_sum=False, want_max=False),
            args.repeat,
            sync,
        )
        add(f"BF + ADF + CoM on dense ({sub_n} frames, resident)", s, float(host.nbytes))
        rt.release(resident)

    section("dense chunk through put/run_frame_pass", dense_sub)
    for rep_name in ("paired", "packed", "encoded"):
        section(f"representation {rep_name}", lambda r=rep_name: representation(r))

    def idpc_section() -> None:
        field = cupy.asarray(np.random.default_rng(2).standard_normal((2, args.scan, args.scan)))

        def idpc() -> Any:
            q = cupy.fft.fftfreq(args.scan)
            q2 = q[:, None] ** 2 + q[None, :] ** 2
            q2[0, 0] = 1
            num = q[:, None] * cupy.fft.fft2(field[0]) + q[None, :] * cupy.fft.fft2(field[1])
            return cupy.fft.ifft2(num / (2j * np.pi * q2)).real

        s, _ = timed(idpc, args.repeat, sync)
        add(f"iDPC Fourier integration {args.scan} x {args.scan} (cuFFT)", s, field.nbytes)

    section("iDPC", idpc_section)

    def load_section() -> None:
        n_load = min(n, int(args.load_gib * 2**30 / (k * 2)))
        path = Path("/tmp/qf_bench_gpu.npy")
        t = time.perf_counter()
        mm = np.lib.format.open_memmap(path, mode="w+", dtype=np.uint16, shape=(n_load, k))
        for i in range(0, n_load, 8192):
            j = min(n_load, i + 8192)
            mm[i:j] = cupy.asnumpy(frames[i:j])
        mm.flush()
        del mm
        print(f"wrote {path} in {time.perf_counter() - t:.1f} s (now in the page cache)")
        src = np.load(path, mmap_mode="r")
        out = cupy.empty((n_load, k), dtype=cupy.uint16)
        n_threads = 8
        per = (n_load + n_threads - 1) // n_threads
        step = 2048

        def load() -> None:
            def work(lo: int, hi: int) -> None:
                stream = cupy.cuda.Stream(non_blocking=True)
                pinned = [cupy.cuda.alloc_pinned_memory(step * k * 2) for _ in range(2)]
                bufs = [
                    np.frombuffer(p, dtype=np.uint16, count=step * k).reshape(step, k)
                    for p in pinned
                ]
                events: list[Any] = [None, None]
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
                threading.Thread(target=work, args=(t * per, min(n_load, (t + 1) * per)))
                for t in range(n_threads)
            ]
            for th in threads:
                th.start()
            for th in threads:
                th.join()

        s, _ = timed(load, max(2, args.repeat // 2), sync)
        add(
            f"load a {n_load * k * 2 / 2**30:.1f} GiB .npy from page cache onto the device",
            s,
            float(n_load * k * 2),
        )
        assert bool((out[::997] == frames[:n_load:997]).all())
        path.unlink()

    if not args.skip_load:
        section("load from the page cache", load_section)
    save()
    return 1 if failures else 0


def _noop() -> None:
    return None


if __name__ == "__main__":
    raise SystemExit(main())
