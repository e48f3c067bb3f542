"""A multi-host cluster on this machine: network namespaces joined by a bridge.

The scheduler, two workers and the client each run in a network namespace
of their own (``ip netns``), connected through veth pairs to a bridge in a
hub namespace, with addresses 10.77.0.0/24: traffic flows only between
these test hosts.  Mid-pass one worker host is cut off (its veth link set
down); the pass must still finish with the same result, its chunks
recomputed on the other host, and the scheduler must report the loss.

Needs root and ``ip``; skipped otherwise.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=20)


def _netns_available() -> bool:
    if shutil.which("ip") is None or os.geteuid() != 0:
        return False
    name = f"qfp{secrets.token_hex(3)}"
    try:
        _ip("netns", "add", name)
    except (subprocess.CalledProcessError, OSError):
        return False
    _ip("netns", "del", name)
    return True


HOSTS = {"sched": "10.77.0.1", "w1": "10.77.0.2", "w2": "10.77.0.3", "cli": "10.77.0.4"}


@pytest.fixture
def hosts() -> Iterator[dict[str, str]]:
    """Namespaces ``{host: netns name}`` wired to one bridge; removed afterwards."""
    if not _netns_available():
        pytest.skip("needs root and 'ip netns'")
    tag = secrets.token_hex(2)
    ns = {h: f"qf{tag}{h}" for h in [*HOSTS, "hub"]}
    try:
        for name in ns.values():
            _ip("netns", "add", name)
        _ip("-n", ns["hub"], "link", "add", "br0", "type", "bridge")
        _ip("-n", ns["hub"], "link", "set", "br0", "up")
        for host, addr in HOSTS.items():
            inner, outer = f"e{tag}{host}", f"v{tag}{host}"
            _ip("link", "add", outer, "type", "veth", "peer", "name", inner)
            _ip("link", "set", outer, "netns", ns["hub"])
            _ip("link", "set", inner, "netns", ns[host])
            _ip("-n", ns["hub"], "link", "set", outer, "master", "br0", "up")
            _ip("-n", ns[host], "addr", "add", f"{addr}/24", "dev", inner)
            _ip("-n", ns[host], "link", "set", inner, "up")
            _ip("-n", ns[host], "link", "set", "lo", "up")
        yield {**ns, "tag": tag}
    finally:
        for name in ns.values():
            subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=20)


CLIENT = textwrap.dedent(
    """
    import json, sys, time
    import numpy as np
    from distributed import Client
    import quantem_flow as qf
    from quantem_flow.dataset import Dataset4D
    from tests.slow_source import SlowArraySource

    if __name__ == "__main__":
        data = np.load(sys.argv[2])
        client = Client(sys.argv[1], timeout=30)
        client.wait_for_workers(2, timeout=60)
        workers = sorted(client.scheduler_info()["workers"])
        print(json.dumps({"event": "workers", "workers": workers}), flush=True)
        ds = Dataset4D(SlowArraySource(data, delay_s=0.4), chunk_rows=1)
        t0 = time.time()
        bf, adf = qf.compute(
            qf.virtual_bf(ds, radius=4, center=(8, 8)),
            qf.virtual_adf(ds, inner=6, center=(8, 8)),
            client=client,
            progress=False,
        )
        used = sorted({r["worker"] for r in bf.provenance.execution["chunks"]})
        print(json.dumps({"event": "done", "bf": bf.data.tolist(), "adf": adf.data.tolist(),
                          "used": used, "seconds": time.time() - t0,
                          "after": sorted(client.scheduler_info()["workers"]),
                          "departed": bf.provenance.execution["workers_departed"],
                          "scheduler": bf.provenance.execution["scheduler"]}), flush=True)
        client.close()
    """
)


def test_cutting_a_worker_host_off_mid_pass(hosts: dict[str, str], tmp_path: Path) -> None:
    import quantem_flow as qf

    data = np.random.default_rng(7).poisson(3, size=(24, 5, 16, 16)).astype(np.uint16)
    np.save(tmp_path / "d.npy", data)
    (tmp_path / "client.py").write_text(CLIENT)
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "DASK_DISTRIBUTED__SCHEDULER__WORKER_TTL": "6s",
        "DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT": "5s",
    }
    procs: list[subprocess.Popen[str]] = []

    def start(host: str, *argv: str, log: str) -> subprocess.Popen[str]:
        fh = open(tmp_path / log, "w")  # noqa: SIM115 - closed with the process
        p = subprocess.Popen(
            ["ip", "netns", "exec", hosts[host], *argv],
            cwd=ROOT,
            env=env,
            stdout=fh if host != "cli" else subprocess.PIPE,
            stderr=fh,
            text=True,
        )
        procs.append(p)
        return p

    sched = f"tcp://{HOSTS['sched']}:8786"
    try:
        start(
            "sched",
            sys.executable,
            "-m",
            "distributed.cli.dask_scheduler",
            "--host",
            HOSTS["sched"],
            "--port",
            "8786",
            "--dashboard-address",
            "127.0.0.1:0",
            "--preload",
            "quantem_flow.graphs.scheduler_plugin",
            log="scheduler.log",
        )
        for w in ("w1", "w2"):
            start(
                w,
                sys.executable,
                "-m",
                "quantem_flow",
                "worker",
                sched,
                "--host",
                HOSTS[w],
                "--runtimes",
                "cpu",
                "--nthreads",
                "1",
                "--memory-limit",
                "1 GiB",
                "--name",
                w,
                log=f"{w}.log",
            )
        client = start(
            "cli",
            sys.executable,
            str(tmp_path / "client.py"),
            sched,
            str(tmp_path / "d.npy"),
            log="client.log",
        )
        assert client.stdout is not None
        first = json.loads(client.stdout.readline() or "{}")
        assert first.get("event") == "workers", (tmp_path / "client.log").read_text()[-3000:]
        time.sleep(3.0)  # a few chunks are done on each host
        _ip("-n", hosts["hub"], "link", "set", f"v{hosts['tag']}w2", "down")  # cut w2 off
        out, _ = client.communicate(timeout=240)
        done = json.loads(out.strip().splitlines()[-1])
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
    (bf_ref, adf_ref) = qf.compute(
        qf.virtual_bf(qf.open(data), radius=4, center=(8, 8)),
        qf.virtual_adf(qf.open(data), inner=6, center=(8, 8)),
        client="synchronous",
    )
    np.testing.assert_array_equal(np.asarray(done["bf"]), bf_ref.data)
    np.testing.assert_array_equal(np.asarray(done["adf"]), adf_ref.data)
    assert done["seconds"] > 3.0, "the pass ended before w2 was cut off"
    w2 = next(a for a in first["workers"] if HOSTS["w2"] in a)
    assert w2 not in done["after"], "the cut-off worker is still listed by the scheduler"
    log = (tmp_path / "scheduler.log").read_text()
    assert "Remove worker" in log and HOSTS["w2"] in log, log[-3000:]
    # the loss is reported in the pass's provenance (and logged by the placement plugin)
    lost = [d for d in done["departed"] if d["lost"]]
    assert [d["worker"] for d in lost] == [w2], done["departed"]
    assert f"1 worker(s) lost during the pass: {w2}" in done["scheduler"], done["scheduler"]
    assert f"{w2}" in log and "will run again on the" in log, log[-3000:]
