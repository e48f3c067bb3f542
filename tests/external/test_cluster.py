"""A mixed local cluster: one CPU worker and one external (reference-worker) worker.

The external worker is a Dask worker whose runtime is a bridge to a child
process speaking qf-worker/1 (the NumPy reference worker, so Node is not
needed); the same path serves ``webgpu``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import quantem_flow as qf
from tests.conftest import probe_data

CENTER = (8.6, 14.2)
EXT = "external-reference"


def _queries(ds: Any) -> list[Any]:
    return [
        qf.virtual_bf(ds, radius=4.5, center=CENTER),
        qf.virtual_adf(ds, inner=7.0, center=CENTER),
        qf.center_of_mass(ds, center=CENTER),
    ]


def chunk_bytes_moved(client: Any, keys: Any) -> int:
    """Bytes of the given (resident chunk) keys any worker fetched from another, so far."""
    wanted = {str(k) for k in keys}

    def moved(dask_worker: Any) -> int:
        return int(
            sum(
                n
                for t in dask_worker.transfer_incoming_log
                for k, n in t.get("keys", {}).items()
                if str(k) in wanted
            )
        )

    return int(sum(client.run(moved).values()))


def _incoming_bytes(client: Any) -> int:
    def total(dask_worker: Any) -> int:
        return int(sum(t.get("total", 0) for t in dask_worker.transfer_incoming_log))

    return sum(client.run(total).values())


@pytest.fixture(scope="module")
def mixed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, str, str, Path]]:
    from distributed import Client

    from quantem_flow.graphs.cluster import start_local_cluster

    crash = tmp_path_factory.mktemp("ext") / "crash-now"
    cluster = start_local_cluster(
        workers=[
            {"runtimes": ["cpu"], "name": "cpu-0"},
            {
                "runtimes": [EXT],
                "name": "ext-0",
                "env": {"QF_REFERENCE_WORKER_ARGS": f"--crash-file {crash}"},
            },
        ]
    )
    client = Client(cluster, set_as_default=False)
    workers = client.scheduler_info()["workers"]
    ext = [a for a, w in workers.items() if f"qf-runtime-{EXT}" in w["resources"]]
    cpu = [a for a, w in workers.items() if "qf-runtime-cpu" in w["resources"]]
    try:
        assert len(ext) == 1 and len(cpu) == 1 and ext != cpu
        yield client, ext[0], cpu[0], crash
    finally:
        client.close()
        cluster.close()


@pytest.mark.cluster
def test_external_worker_advertises_the_hello_budget(mixed: Any) -> None:
    client, ext, _, _ = mixed
    resources = client.scheduler_info()["workers"][ext]["resources"]
    assert resources[f"qf-runtime-{EXT}"] == 1
    assert resources[f"qf-budget-{EXT}"] == 1 << 30  # memory_budget_bytes of the hello
    assert "qf-runtime-cpu" not in resources


@pytest.mark.cluster
def test_external_tasks_land_only_on_the_external_worker(
    rng: np.random.Generator, mixed: Any
) -> None:
    client, ext, cpu, _ = mixed
    data = probe_data(rng, scan=(10, 5))
    ds = qf.open(data, chunk_rows=2)
    out_ext = qf.compute(*_queries(ds), client=client, backend=EXT)
    out_cpu = qf.compute(*_queries(ds), client=client, backend="cpu")
    for a, b in zip(out_ext[:2], out_cpu[:2], strict=True):  # integer masks: exact
        np.testing.assert_array_equal(np.asarray(a.data), np.asarray(b.data))
    np.testing.assert_allclose(out_ext[2].data, out_cpu[2].data, rtol=1e-12)  # real weights
    records = out_ext[0].provenance.execution["chunks"]
    assert {r["worker"] for r in records} == {ext}
    assert {r["runtime"] for r in records} == {EXT}
    (detail,) = out_ext[0].provenance.execution["runtime_details"]
    assert detail["protocol"] == "qf-worker/1" and "reference worker" in detail["implementation"]
    assert {r["worker"] for r in out_cpu[0].provenance.execution["chunks"]} == {cpu}


@pytest.mark.cluster
def test_persisted_queries_move_no_chunk_bytes(rng: np.random.Generator, mixed: Any) -> None:
    client, ext, _, _ = mixed
    data = probe_data(rng, scan=(12, 7))
    p = qf.open(data, chunk_rows=2).persist(client=client, backend=EXT)
    try:
        assert {w for ws in p.resident.holders().values() for w in ws} == {ext}

        def held(dask_worker: Any) -> dict[str, int]:
            return dict(dask_worker.data.resident_bytes())

        assert any(k.startswith("external") for k in client.run(held)[ext])
        (ref,) = qf.compute(
            qf.virtual_bf(qf.open(data), radius=4.5, center=CENTER), client="synchronous"
        )
        before = _incoming_bytes(client)
        for _ in range(3):
            bf, *_ = qf.compute(*_queries(p), client=client)
            np.testing.assert_array_equal(bf.data, ref.data)
            recs = bf.provenance.execution["chunks"]
            assert {r["worker"] for r in recs} == {ext}
            assert all(r["resident"] and r["residency"] == f"external:{EXT}" for r in recs)
        moved = _incoming_bytes(client) - before
        assert moved < data.nbytes // 6, moved  # only small partials travel
        assert chunk_bytes_moved(client, p.resident.keys) == 0  # no chunk ever moved
    finally:
        p.release()

    def stats(dask_worker: Any) -> dict[str, Any]:
        from quantem_flow.runtimes import get_runtime

        return get_runtime(EXT).stats()  # type: ignore[attr-defined,no-any-return]

    deadline = time.monotonic() + 20  # forgetting the keys releases the handles
    while client.run(stats, workers=[ext])[ext]["resident_bytes"]["dense"]:
        assert time.monotonic() < deadline, "the released dataset's handles are still held"
        time.sleep(0.2)


@pytest.mark.cluster
def test_native_kill_mid_pass_gives_identical_result(rng: np.random.Generator, mixed: Any) -> None:
    client, ext, _, crash = mixed
    data = probe_data(rng, scan=(8, 5))
    p = qf.open(data, chunk_rows=2).persist(client=client, backend=EXT)
    try:
        (before,) = qf.compute(qf.virtual_bf(p, radius=4.5, center=CENTER), client=client)
        crash.touch()  # the native process SIGKILLs itself on the next run
        # a kernel must run on the native process (not the radial index the first query built)
        with qf.config.set(radial_queries=False):
            (after,) = qf.compute(qf.virtual_bf(p, radius=4.5, center=CENTER), client=client)
        assert not crash.exists()
        np.testing.assert_array_equal(after.data, before.data)
        assert ext in client.scheduler_info()["workers"]  # the Dask worker survived
        details = after.provenance.execution["runtime_details"]
        assert max(d["restarts"] for d in details) == 1  # reported in provenance
        assert max(d["re_placed_chunks"] for d in details) >= 1
    finally:
        crash.unlink(missing_ok=True)
        p.release()
