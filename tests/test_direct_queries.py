"""Queries on resident chunks sent straight to their workers (graphs/query_service.py)."""

from __future__ import annotations

import asyncio
import os
import pickle
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

import quantem_flow as qf
from quantem_flow.errors import RuntimeUnavailableError
from quantem_flow.graphs.lowering import lower_pass
from quantem_flow.graphs.query_service import _answer
from quantem_flow.graphs.resident_query import run_resident_group
from quantem_flow.graphs.tasks import combine_partials
from quantem_flow.representations.chunk import chunk_of
from tests.conftest import five_operators, probe_data

CENTER = (8.6, 14.2)


@pytest.mark.cluster
def test_direct_and_graph_routes_give_the_same_results(
    rng: np.random.Generator, cluster_client: Any
) -> None:
    data = probe_data(rng, scan=(10, 7))
    p = qf.open(data, chunk_rows=1).persist(client=cluster_client)
    try:
        direct = qf.compute(*five_operators(p), client=cluster_client)
        with qf.config.set(direct_queries=False):
            graph = qf.compute(*five_operators(p), client=cluster_client)
        for a, b in zip(direct, graph, strict=True):
            np.testing.assert_array_equal(a.data, b.data)  # bit for bit, CoM included
            assert a.units == b.units
        ex_d, ex_g = direct[0].provenance.execution, graph[0].provenance.execution
        assert ex_d["query_route"]["path"] == "direct"
        assert ex_d["query_route"]["workers"] == 2
        assert set(ex_d["query_route"]["worker_s"]) == set(ex_d["workers"])
        assert ex_g["query_route"] == {"path": "graph", "why": "qf.config direct_queries is off"}
        assert ex_d["content_digest"] == ex_g["content_digest"]
        assert [r["worker"] for r in ex_d["chunks"]] == [r["worker"] for r in ex_g["chunks"]]
        assert all(r["resident"] for r in ex_d["chunks"])
    finally:
        p.release()


@pytest.mark.cluster
def test_a_kernel_error_on_the_direct_route_keeps_its_type(
    rng: np.random.Generator, cluster_client: Any
) -> None:
    data = probe_data(rng, scan=(4, 5))
    p = qf.open(data, chunk_rows=2).persist(client=cluster_client)
    try:
        lowered = lower_pass(
            p,
            {"w": np.ones(data.shape[2:])},
            want_sum=False,
            want_max=False,
            runtime="cpu",
            resident=p.resident.graph_refs(),
        )
        spec = dataclass_replace(lowered.spec, runtime="no-such-runtime")  # get_runtime raises
        from quantem_flow.graphs.query_service import run_direct

        route = p.resident.route()
        assert route is not None
        with pytest.raises(RuntimeUnavailableError, match="no-such-runtime"):
            run_direct(cluster_client, spec, route, p.resident.keys)
    finally:
        p.release()


@pytest.mark.cluster
@pytest.mark.slow
def test_a_holder_killed_between_queries_falls_back_to_the_graph_and_back(
    rng: np.random.Generator,
) -> None:
    from distributed import Client

    from quantem_flow.graphs.cluster import start_local_cluster

    data = probe_data(rng, scan=(12, 5))
    (ref,) = qf.compute(
        qf.virtual_adf(qf.open(data), inner=7.0, center=CENTER), client="synchronous"
    )
    cluster = start_local_cluster(n_workers=2, threads_per_worker=1)
    client = Client(cluster, set_as_default=False)
    try:
        p = qf.open(data, chunk_rows=1).persist(client=client)
        (first,) = qf.compute(qf.virtual_adf(p, inner=7.0, center=CENTER), client=client)
        assert first.provenance.execution["query_route"]["path"] == "direct"
        victim = first.provenance.execution["chunks"][0]["worker"]
        pids = client.run(os.getpid)
        os.kill(pids[victim], signal.SIGKILL)
        (after,) = qf.compute(qf.virtual_adf(p, inner=7.0, center=CENTER), client=client)
        np.testing.assert_array_equal(after.data, ref.data)
        route = after.provenance.execution["query_route"]
        assert route["path"] == "graph", route  # the kept route no longer holds: why is said
        assert "direct route failed" in route["why"] or "holder is unknown" in route["why"]
        # the route comes back once the restarted worker serves queries again (its plugin
        # registers a moment after it joins: under load the next query may still take the
        # graph, exactly, and say why)
        deadline = time.monotonic() + 30
        while True:
            (again,) = qf.compute(qf.virtual_adf(p, inner=7.0, center=CENTER), client=client)
            np.testing.assert_array_equal(again.data, ref.data)
            route = again.provenance.execution["query_route"]
            if route["path"] == "direct" or time.monotonic() > deadline:
                break
            assert route.get("why"), route
            time.sleep(0.5)
        assert route["path"] == "direct", route
        assert victim not in {r["worker"] for r in again.provenance.execution["chunks"]}
    finally:
        client.close()
        cluster.close()


def _fake_worker(chunks: dict[Any, Any]) -> SimpleNamespace:
    return SimpleNamespace(
        data=chunks,
        address="tcp://127.0.0.1:1",
        name="w",
        executors={"default": ThreadPoolExecutor(2)},
    )


