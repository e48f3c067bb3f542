"""LiberTEM-live on the same Merlin stream as bench_live_engine.py, for the side-by-side row.

Run with an interpreter that has ``libertem-live`` (PyPI; it is not a
dependency of quantem-flow), giving the quantem-flow interpreter that runs
the sender (the same paced 256 x 256 12-bit frames, from
``bench_live_engine._send_merlin``):

    python3 -m venv /tmp/llvenv && /tmp/llvenv/bin/pip install libertem-live
    /tmp/llvenv/bin/python benchmarks/bench_libertem_live.py --sender-python .venv/bin/python \\
        --rates 5000 10000 15000 --seconds 6

LiberTEM-live connects passively to the data socket and computes BF and ADF
masks (ApplyMasksUDF) and the centre of mass (CoMUDF) with the same
geometry as quantem-flow's run.  It asks the Merlin *control* port (6341)
for the frame size and counter depth, which the simulator does not serve:
the harness answers those two from what the stream carries.  The DECTRIS
row cannot be run: libertem-live 0.3.0 (with libertem-dectris 0.3.2)
receives DECTRIS stream v1 (JSON multipart: ``dheader``/``dimage``) and arms
the detector through the SIMPLON REST API; quantem-flow's source and
simulator speak stream v2 (CBOR).
"""

from __future__ import annotations

import argparse
import subprocess
import time
from pathlib import Path

import numpy as np

_SENDER = """
import sys, multiprocessing as mp
sys.path.insert(0, {bench!r})
from bench_live_engine import _send_merlin
if __name__ == "__main__":
    n, rate = int(sys.argv[1]), float(sys.argv[2])
    ctx = mp.get_context("spawn"); ports, done, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    p = ctx.Process(target=_send_merlin, args=(n, rate, ports, go, done)); p.start()
    port, _ = ports.get(); print(port, flush=True)
    sys.stdin.readline(); go.set()
    t_last, sent_rate = done.get(); print(f"SENT {{t_last}} {{sent_rate}}", flush=True); p.join()
"""


def run(sender_python: str, n: int, rate: float) -> str:
    """One paced acquisition through LiberTEM-live; its line of the table."""
    from libertem.udf.com import CoMUDF
    from libertem.udf.masks import ApplyMasksUDF
    from libertem_live.api import LiveContext

    bench = str(Path(__file__).resolve().parent)
    sender = subprocess.Popen(
        [sender_python, "-c", _SENDER.format(bench=bench), str(n), str(rate)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert sender.stdin is not None and sender.stdout is not None
    port = int(sender.stdout.readline())
    ctx = LiveContext()
    try:
        with ctx.make_connection("merlin").open(
            data_host="127.0.0.1", data_port=port, api_host="127.0.0.1", api_port=1
        ) as conn:
            conn.read_sig_shape = lambda: (256, 256)  # the control port's answers
            conn.read_bitdepth = lambda: 12
            sender.stdin.write("\n")
            sender.stdin.flush()
            pending = conn.wait_for_acquisition(30)
            assert pending is not None, "no acquisition header"
            aq = ctx.make_acquisition(conn=conn, pending_aq=pending, nav_shape=(n // 100, 100))
            rr, cc = np.indices((256, 256))
            d = np.hypot(rr - 128.0, cc - 128.0)
            bf = (d < 20).astype(np.float32)
            adf = ((d >= 40) & (d < 90)).astype(np.float32)
            udfs = [
                ApplyMasksUDF(mask_factories=[lambda: bf, lambda: adf]),
                CoMUDF.with_params(cy=128.0, cx=128.0, r=30.0),
            ]
            ctx.run_udf(dataset=aq, udf=udfs)
            done = time.time()
    finally:
        ctx.close()
    words = sender.stdout.readline().split()
    sender.wait(60)
    t_last, sent_rate = float(words[1]), float(words[2])
    ok = sent_rate >= 0.98 * rate and done - t_last < 1.0
    verdict = "SUSTAINED" if ok else "not sustained"
    return (
        f"libertem-live merlin {rate:>7,.0f} Hz {n} frames: {verdict}"
        f" (sent at {sent_rate:,.0f}/s; results {1e3 * (done - t_last):.0f} ms after the last "
        "frame was sent)"
    )


def main() -> None:
    """Print one line per rate."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--sender-python", required=True, help="quantem-flow's interpreter")
    ap.add_argument("--rates", type=float, nargs="+", default=[5000.0, 10000.0, 15000.0])
    ap.add_argument("--seconds", type=float, default=6.0)
    a = ap.parse_args()
    for rate in a.rates:
        n = int(rate * a.seconds) // 100 * 100
        print(run(a.sender_python, n, rate), flush=True)


if __name__ == "__main__":
    main()
