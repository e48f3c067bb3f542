"""qf.live end to end on this machine: a paced DECTRIS stream received into the live file.

ARINA-like frames (192 x 192 uint16, bitshuffle+LZ4, sparse) are encoded
beforehand and PUSHed at a fixed rate from a thread; ``qf.live`` receives,
checks, decodes and writes each into the scan-ordered file.  A rate is
*sustained* when every frame arrives (the report says complete) and the last
frame lands within 0.5 s of when it was sent.  Then the whole scan's virtual
bright field runs through the embedded default on the received file.

    python benchmarks/bench_live.py [--frames 10000] [--rates 5000 10000 15000]
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time

import numpy as np


def main() -> None:
    """Measure and print, per rate: complete or not, the lag, the achieved rate."""
    import zmq

    import quantem_flow as qf
    from quantem_flow.streams.dectris_stream import encode_end, encode_image, encode_start

    ap = argparse.ArgumentParser()
    ap.add_argument("--frames", type=int, default=10000)
    ap.add_argument("--rates", type=float, nargs="+", default=[5000.0, 10000.0, 15000.0])
    a = ap.parse_args()
    side = round(a.frames**0.5)
    scan = (a.frames // side, side)
    n = scan[0] * scan[1]
    rng = np.random.default_rng(0)
    rr, cc = np.indices((192, 192))
    lam = ((rr - 96) ** 2 + (cc - 96) ** 2 < 400) * (300 / (np.pi * 400)) + 0.002
    base = rng.poisson(lam, size=(256, 192, 192)).astype(np.uint16)
    messages = [
        encode_image(base[i % 256], series_id=1, image_id=i, compression="bslz4") for i in range(n)
    ]
    print(f"{n} frames ({scan[0]} x {scan[1]} scan) of 192 x 192 uint16 bslz4, "
          f"{np.mean([len(m) for m in messages[:500]]):.0f} B per message")  # fmt: skip
    for rate in a.rates:
        ctx = zmq.Context.instance()
        push = ctx.socket(zmq.PUSH)
        port = push.bind_to_random_port("tcp://127.0.0.1")
        sent_at: list[float] = []

        def send(
            push: zmq.Socket[bytes] = push, rate: float = rate, sent_at: list[float] = sent_at
        ) -> None:
            push.send(encode_start(series_id=1, series_unique_id="b", number_of_images=n,
                                   image_shape=(192, 192)))  # fmt: skip
            t0 = time.perf_counter()
            for i, m in enumerate(messages):
                wait = t0 + i / rate - time.perf_counter()
                if wait > 0:
                    time.sleep(wait)
                push.send(m, copy=False)
            sent_at.append(time.perf_counter())
            push.send(encode_end(series_id=1, series_unique_id="b"))

        with tempfile.TemporaryDirectory() as tmp:
            acq = qf.live(f"tcp://127.0.0.1:{port}", scan_shape=scan, directory=tmp, timeout_s=10)
            sender = threading.Thread(target=send)
            t_start = time.perf_counter()
            sender.start()
            report = acq.wait(timeout_s=600)
            done = time.perf_counter()
            sender.join()
            push.close(linger=0)
            lag = done - sent_at[0]
            achieved = n / (done - t_start)
            ok = report.complete and lag < 0.5
            t0 = time.perf_counter()
            qf.compute(qf.virtual_bf(acq.dataset(), radius=20, center=(96, 96)),
                               progress=False)  # fmt: skip
            bf_s = time.perf_counter() - t0
            verdict = "sustained" if ok else "NOT sustained"
            print(f"rate {rate:>8,.0f} Hz: {verdict} ({report.describe()}; last frame in "
                  f"{lag * 1e3:.0f} ms after it was sent; {achieved:,.0f} frames/s overall); "
                  f"BF of the scan afterwards {bf_s:.2f} s")  # fmt: skip
            acq.close()
    qf.close_embedded_cluster()


if __name__ == "__main__":
    main()
