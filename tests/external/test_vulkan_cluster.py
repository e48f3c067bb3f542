"""A mixed local cluster: one CPU worker and one Vulkan worker (android/'s qf-vulkan-worker).

Placement keeps the persisted chunks and their kernels on the Vulkan worker (no chunk byte
moves), and a SIGKILL of the native process between passes leaves the Dask worker alive:
the bridge restarts the process and re-places the chunks from their reload recipes, and
the next pass is identical (the kill *during* a request is the same bridge path, tested
with the reference worker's crash hook in test_cluster.py).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import quantem_flow as qf
from quantem_flow.runtimes.external.vulkan import VulkanRuntime
from tests.conftest import probe_data
from tests.external.test_cluster import chunk_bytes_moved

CENTER = (8.6, 14.2)

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def vulkan_cluster() -> Iterator[tuple[Any, str]]:
    from distributed import Client

    from quantem_flow.graphs.cluster import start_local_cluster

    ok, why = VulkanRuntime.available()
    assert ok, why  # built by scripts/install-toolchains.sh; Vulkan runs here (lavapipe)
    cluster = start_local_cluster(
        workers=[{"runtimes": ["cpu"], "name": "cpu-0"}, {"runtimes": ["vulkan"], "name": "vk-0"}]
    )
    client = Client(cluster, set_as_default=False)
    try:
        workers = client.scheduler_info()["workers"]
        (vk,) = [a for a, w in workers.items() if "qf-runtime-vulkan" in w["resources"]]
        assert "qf-runtime-cpu" not in workers[vk]["resources"]
        assert workers[vk]["resources"]["qf-budget-vulkan"] > 0  # the hello's budget
        yield client, vk
    finally:
        client.close()
        cluster.close()


def _native_pid(dask_worker: Any) -> int:
    from quantem_flow.runtimes import get_runtime

    pid = get_runtime("vulkan").session.pid  # type: ignore[attr-defined]
    assert pid is not None
    return int(pid)


def test_persisted_on_vulkan_then_native_kill(
    rng: np.random.Generator, vulkan_cluster: Any
) -> None:
    client, vk = vulkan_cluster
    data = probe_data(rng, scan=(10, 6))
    (ref,) = qf.compute(
        qf.virtual_bf(qf.open(data), radius=4.5, center=CENTER), client="synchronous"
    )
    p = qf.open(data, chunk_rows=2).persist(client=client, backend="vulkan")
    try:
        assert {w for ws in p.resident.holders().values() for w in ws} == {vk}
        (bf,) = qf.compute(qf.virtual_bf(p, radius=4.5, center=CENTER), client=client)
        np.testing.assert_array_equal(bf.data, ref.data)
        assert {r["worker"] for r in bf.provenance.execution["chunks"]} == {vk}

        pid = client.run(_native_pid, workers=[vk])[vk]
        os.kill(pid, signal.SIGKILL)  # the native process only: the Dask worker stays

        # a kernel must run on the native process (not the radial index the first query built)
        with qf.config.set(radial_queries=False):
            (after,) = qf.compute(qf.virtual_bf(p, radius=4.5, center=CENTER), client=client)
        np.testing.assert_array_equal(after.data, ref.data)
        assert vk in client.scheduler_info()["workers"]  # the Dask worker survived
        assert client.run(_native_pid, workers=[vk])[vk] != pid  # a new native process
        details = after.provenance.execution["runtime_details"]
        assert max(d["restarts"] for d in details) >= 1
        assert max(d["re_placed_chunks"] for d in details) >= 1
        assert chunk_bytes_moved(client, p.resident.keys) == 0
    finally:
        p.release()


def _kill_during_next_request(dask_worker: Any) -> None:
    """In the Dask worker: SIGKILL the native process while a request is in flight."""
    import threading
    import time

    from quantem_flow.runtimes import get_runtime

    session = get_runtime("vulkan").session  # type: ignore[attr-defined]
    lock = session._lock

    def watch() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if lock.acquire(blocking=False):  # free: no request in flight
                lock.release()
                time.sleep(0.0005)
                continue
            pid = session.pid
            if pid is not None:
                os.kill(pid, signal.SIGKILL)
                dask_worker.qf_killed_pid = pid
                return

    threading.Thread(target=watch, daemon=True).start()


def test_native_kill_mid_pass_on_vulkan(rng: np.random.Generator, vulkan_cluster: Any) -> None:
    client, vk = vulkan_cluster
    data = probe_data(rng, scan=(40, 6))
    (ref,) = qf.compute(
        qf.virtual_bf(qf.open(data), radius=4.5, center=CENTER), client="synchronous"
    )
    p = qf.open(data, chunk_rows=1).persist(client=client, backend="vulkan")
    try:
        (before,) = qf.compute(qf.virtual_bf(p, radius=4.5, center=CENTER), client=client)
        restarts = max(d["restarts"] for d in before.provenance.execution["runtime_details"])
        client.run(_kill_during_next_request, workers=[vk])
        # a kernel must run on the native process (not the radial index the first query built)
        with qf.config.set(radial_queries=False):
            (after,) = qf.compute(qf.virtual_bf(p, radius=4.5, center=CENTER), client=client)
        killed = client.run(lambda dask_worker: getattr(dask_worker, "qf_killed_pid", None))
        assert killed[vk] is not None  # the native process was killed during a request
        np.testing.assert_array_equal(after.data, ref.data)
        assert vk in client.scheduler_info()["workers"]
        details = after.provenance.execution["runtime_details"]
        assert max(d["restarts"] for d in details) == restarts + 1  # this kill, reported
        assert max(d["re_placed_chunks"] for d in details) >= 1
    finally:
        p.release()
