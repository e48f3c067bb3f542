"""Receive rate of a Merlin TCP data socket (256 x 256, 12-bit counters as U16) over loopback.

Frames pre-encoded (MQ1 header + big-endian pixels, MPX-framed) and sent with
``sendall`` from a thread; ``receive_merlin`` parses each header with the
``.mib`` reader's parser and converts the pixels to native order.  One run,
medians of ``--repeats``.

    python benchmarks/bench_merlin_tcp.py [--frames 10000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import socket
import statistics
import threading
import time

import numpy as np


def main() -> None:
    """Measure and print the rate."""
    from quantem_flow.streams.merlin_tcp import encode_mpx, mq1_header, receive_merlin

    ap = argparse.ArgumentParser()
    ap.add_argument("--frames", type=int, default=10000)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    base = rng.integers(0, 4096, size=(64, 256, 256)).astype(">u2")
    header = encode_mpx(
        f"HDR,\t\nFrames in Acquisition (Number):\t{a.frames}\nEnd\t\n".encode("ascii")
    )
    messages = [
        encode_mpx(mq1_header(i + 1, (256, 256), np.uint16) + base[i % 64].tobytes())
        for i in range(a.frames)
    ]
    rates = []
    for _ in range(a.repeats):
        server = socket.create_server(("127.0.0.1", 0))
        port = server.getsockname()[1]

        def send(server: socket.socket = server) -> None:
            conn, _ = server.accept()
            with conn:
                conn.sendall(header)
                for m in messages:
                    conn.sendall(m)
            server.close()

        t = threading.Thread(target=send)
        t.start()
        status: list[dict[str, object]] = []
        t0 = time.perf_counter()
        n = sum(1 for _ in receive_merlin("127.0.0.1", port, timeout_s=30, status=status))
        rates.append(n / (time.perf_counter() - t0))
        t.join()
        assert status[0]["ended"] == "complete", status
    mb = len(messages[0]) / 1e6
    print(f"frames: {a.frames} x 256x256 U16 (12-bit counters), {mb:.3f} MB per message")
    median = statistics.median(rates)
    print(f"end to end over loopback, none lost: median {median:,.0f} frames/s "
          f"(runs {[round(r) for r in rates]}), {median * mb:,.0f} MB/s")  # fmt: skip


if __name__ == "__main__":
    main()
