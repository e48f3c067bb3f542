"""Receive rate of a DECTRIS stream v2 (ARINA-like frames) over loopback, on this machine.

ARINA-like: 192 x 192 uint16 frames, bitshuffle+LZ4, sparse (a 4D-STEM pattern
at a few hundred electrons per frame).  Measured side by side in one run:

* decode only: ``decode_message`` on pre-encoded messages (one thread);
* end to end: the simulator's PUSH socket (messages encoded beforehand, so the
  sender costs only the send) to ``receive_series`` (decode + checks), both
  on this machine's cores, no frame dropped (the report says so).

    python benchmarks/bench_dectris_stream.py [--frames 20000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

import numpy as np


def frames(n: int, rng: np.random.Generator) -> np.ndarray:
    """Sparse ARINA-like frames: a bright disk of ~300 e plus a few scattered counts."""
    rr, cc = np.indices((192, 192))
    disk = ((rr - 96) ** 2 + (cc - 96) ** 2 < 20**2) * (300 / (np.pi * 400))
    lam = disk + 0.002
    return rng.poisson(lam, size=(n, 192, 192)).astype(np.uint16)


def main() -> None:
    """Measure and print the rates."""
    import zmq

    from quantem_flow.streams.dectris_receive import SeriesReport, receive_series
    from quantem_flow.streams.dectris_stream import (
        decode_message,
        encode_end,
        encode_image,
        encode_start,
    )

    ap = argparse.ArgumentParser()
    ap.add_argument("--frames", type=int, default=20000)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    data = frames(min(a.frames, 2000), rng)
    messages = [
        encode_image(data[i % len(data)], series_id=1, image_id=i, compression="bslz4")
        for i in range(a.frames)
    ]
    mean_bytes = statistics.mean(len(m) for m in messages[:1000])
    decode_rates, e2e_rates = [], []
    for _ in range(a.repeats):
        t0 = time.perf_counter()
        for m in messages[:5000]:
            decode_message(m)
        decode_rates.append(5000 / (time.perf_counter() - t0))

        ctx = zmq.Context.instance()
        push = ctx.socket(zmq.PUSH)
        port = push.bind_to_random_port("tcp://127.0.0.1")

        def send(push: zmq.Socket[bytes] = push) -> None:
            push.send(encode_start(series_id=1, series_unique_id="b", number_of_images=a.frames,
                                   image_shape=(192, 192)))  # fmt: skip
            for m in messages:
                push.send(m, copy=False)
            push.send(encode_end(series_id=1, series_unique_id="b"))

        sender = threading.Thread(target=send)
        report: list[SeriesReport] = []
        sender.start()
        t0 = time.perf_counter()
        n = sum(1 for _ in receive_series(f"tcp://127.0.0.1:{port}", report=report, timeout_s=30))
        e2e_rates.append(n / (time.perf_counter() - t0))
        sender.join()
        push.close(linger=0)
        assert report[0].complete, report[0].describe()
    print(f"frames: {a.frames} x 192x192 uint16 bslz4, mean message {mean_bytes:.0f} B")
    print(f"decode only (1 thread): median {statistics.median(decode_rates):,.0f} frames/s "
          f"(runs {[round(r) for r in decode_rates]})")  # fmt: skip
    print(f"end to end over loopback, no drops: median {statistics.median(e2e_rates):,.0f} "
          f"frames/s (runs {[round(r) for r in e2e_rates]})")  # fmt: skip


if __name__ == "__main__":
    main()
