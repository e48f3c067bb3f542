"""Fault handling, timed: a stall to recovery, a supervisor giving up to the client's error,
and the bridge's peak RSS under a hostile header (issue 23).

- ``stall``: the reference worker through the bridge answers a frame pass after a 0.5 s
  run delay; during one pass its process is SIGSTOPped.  Measured: that pass's wall time
  (detection after ``external_stall_grace_s``, kill, restart, re-placement, re-run) against
  an undisturbed pass, medians of ``--repeat``.
- ``gave-up``: a local cluster of one worker program whose worker is SIGKILLed until the
  supervisor stops restarting it (4 exits in 300 s); then one BF compute on a 4 x 4 scan.
  Measured: from the supervisor's report reaching the scheduler (polled) and from the
  compute's start to the client's ``PlacementError``.
- ``hostile``: in a fresh process, a bridge connection to a fake worker that writes a frame
  header announcing a 1 GiB body and then nothing; the peak RSS of the bridge's process
  before and after the header arrived (``ru_maxrss``).

Usage::

    python benchmarks/bench_faults.py [--repeat 3] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import threading
import time
from typing import Any

import numpy as np

HOSTILE_WORKER = r"""
import struct, sys, time
h = b'{"buffers":[1073741824],"id":0,"type":"hello"}'
pad = bytes(-(16 + len(h)) % 8)
sys.stdout.buffer.write(b"QFW1" + struct.pack("<IQ", len(h), 1 << 30) + h + pad)
sys.stdout.buffer.write(bytes(4096))  # a little of the announced body, then nothing
sys.stdout.flush()
time.sleep(30)
"""

HOSTILE_BRIDGE = r"""
import json, resource, sys, time
from quantem_flow.runtimes.external.transport import PipeConnection
from quantem_flow.errors import ExternalWorkerTimeoutError
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
conn = PipeConnection([sys.executable, "-c", sys.argv[1]], name="hostile",
                      max_message_bytes=2 << 30)
try:
    conn.recv(3.0, message_type="hello")
except ExternalWorkerTimeoutError:
    pass
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
conn.close(timeout=0.5)
print(json.dumps({"before_kib": before, "after_kib": after}))
"""


def bench_stall(repeat: int) -> dict[str, Any]:
    from quantem_flow.representations.chunk import chunk_of
    from quantem_flow.runtimes import get_runtime
    from quantem_flow.runtimes.external.workers import register_reference_runtime

    register_reference_runtime("bench-stall", extra_args=("--run-delay", "0.5"))
    rt = get_runtime("bench-stall")
    block = np.random.default_rng(0).integers(0, 100, size=(4, 8, 16, 16)).astype(np.uint16)
    h = rt.put(chunk_of("dense", block), reload=lambda: block)
    w = np.ones((2, 256))
    normal, stalled = [], []
    try:
        for _ in range(repeat):
            t0 = time.perf_counter()
            rt.run_frame_pass(h, w, want_sum=True, want_max=False)
            normal.append(time.perf_counter() - t0)

            def stop(lock: Any = rt.session._lock) -> None:
                while True:
                    if lock.acquire(blocking=False):
                        lock.release()
                        time.sleep(0.0005)
                        continue
                    time.sleep(0.05)
                    os.kill(rt.session.pid, signal.SIGSTOP)
                    return

            threading.Thread(target=stop, daemon=True).start()
            t0 = time.perf_counter()
            rt.run_frame_pass(h, w, want_sum=True, want_max=False)
            stalled.append(time.perf_counter() - t0)
        return {
            "normal_pass_s": statistics.median(normal),
            "stalled_pass_s": statistics.median(stalled),
            "stall_to_recovery_s": statistics.median(stalled) - statistics.median(normal),
            "grace_s": rt.session._conn.stall_grace_s if rt.session._conn else None,
            "stalls": rt.describe()["stalls"],
        }
    finally:
        rt.close()


def bench_gave_up() -> dict[str, Any]:
    from distributed import Client

    import quantem_flow as qf
    from quantem_flow.errors import PlacementError
    from quantem_flow.graphs.cluster import MAX_RESTARTS, start_local_cluster
    from quantem_flow.graphs.scheduler_plugin import PLUGIN_NAME

    cluster = start_local_cluster(n_workers=1, threads_per_worker=1, memory_limit="1 GiB")
    client = Client(cluster, set_as_default=False)

    def gave_up(dask_scheduler: Any) -> bool:
        plugin = dask_scheduler.plugins[PLUGIN_NAME]
        return any(r.state == "gave-up" for r in plugin.stuck.workers.values())

    try:
        client.wait_for_workers(1, timeout=60)
        for i in range(MAX_RESTARTS + 1):
            pids = client.run(os.getpid)
            (victim,) = pids
            os.kill(pids[victim], signal.SIGKILL)
            while victim in client.scheduler_info()["workers"]:
                time.sleep(0.05)
            if i < MAX_RESTARTS:
                while len(client.scheduler_info()["workers"]) != 1:
                    time.sleep(0.05)
        while not client.run_on_scheduler(gave_up):
            time.sleep(0.05)
        t_report = time.perf_counter()
        ds = qf.open(np.ones((4, 4, 8, 8), dtype=np.uint16))
        t0 = time.perf_counter()
        try:
            qf.compute(qf.virtual_bf(ds, radius=2.0, center=(4.0, 4.0)), client=client)
            raised = None
        except PlacementError as exc:
            raised = str(exc)[:200]
        t1 = time.perf_counter()
        return {
            "compute_to_error_s": t1 - t0,
            "gave_up_report_to_error_s": t1 - t_report,
            "error": raised,
        }
    finally:
        client.close()
        cluster.close()


def bench_hostile() -> dict[str, Any]:
    run = subprocess.run(
        [sys.executable, "-c", HOSTILE_BRIDGE, HOSTILE_WORKER],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    r: dict[str, Any] = json.loads(run.stdout.strip().splitlines()[-1])
    r["growth_mib"] = (r["after_kib"] - r["before_kib"]) / 1024
    return r


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    print(f"{platform.machine()}, {os.cpu_count()} CPUs, Python {sys.version.split()[0]}")
    out = {
        "stall": bench_stall(args.repeat),
        "hostile": bench_hostile(),
        "gave_up": bench_gave_up(),
    }
    print(json.dumps(out, indent=1))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
