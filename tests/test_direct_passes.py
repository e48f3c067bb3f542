"""File passes sent straight to a one-worker cluster's worker (graphs/direct_pass.py)."""

from __future__ import annotations

import asyncio
import dataclasses
import pickle
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

import quantem_flow as qf
from quantem_flow.errors import CorruptChunkError, RuntimeUnavailableError
from quantem_flow.graphs.capabilities import MEMORY_PREFIX, RUNTIME_PREFIX
from quantem_flow.graphs.direct_pass import (
    PASS_HANDLER,
    _answer,
    direct_pass_blocker,
    forget_pass_route,
    install_pass_handler,
    pass_route,
)
from quantem_flow.graphs.lowering import lower_pass
from quantem_flow.graphs.tasks import combine_partials
from tests.conftest import five_operators, probe_data

CENTER = (8.6, 14.2)


def _npy(tmp_path: Path, data: np.ndarray) -> str:
    path = tmp_path / "scan.npy"
    np.save(path, data)
    return str(path)


@pytest.mark.cluster
def test_a_file_pass_goes_direct_and_equals_the_graph_and_one_process(
    rng: np.random.Generator, tmp_path: Path, one_worker_client: Any
) -> None:
    data = probe_data(rng, scan=(11, 6))
    ds = qf.open(_npy(tmp_path, data), chunk_rows=2)
    direct = qf.compute(*five_operators(ds), client=one_worker_client, progress=False)
    with qf.config.set(direct_passes=False):
        graph = qf.compute(*five_operators(ds), client=one_worker_client, progress=False)
    here = qf.compute(*five_operators(ds), client="synchronous")
    for a, b, c in zip(direct, graph, here, strict=True):
        np.testing.assert_array_equal(a.data, b.data)  # bit for bit, CoM and patterns included
        np.testing.assert_array_equal(a.data, c.data)
        assert a.units == b.units
    ex_d, ex_g = direct[0].provenance.execution, graph[0].provenance.execution
    route = ex_d["query_route"]
    assert route["path"] == "direct" and route["workers"] == 1, route
    (worker,) = route["worker_s"]
    assert {r["worker"] for r in ex_d["chunks"]} == {worker}  # named, not "in-process"
    assert ex_g["query_route"] == {"path": "graph", "why": "qf.config direct_passes is off"}
    assert ex_d["content_digest"] == ex_g["content_digest"]
    assert sorted(r["chunk"] for r in ex_d["chunks"]) == list(range(len(ds.chunks)))
    assert ex_d["read_once"] and ex_d["weights_travel"] == "in the pass message to the worker"
    assert ex_d["tasks"] == ex_g["tasks"]  # the same groups, their work shared the same way


@pytest.mark.cluster
def test_what_keeps_a_file_pass_on_the_graph_is_said(
    rng: np.random.Generator, tmp_path: Path, one_worker_client: Any, cluster_client: Any
) -> None:
    data = probe_data(rng, scan=(6, 5))
    ds = qf.open(_npy(tmp_path, data), chunk_rows=2)
    (shown,) = qf.compute(
        qf.virtual_bf(ds, radius=4.5, center=CENTER), client=one_worker_client, progress=True
    )
    assert shown.provenance.execution["query_route"]["path"] == "graph"
    assert "progress bar" in shown.provenance.execution["query_route"]["why"]
    other = qf.open(data[:, :3])
    two = qf.compute(
        qf.virtual_bf(ds, radius=4.5, center=CENTER),
        qf.virtual_bf(other, radius=4.5, center=CENTER),
        client=one_worker_client,
        progress=False,
    )
    assert all("2 passes" in r.provenance.execution["query_route"]["why"] for r in two)
    (many,) = qf.compute(
        qf.virtual_bf(ds, radius=4.5, center=CENTER), client=cluster_client, progress=False
    )
    route = many.provenance.execution["query_route"]
    assert route["path"] == "graph" and "2 workers" in route["why"], route
    here = qf.compute(qf.virtual_bf(ds, radius=4.5, center=CENTER), client="synchronous")
    assert here[0].provenance.execution["query_route"] is None  # in this process: no route