def test_the_handler_answers_missing_chunks_unreadable_requests_and_errors(
    rng: np.random.Generator,
) -> None:
    from distributed.protocol.pickle import dumps, loads

    data = probe_data(rng, scan=(4, 5))
    p = qf.open(data, chunk_rows=2).persist(client="synchronous")
    lowered = lower_pass(
        p,
        {"w": np.ones(data.shape[2:])},
        want_sum=True,
        want_max=False,
        runtime="cpu",
        resident=p.resident.graph_refs(),
    )
    spec = dumps(lowered.spec)
    chunk = chunk_of("dense", data[:2], scan_slice=((0, 2), (0, 5)))
    worker = _fake_worker({("k", 0): chunk})
    ok = asyncio.run(_answer(worker, spec, dumps([((0,), [("k", 0)])])))
    assert ok["status"] == "ok"
    part = loads(ok["partial"])  # a pickled spec (an older client): a pickled answer
    assert [r["worker"] for r in part.records] == ["tcp://127.0.0.1:1"]  # named, not "in-process"
    np.testing.assert_array_equal(
        part.blocks[0][1][:, :, 0], data[:2].sum(axis=(2, 3), dtype=np.int64)
    )
    missing = asyncio.run(_answer(worker, spec, dumps([((1,), [("k", 1)])])))
    assert missing["status"] == "missing" and "('k', 1)" in missing["why"]
    unreadable = asyncio.run(_answer(worker, b"not a pickle", b"x"))
    assert unreadable["status"] == "unreadable"
    broken = dumps(dataclass_replace(lowered.spec, runtime="no-such-runtime"))
    error = asyncio.run(_answer(worker, broken, dumps([((0,), [("k", 0)])])))
    assert error["status"] == "error"
    exc = pickle.loads(error["error"])
    assert isinstance(exc, RuntimeUnavailableError) and "no-such-runtime" in str(exc)
    p.release()


def dataclass_replace(obj: Any, **changes: Any) -> Any:
    import dataclasses

    return dataclasses.replace(obj, **changes)


def test_a_route_needs_every_holder_to_serve_queries() -> None:
    from quantem_flow.graphs.persist import ResidentChunks
    from quantem_flow.runtimes import BackendChoice

    refs = [SimpleNamespace(key=("load", i)) for i in range(4)]
    res = ResidentChunks(
        refs=refs,
        runtime="cpu",
        representation="dense",
        storage_schema="dense",
        backend=BackendChoice("auto", "cpu", "test"),
        scheduler="tcp://s",
        client=object(),
        loaded_bytes=0,
        resident_bytes=0,
        load_s=0.0,
    )
    who = {str(("load", i)): ["tcp://a" if i < 2 else "tcp://b"] for i in range(4)}
    res._placed = {"who_has": who, "nthreads": {"tcp://a": 2, "tcp://b": 1}, "served": ["tcp://a"]}
    assert res.route() is None  # tcp://b has no quantem-flow plugin: no handler
    res._placed["served"] = ["tcp://a", "tcp://b"]
    assert res.route() == {"tcp://a": [[0], [1]], "tcp://b": [[2, 3]]}
    res.forget_route()
    assert res._placed is None


def test_resident_chunks_in_uneven_groups_run_once_each_and_sum_in_chunk_order(
    rng: np.random.Generator,
) -> None:
    from distributed.protocol.pickle import dumps

    data = probe_data(rng, scan=(9, 4)) * rng.random((9, 4, 1, 1))  # float64: sums round
    p = qf.open(data, chunk_rows=1).persist(client="synchronous")
    lowered = lower_pass(
        p,
        {"w": np.ones(data.shape[2:])},
        want_sum=True,
        want_max=True,
        runtime="cpu",
        resident=p.resident.graph_refs(),
    )
    chunks = {
        ("k", i): chunk_of("dense", data[i : i + 1], scan_slice=((i, i + 1), (0, 4)))
        for i in range(9)
    }
    worker = _fake_worker(chunks)
    # two groups as the client cuts them, one thread's worth each, uneven on purpose
    groups = [((0, 1, 2, 3, 4, 5, 6), [("k", i) for i in range(7)]), ((7, 8), [("k", 7), ("k", 8)])]
    ok = asyncio.run(_answer(worker, lowered.spec, dumps({"groups": groups})))
    assert ok["status"] == "ok"
    parts = ok["parts"].data
    assert [i for i, _ in parts] == [0, 7]  # one partial per group, by its first chunk
    for (_, part), (indices, keys) in zip(parts, groups, strict=True):
        assert [r["chunk"] for r in part.records] == list(indices)  # in chunk order
        # the group's sums added as the graph's task for that group adds them, to the bit
        task = run_resident_group(lowered.spec, indices, *(chunks[k] for k in keys))
        assert np.ravel(part.pattern_sum).tobytes() == np.ravel(task.pattern_sum).tobytes()
    whole = combine_partials(*(part for _, part in parts))
    blocks = dict(whole.blocks)
    sums = np.concatenate([blocks[(i, i + 1)] for i in range(9)])
    np.testing.assert_allclose(sums[:, :, 0], data.astype(np.float64).sum(axis=(2, 3)))
    np.testing.assert_array_equal(np.ravel(whole.pattern_max), data.max(axis=(0, 1)).ravel())
    p.release()


@pytest.mark.cluster
def test_float_sums_on_the_direct_route_have_the_graphs_bits(
    rng: np.random.Generator, cluster_client: Any
) -> None:
    data = probe_data(rng, scan=(12, 5)) * rng.random((12, 5, 1, 1))  # float64: sums round
    p = qf.open(data, chunk_rows=1).persist(client=cluster_client)
    try:
        direct = qf.compute(qf.sum_diffraction(p), client=cluster_client)
        with qf.config.set(direct_queries=False):
            graph = qf.compute(qf.sum_diffraction(p), client=cluster_client)
        assert direct[0].provenance.execution["query_route"]["path"] == "direct"
        assert graph[0].provenance.execution["query_route"]["path"] == "graph"
        assert np.asarray(direct[0].data).tobytes() == np.asarray(graph[0].data).tobytes()
    finally:
        p.release()
