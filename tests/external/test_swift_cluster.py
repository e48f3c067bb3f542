"""A mixed local cluster: one CPU worker and one Swift worker (native/'s qf-swift-worker).

``backend="swift"`` computes equal the CPU's; placement keeps the persisted chunks and
their kernels on the Swift worker (no chunk byte moves); a SIGKILL of the Swift process
*during* a request leaves the Dask worker alive: the bridge restarts the process, re-places
the chunks from their reload recipes and re-runs the request, and the result is identical,
with the restart in provenance.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import quantem_flow as qf
from quantem_flow.runtimes.external.swift import SwiftRuntime
from tests.conftest import probe_data
from tests.external.test_cluster import chunk_bytes_moved
from tests.swift_toolchain import require_swift_build

CENTER = (8.6, 14.2)

pytestmark = pytest.mark.cluster


def _queries(ds: Any) -> list[Any]:
    return [
        qf.virtual_bf(ds, radius=4.5, center=CENTER),
        qf.virtual_adf(ds, inner=7.0, center=CENTER),
        qf.center_of_mass(ds, center=CENTER),
    ]


@pytest.fixture(scope="module")
def swift_cluster() -> Iterator[tuple[Any, str, str]]:
    from distributed import Client

    from quantem_flow.graphs.cluster import start_local_cluster

    require_swift_build()
    ok, why = SwiftRuntime.available()
    assert ok, why
    cluster = start_local_cluster(
        workers=[{"runtimes": ["cpu"], "name": "cpu-0"}, {"runtimes": ["swift"], "name": "swift-0"}]
    )
    client = Client(cluster, set_as_default=False)
    try:
        workers = client.scheduler_info()["workers"]
        (sw,) = [a for a, w in workers.items() if "qf-runtime-swift" in w["resources"]]
        (cpu,) = [a for a, w in workers.items() if "qf-runtime-cpu" in w["resources"]]
        assert "qf-runtime-cpu" not in workers[sw]["resources"]
        assert workers[sw]["resources"]["qf-budget-swift"] > 0  # the hello's budget
        yield client, sw, cpu
    finally:
        client.close()
        cluster.close()


def _native_pid(dask_worker: Any) -> int:
    from quantem_flow.runtimes import get_runtime

    pid = get_runtime("swift").session.pid  # type: ignore[attr-defined]
    assert pid is not None
    return int(pid)


def test_swift_computes_what_the_cpu_computes_on_its_own_worker(
    rng: np.random.Generator, swift_cluster: Any
) -> None:
    client, sw, cpu = swift_cluster
    ds = qf.open(probe_data(rng, scan=(10, 5)), chunk_rows=2)
    out_sw = qf.compute(*_queries(ds), client=client, backend="swift")
    out_cpu = qf.compute(*_queries(ds), client=client, backend="cpu")
    for a, b in zip(out_sw[:2], out_cpu[:2], strict=True):  # integer data, 0/1 masks: exact
        np.testing.assert_array_equal(np.asarray(a.data), np.asarray(b.data))
    records = out_sw[0].provenance.execution["chunks"]
    assert {r["worker"] for r in records} == {sw}
    assert {r["runtime"] for r in records} == {"swift"}
    (detail,) = out_sw[0].provenance.execution["runtime_details"]
    assert detail["protocol"] == "qf-worker/1" and "quantem-flow-swift" in detail["implementation"]
    real = detail["accumulation"]["real"]  # float64 on the CPU backend, float32 on Metal
    assert real == ("float64" if detail["device"]["backend"] == "cpu-simd" else "float32")
    rtol = 1e-12 if real == "float64" else 1e-5
    np.testing.assert_allclose(out_sw[2].data, out_cpu[2].data, rtol=rtol)  # real weights
    assert {r["worker"] for r in out_cpu[0].provenance.execution["chunks"]} == {cpu}


def test_persisted_queries_stay_on_the_swift_worker_and_move_no_chunk_bytes(
    rng: np.random.Generator, swift_cluster: Any
) -> None:
    client, sw, _ = swift_cluster
    data = probe_data(rng, scan=(12, 7))
    ref = qf.compute(
        qf.virtual_bf(qf.open(data), radius=4.5, center=CENTER),
        qf.virtual_adf(qf.open(data), inner=7.0, center=CENTER),
        client="synchronous",
    )
    p = qf.open(data, chunk_rows=2).persist(client=client, backend="swift")
    try:
        assert {w for ws in p.resident.holders().values() for w in ws} == {sw}
        for _ in range(3):
            bf, adf = qf.compute(
                qf.virtual_bf(p, radius=4.5, center=CENTER),
                qf.virtual_adf(p, inner=7.0, center=CENTER),
                client=client,
            )
            np.testing.assert_array_equal(bf.data, ref[0].data)
            np.testing.assert_array_equal(adf.data, ref[1].data)
            recs = bf.provenance.execution["chunks"]
            assert {r["worker"] for r in recs} == {sw} and all(r["resident"] for r in recs)
            # the wide ring is read through its complement on the Swift worker too
            assert all(r["query"]["path"] == "complement" for r in recs)
        assert chunk_bytes_moved(client, p.resident.keys) == 0
    finally:
        p.release()


def _kill_during_next_request(dask_worker: Any) -> None:
    """In the Dask worker: SIGKILL the Swift process while a request is in flight."""
    import threading
    import time

    from quantem_flow.runtimes import get_runtime

    session = get_runtime("swift").session  # type: ignore[attr-defined]
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


def test_a_sigkill_of_the_swift_process_mid_pass_gives_the_identical_result(
    rng: np.random.Generator, swift_cluster: Any
) -> None:
    client, sw, _ = swift_cluster
    data = probe_data(rng, scan=(40, 6))
    ref = qf.compute(*_queries(qf.open(data)), client="synchronous")
    p = qf.open(data, chunk_rows=1).persist(client=client, backend="swift")
    try:
        before = qf.compute(*_queries(p), client=client)
        restarts = max(d["restarts"] for d in before[0].provenance.execution["runtime_details"])
        pid = client.run(_native_pid, workers=[sw])[sw]
        client.run(_kill_during_next_request, workers=[sw])
        after = qf.compute(*_queries(p), client=client)
        killed = client.run(lambda dask_worker: getattr(dask_worker, "qf_killed_pid", None))
        assert killed[sw] == pid  # the Swift process was killed during a request
        assert client.run(_native_pid, workers=[sw])[sw] != pid  # a new Swift process
        assert sw in client.scheduler_info()["workers"]  # the Dask worker survived
        for a, b in zip(after, before, strict=True):  # identical to the pass before the kill
            np.testing.assert_array_equal(np.asarray(a.data), np.asarray(b.data))
        for a, b in zip(after[:2], ref[:2], strict=True):  # and to the CPU reference
            np.testing.assert_array_equal(np.asarray(a.data), np.asarray(b.data))
        details = after[0].provenance.execution["runtime_details"]
        assert max(d["restarts"] for d in details) == restarts + 1  # this kill, reported
        assert max(d["re_placed_chunks"] for d in details) >= 1
        assert chunk_bytes_moved(client, p.resident.keys) == 0
    finally:
        p.release()
