"""Live streams through the engine: frames in, virtual images out while the scan runs.

A sender *process* (standing in for the detector: its own interpreter, so it
shares the cores but not the GIL) binds on 127.0.0.1 and sends pre-encoded
frames at a fixed rate:

* ``dectris``: ARINA-like 192 x 192 uint16 frames, bitshuffle+LZ4, sparse
  (~300 electrons per frame), as DECTRIS stream v2 messages over ZeroMQ;
* ``merlin``: 256 x 256 frames with 12-bit counters (U16), MPX-framed with
  their MQ1 headers, over TCP.

This process runs ``qf.live(...)`` and ``acq.watch(build)`` on the embedded
default cluster with BF, ADF and CoM (fixed centre, so each update computes
only the new rows) and publishes every update to the dashboard page.

A rate is **sustained** when the sender kept its pace (at least 98 % of it:
a TCP sender is held back when the receiver falls behind), every frame
arrived, the last frame landed within 0.5 s of being sent, and the final
results (equal to the offline pass, checked) were ready within 1 s of the
last frame.  Per update, the
latency is from the moment its last scan row was complete (``time.time()``
in the receiver) to the results being ready; with ``--page``, also to the
dashboard page (headless Chromium, Playwright) having the new images: the
page reads the row count and arrival time the update carries and stamps
``Date.now()`` on the animation frame after it embedded them.

    python benchmarks/bench_live_engine.py [--protocol dectris merlin] [--rates 5000 10000]
        [--seconds 4] [--page]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

CENTER_DECTRIS = (96.0, 96.0)
CENTER_MERLIN = (128.0, 128.0)
#: least seconds between two updates of the results (watch(every_s=...))
EVERY_S = 0.25


def _dectris_frames(count: int) -> np.ndarray:
    rng = np.random.default_rng(0)
    rr, cc = np.indices((192, 192))
    lam = ((rr - 96) ** 2 + (cc - 96) ** 2 < 400) * (300 / (np.pi * 400)) + 0.002
    return rng.poisson(lam, size=(count, 192, 192)).astype(np.uint16)


def _merlin_frames(count: int) -> np.ndarray:
    rng = np.random.default_rng(0)
    rr, cc = np.indices((256, 256))
    lam = ((rr - 128) ** 2 + (cc - 128) ** 2 < 900) * 40.0 + 0.5
    return np.minimum(rng.poisson(lam, size=(count, 256, 256)), 4095).astype(np.uint16)


def _send_dectris(n: int, rate: float, ports: Any, go: Any, done: Any) -> None:
    import zmq

    from quantem_flow.streams.dectris_stream import encode_end, encode_image, encode_start

    base = _dectris_frames(256)
    messages = [
        encode_image(base[i % 256], series_id=1, image_id=i, compression="bslz4") for i in range(n)
    ]
    zctx = zmq.Context.instance()
    push = zctx.socket(zmq.PUSH)
    push.setsockopt(zmq.SNDHWM, 0)
    port = push.bind_to_random_port("tcp://127.0.0.1")
    ports.put((port, float(np.mean([len(m) for m in messages[:1000]]))))
    go.wait()
    push.send(
        encode_start(series_id=1, series_unique_id="b", number_of_images=n, image_shape=(192, 192))
    )
    t0 = time.perf_counter()
    for i, m in enumerate(messages):
        wait = t0 + i / rate - time.perf_counter()
        if wait > 0:
            time.sleep(wait)
        push.send(m, copy=False)
    done.put((time.time(), n / max(time.perf_counter() - t0, 1e-9)))
    push.send(encode_end(series_id=1, series_unique_id="b"))
    push.close(linger=120_000)
    zctx.term()  # waits until every queued message is delivered (or the linger ends)


def _send_merlin(n: int, rate: float, ports: Any, go: Any, done: Any) -> None:
    import socket

    from quantem_flow.streams.merlin_tcp import encode_mpx, mq1_header

    base = _merlin_frames(64).astype(">u2")
    fields = {
        "Frames in Acquisition (Number)": str(n),
        "Frames per Trigger (Number)": str(n),
        "Counter Depth (number)": "12",
        "Chip ID": "W530_L8,-,-,-",
        "Assembly Size (NX1, 2X2)": "1x1",
        "Sensor Layout": "1x1",
        "Number of Chips": "1",
    }
    text = "HDR,\t\n" + "".join(f"{k}:\t{v}\n" for k, v in fields.items()) + "End\t\n"
    header = encode_mpx(text.encode("ascii"))
    messages = [
        encode_mpx(mq1_header(i + 1, (256, 256), np.uint16) + base[i % 64].tobytes())
        for i in range(n)
    ]
    server = socket.create_server(("127.0.0.1", 0))
    ports.put((server.getsockname()[1], float(len(messages[0]))))
    go.wait()
    conn, _ = server.accept()
    with conn:
        conn.sendall(header)
        t0 = time.perf_counter()
        for i, m in enumerate(messages):
            wait = t0 + i / rate - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
            conn.sendall(m)  # blocks when the receiver falls behind (TCP's window)
        done.put((time.time(), n / max(time.perf_counter() - t0, 1e-9)))
    server.close()


def _build(center: tuple[float, float]) -> Any:
    import quantem_flow as qf

    def build(ds: Any) -> list[Any]:
        return [
            qf.virtual_bf(ds, radius=20, center=center),
            qf.virtual_adf(ds, inner=40, outer=90, center=center),
            qf.center_of_mass(ds, center=center, mask_radius=30),
        ]

    return build


_PAGE_PROBE = """() => {
  window.__qf = [];
  let seen = -1;
  function tick() {
    const doc = Bokeh.documents[Bokeh.documents.length - 1];
    const status = doc ? doc.get_model_by_name("qf-live-status") : null;
    if (status && status.tags.length === 2 && status.tags[1] !== seen) {
      seen = status.tags[1];
      window.__qf.push([status.tags[0], status.tags[1], Date.now() / 1000]);
    }
    requestAnimationFrame(tick);
  }
  requestAnimationFrame(tick);
}"""


def _open_page(url: str) -> Any:
    from playwright.sync_api import sync_playwright

    chromium = os.environ.get("QF_CHROMIUM") or shutil.which("chromium")
    assert chromium, "no chromium on PATH (apt-get install chromium)"
    pw = sync_playwright().start()
    browser = pw.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(url)
    page.wait_for_function("() => window.Bokeh && Bokeh.documents.length > 0")
    page.evaluate(_PAGE_PROBE)
    return pw, browser, page


def run_one(protocol: str, rate: float, seconds: float, page_url: str | None) -> dict[str, Any]:
    """One paced series through qf.live + watch; the figures of that run."""
    import quantem_flow as qf

    n_target = int(rate * seconds)
    cols = 100
    rows = max(4, n_target // cols)
    n = rows * cols
    ctx = mp.get_context("spawn")
    ports, done, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    target = _send_dectris if protocol == "dectris" else _send_merlin
    sender = ctx.Process(target=target, args=(n, rate, ports, go, done), daemon=True)
    sender.start()
    port, message_bytes = ports.get(timeout=300)
    center = CENTER_DECTRIS if protocol == "dectris" else CENTER_MERLIN
    with tempfile.TemporaryDirectory(prefix="qf-bench-live-") as tmp:
        acq = qf.live(
            f"tcp://127.0.0.1:{port}",
            scan_shape=(rows, cols),
            protocol=protocol,
            directory=tmp,
            timeout_s=10,
        )
        results = acq.watch(_build(center), every_s=EVERY_S)
        probe: Any = None
        if page_url is not None:
            probe = _open_page(page_url)
        go.set()
        report = acq.wait(timeout_s=600)
        try:
            final = results.wait(timeout_s=600)
        except Exception as exc:  # an incomplete series: not sustained, said so
            print(f"  {protocol} {rate:,.0f} Hz: {type(exc).__name__}: {str(exc)[:300]}")
            acq.close()
            sender.kill()
            return {"protocol": protocol, "rate": rate, "frames": n, "sustained": False,
                    "complete": False, "message_bytes": message_bytes}  # fmt: skip
        sent_last, sent_rate = done.get(timeout=60)
        sender.join(60)
        last_row = acq.row_arrival_time(rows - 1)
        finals = results.updates[-1]
        page_lat: list[float] = []
        if probe is not None:
            pw, browser, page = probe
            time.sleep(1.0)  # the page's last poll
            seen = page.evaluate("() => window.__qf")
            page_lat = [t - arrived for _, arrived, t in seen if arrived > 0]
            browser.close()
            pw.stop()
        # the final results against one offline pass over the same file
        offline = qf.compute(*_build(center)(acq.dataset()), progress=False)
        exact = all(
            np.array_equal(a.data, b.data, equal_nan=True)
            for a, b in zip(final, offline, strict=True)
        )
        lat = [u["ready"] - u["arrived"] for u in results.updates[:-1] if u["arrived"]]
        if os.environ.get("QF_BENCH_VERBOSE"):
            for u in results.updates:
                print(f"  update: {u['rows']} rows (+{u['new_rows']}) in {u['seconds']:.3f} s")
        land = (last_row or 0.0) - sent_last
        out = {
            "protocol": protocol,
            "rate": rate,
            "frames": n,
            "message_bytes": message_bytes,
            "complete": bool(report.complete),
            "land_s": land,
            "final_after_s": finals["ready"] - (last_row or finals["ready"]),
            "updates": len(results.updates),
            "lat_p50": statistics.median(lat) if lat else float("nan"),
            "lat_p95": float(np.percentile(lat, 95)) if lat else float("nan"),
            "page_p50": statistics.median(page_lat) if page_lat else float("nan"),
            "page_p95": float(np.percentile(page_lat, 95)) if page_lat else float("nan"),
            "page_n": len(page_lat),
            "exact": exact,
            "incremental": finals["incremental"],
            "sent_rate": sent_rate,
        }
        out["sustained"] = bool(
            out["complete"]
            and land < 0.5
            and out["final_after_s"] < 1.0
            and exact
            and sent_rate >= 0.98 * rate  # a sender held back by the receiver is no pass
        )
        acq.close()
    return out


def warm_up() -> None:
    """One small live-chunk and one raw pass first: the workers compile their kernels once a
    session (a microscopist's engine is warm when the scan starts); not timed."""
    import quantem_flow as qf
    from quantem_flow.streams.dectris_stream import decode_message, encode_image
    from quantem_flow.streams.live_chunks import (
        ChunkStoreWriter,
        open_live_folder,
        write_manifest,
    )

    frames = _dectris_frames(64)
    with tempfile.TemporaryDirectory(prefix="qf-warm-") as tmp:
        folder = Path(tmp)
        writer = ChunkStoreWriter(folder, 64)
        for i, f in enumerate(frames):
            message = decode_message(
                encode_image(f, series_id=1, image_id=i, compression="bslz4"), decode=False
            )
            writer.write(i, next(iter(message.data.values())).chunk)  # type: ignore[union-attr]
        writer.close()
        write_manifest(folder, {"storage": "bslz4-chunks", "scan_shape": [8, 8],
                                "frame_shape": [192, 192], "dtype": "<u2"})  # fmt: skip
        qf.compute(*_build(CENTER_DECTRIS)(open_live_folder(folder)), progress=False)
        merlin = _merlin_frames(64).reshape(8, 8, 256, 256)
        qf.compute(*_build(CENTER_MERLIN)(qf.open(merlin)), progress=False)


def main() -> None:
    """Run the rates for each protocol and print one table."""
    import quantem_flow as qf
    from quantem_flow.graphs.cluster import embedded_client, flow_dashboard_url

    ap = argparse.ArgumentParser()
    ap.add_argument("--protocol", nargs="+", default=["dectris", "merlin"])
    ap.add_argument("--rates", type=float, nargs="+", default=[5000.0, 10000.0])
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--page", action="store_true", help="also measure latency to the page")
    a = ap.parse_args()
    client = embedded_client()
    url = flow_dashboard_url(client) if a.page else None
    warm_up()
    print(f"embedded default: {len(client.scheduler_info()['workers'])} worker(s); page {url}")
    rows = []
    for protocol in a.protocol:
        for rate in a.rates:
            r = run_one(protocol, rate, a.seconds, url)
            rows.append(r)
            if "land_s" not in r:
                continue
            print(
                f"{protocol:8s} {rate:>7,.0f} Hz {r['frames']:>6} frames "
                f"({r['message_bytes']:,.0f} B/msg, sent at {r['sent_rate']:,.0f}/s): "
                f"{'SUSTAINED' if r['sustained'] else 'not sustained'}; complete={r['complete']} "
                f"last frame landed {r['land_s'] * 1e3:.0f} ms after sent; final results "
                f"{r['final_after_s'] * 1e3:.0f} ms after the last row; {r['updates']} updates, "
                f"row->results p50 {r['lat_p50'] * 1e3:.0f} ms p95 {r['lat_p95'] * 1e3:.0f} ms; "
                f"row->page p50 {r['page_p50'] * 1e3:.0f} ms p95 {r['page_p95'] * 1e3:.0f} ms "
                f"(n={r['page_n']}); exact={r['exact']}",
                flush=True,
            )
    qf.close_embedded_cluster()


if __name__ == "__main__":
    main()