@pytest.mark.cluster
def test_a_file_cut_short_on_the_worker_keeps_its_error_on_both_routes(
    rng: np.random.Generator, tmp_path: Path, one_worker_client: Any
) -> None:
    data = probe_data(rng, scan=(6, 5))
    path = _npy(tmp_path, data)
    ds = qf.open(path, chunk_rows=2)
    qf.compute(
        qf.virtual_bf(ds, radius=4.5, center=CENTER), client=one_worker_client, progress=False
    )
    with open(path, "r+b") as f:  # the worker reads past the end; the client's stat is fine
        f.truncate(Path(path).stat().st_size // 2)
    for direct in (True, False):
        with (
            qf.config.set(direct_passes=direct),
            pytest.raises(CorruptChunkError, match=r"truncated or rewritten"),
        ):
            qf.compute(
                qf.virtual_bf(ds, radius=4.5, center=CENTER),
                client=one_worker_client,
                progress=False,
            )


@pytest.mark.cluster
def test_float_sums_over_many_tasks_have_the_graphs_bits(
    rng: np.random.Generator, tmp_path: Path, one_worker_client: Any
) -> None:
    data = probe_data(rng, scan=(24, 5)) * rng.random((24, 5, 1, 1))  # float64: sums round
    ds = qf.open(_npy(tmp_path, data), chunk_rows=1)
    ops = [qf.sum_diffraction(ds), qf.virtual_adf(ds, inner=7.0, center=CENTER)]
    with qf.config.set(pass_tasks_per_thread=6):  # 12 tasks: two levels of combine tasks
        direct = qf.compute(*ops, client=one_worker_client, progress=False)
        with qf.config.set(direct_passes=False):
            graph = qf.compute(*ops, client=one_worker_client, progress=False)
    ex = direct[0].provenance.execution
    assert ex["query_route"]["path"] == "direct"
    assert graph[0].provenance.execution["query_route"]["path"] == "graph"
    assert ex["tasks"]["n_tasks"] > 8, ex["tasks"]  # more partials than one combine task takes
    for a, b in zip(direct, graph, strict=True):
        assert np.asarray(a.data).tobytes() == np.asarray(b.data).tobytes()  # every bit


@pytest.mark.cluster
def test_a_worker_without_the_handler_sends_the_pass_through_the_graph(
    rng: np.random.Generator, tmp_path: Path, one_worker_client: Any
) -> None:
    data = probe_data(rng, scan=(5, 4))
    ds = qf.open(_npy(tmp_path, data), chunk_rows=2)
    (ref,) = qf.compute(qf.virtual_adf(ds, inner=7.0, center=CENTER), client="synchronous")

    def drop(dask_worker: Any) -> bool:
        return dask_worker.handlers.pop(PASS_HANDLER, None) is not None

    def put_back(dask_worker: Any) -> None:
        install_pass_handler(dask_worker)

    assert list(one_worker_client.run(drop).values()) == [True]
    try:
        (fell,) = qf.compute(
            qf.virtual_adf(ds, inner=7.0, center=CENTER), client=one_worker_client, progress=False
        )
    finally:
        one_worker_client.run(put_back)
    np.testing.assert_array_equal(fell.data, ref.data)
    route = fell.provenance.execution["query_route"]
    assert route["path"] == "graph" and "direct route failed" in route["why"], route
    # the failed route rests a while (no retry, and no handler error on the worker, per
    # pass), saying why; once forgotten, the pass goes direct again
    (resting,) = qf.compute(
        qf.virtual_adf(ds, inner=7.0, center=CENTER), client=one_worker_client, progress=False
    )
    route = resting.provenance.execution["query_route"]
    assert route["path"] == "graph" and "failed" in route["why"] and "ago" in route["why"]
    forget_pass_route(one_worker_client)
    (back,) = qf.compute(
        qf.virtual_adf(ds, inner=7.0, center=CENTER), client=one_worker_client, progress=False
    )
    assert back.provenance.execution["query_route"]["path"] == "direct"
    np.testing.assert_array_equal(back.data, ref.data)


def test_the_route_is_kept_until_the_cluster_changes() -> None:
    calls: list[int] = []
    workers = [{"address": "tcp://a", "nthreads": 2, "resources": {RUNTIME_PREFIX + "cpu": 2.0}}]

    class FakeClient:
        def __init__(self) -> None:
            self._scheduler_identity = {"n_workers": 1}

        def run_on_scheduler(self, fn: Any) -> Any:
            calls.append(1)
            return list(workers)

    client = FakeClient()
    route, why = pass_route(client)
    assert route is not None and route["address"] == "tcp://a" and why == ""
    assert pass_route(client)[0] == route and len(calls) == 1  # kept: no second request
    workers.append({"address": "tcp://b", "nthreads": 1, "resources": {}})
    client._scheduler_identity = {"n_workers": 2}
    route, why = pass_route(client)
    assert route is None and "2 workers" in why and len(calls) == 2
    workers[:] = [{"address": "tcp://c", "nthreads": 1, "resources": {}}]
    forget_pass_route(client)
    route, why = pass_route(client)
    assert route is None and "plugin" in why and len(calls) == 3


def test_a_pass_that_needs_much_of_the_workers_memory_goes_through_the_scheduler(
    rng: np.random.Generator,
) -> None:
    data = probe_data(rng, scan=(8, 5))
    ds = qf.open(data, chunk_rows=2)
    lowered = lower_pass(
        ds, {"w": np.ones(data.shape[2:])}, want_sum=True, want_max=False, runtime="cpu"
    )
    big = {RUNTIME_PREFIX + "cpu": 2.0, MEMORY_PREFIX + "host": 2.0**40}
    assert direct_pass_blocker(lowered, {"resources": big}, progress=False, n_passes=1) is None
    small = {RUNTIME_PREFIX + "cpu": 2.0, MEMORY_PREFIX + "host": 1024.0}
    why = direct_pass_blocker(lowered, {"resources": small}, progress=False, n_passes=1)
    assert why is not None and "host" in why and "budget" in why
    no_cpu = {RUNTIME_PREFIX + "cuda": 1.0, MEMORY_PREFIX + "host": 2.0**40}
    why = direct_pass_blocker(lowered, {"resources": no_cpu}, progress=False, n_passes=1)
    assert why is not None and "'cpu'" in why
    gathering = dataclasses.replace(
        lowered, spec=dataclasses.replace(lowered.spec, gather=np.arange(3))
    )
    why = direct_pass_blocker(gathering, {"resources": big}, progress=False, n_passes=1)
    assert why is not None and "gather" in why


def test_the_handler_answers_unreadable_requests_and_errors(
    rng: np.random.Generator, tmp_path: Path
) -> None:
    from distributed.protocol.pickle import dumps, loads

    data = probe_data(rng, scan=(4, 5))
    ds = qf.open(_npy(tmp_path, data), chunk_rows=2)
    lowered = lower_pass(
        ds, {"w": np.ones(data.shape[2:])}, want_sum=True, want_max=False, runtime="cpu"
    )
    worker = SimpleNamespace(
        address="tcp://127.0.0.1:1", name="w", executors={"default": ThreadPoolExecutor(2)}
    )
    groups = dumps({"groups": [((0, 0, 2),), ((1, 2, 4),)], "need": {}})
    ok = asyncio.run(_answer(worker, lowered.spec, groups))  # as the comm hands it over
    assert ok["status"] == "ok"
    parts = ok["parts"].data  # a Serialize: its arrays travel out of band
    assert [i for i, _ in parts] == [0, 1]  # one partial per task group, in chunk order
    part = combine_partials(*(p for _, p in parts))
    assert {r["worker"] for r in part.records} == {"tcp://127.0.0.1:1"}
    sums = np.concatenate([b for _, b in sorted(part.blocks, key=lambda x: x[0])])
    np.testing.assert_array_equal(sums[:, :, 0], data.sum(axis=(2, 3), dtype=np.int64))
    np.testing.assert_array_equal(
        np.ravel(part.pattern_sum), data.sum(axis=(0, 1), dtype=np.int64).ravel()
    )
    older = asyncio.run(_answer(worker, dumps(lowered.spec), groups))  # a pickled spec
    assert older["status"] == "ok" and "parts" not in older  # answered as that client reads
    np.testing.assert_array_equal(loads(older["partial"]).pattern_sum, part.pattern_sum)
    unreadable = asyncio.run(_answer(worker, b"not a pickle", groups))
    assert unreadable["status"] == "unreadable"
    broken = dumps(dataclasses.replace(lowered.spec, runtime="no-such-runtime"))
    error = asyncio.run(_answer(worker, broken, groups))
    assert error["status"] == "error"
    exc = pickle.loads(error["error"])
    assert isinstance(exc, RuntimeUnavailableError) and "no-such-runtime" in str(exc)


def test_a_paused_or_full_worker_sends_a_direct_pass_back() -> None:
    from distributed.core import Status

    from quantem_flow.graphs.direct_pass import _refusal, _reserved

    worker = SimpleNamespace(
        status=Status.running,
        state=SimpleNamespace(total_resources={MEMORY_PREFIX + "host": 1000.0}),
    )
    assert _refusal(worker, {"host": 200.0}) is None
    _reserved(worker)["host"] = 100.0  # a direct pass already running
    why = _refusal(worker, {"host": 200.0})
    assert why is not None and "host" in why and "25%" in why
    worker.status = Status.paused
    why = _refusal(worker, {})
    assert why is not None and "paused" in why
