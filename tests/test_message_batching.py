"""Batching intervals of the clusters quantem-flow starts (issue 24, goal 5).

Dask holds each small message back up to 2-10 ms to batch it; a pass is a
chain of such messages, so the local clusters quantem-flow starts use
``qf.config`` ``message_batch_ms`` on every stream instead.  If a Dask
release renames a stream, these tests say which one no longer gets it.
"""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np
import pytest

import quantem_flow as qf
from quantem_flow.errors import ParameterError
from quantem_flow.graphs import cluster as qc
from quantem_flow.graphs.message_batching import (
    BatchIntervalWorkerPlugin,
    batch_interval_s,
    set_interval,
)
from tests.conftest import dask_thread_cluster


def _worker_interval(dask_worker: Any) -> float:
    return float(dask_worker.batched_stream.interval)


@pytest.mark.parametrize("processes", [True, False])
def test_every_stream_of_a_started_cluster_has_the_configured_interval(processes: bool) -> None:
    from distributed import Client

    with qf.config.set(message_batch_ms=0.7):
        cluster = qc.start_local_cluster(n_workers=1, threads_per_worker=1, processes=processes)
    try:
        with Client(cluster, set_as_default=False) as client:
            client.submit(sum, [1, 2], pure=False).result()  # the client's stream is up
            scheduler = cluster.scheduler
            to_workers = [s.interval for s in scheduler.stream_comms.values()]
            to_clients = [scheduler.client_comms[c].interval for c in scheduler.client_comms]
            from_workers = list(client.run(_worker_interval).values())
    finally:
        cluster.close()
    assert to_workers == [pytest.approx(0.0007)]
    assert to_clients and all(v == pytest.approx(0.0007) for v in to_clients)
    assert from_workers == [pytest.approx(0.0007)]


def test_a_cluster_started_by_others_keeps_dasks_intervals() -> None:
    from distributed import Client

    with dask_thread_cluster() as cluster, Client(cluster, set_as_default=False) as client:
        client.submit(sum, [1, 2], pure=False).result()
        assert [s.interval for s in cluster.scheduler.stream_comms.values()] == [0.005]
        assert list(client.run(_worker_interval).values()) == [0.002]


def test_the_embedded_clients_stream_to_the_scheduler_has_it() -> None:
    client = qc.embedded_client()
    assert client.scheduler_comm.interval == pytest.approx(batch_interval_s())


def test_the_embedded_client_fetches_results_from_the_workers_directly() -> None:
    client = qc.embedded_client()
    assert client.direct_to_workers is True
    future = client.submit(np.arange, 5, pure=False)
    np.testing.assert_array_equal(client.gather(future), np.arange(5))


def test_bad_intervals_are_refused_with_the_value() -> None:
    for bad in (-1.0, float("nan"), float("inf"), "soon"):
        with pytest.raises(ParameterError, match="message_batch_ms") as info:
            batch_interval_s(bad)  # type: ignore[arg-type]
        assert repr(bad) in str(info.value) or str(bad) in str(info.value)
        again = pickle.loads(pickle.dumps(info.value))
        assert str(again) == str(info.value)
    assert batch_interval_s(0) == 0.0
    assert batch_interval_s(2.5) == pytest.approx(0.0025)


def test_set_interval_leaves_what_is_not_a_batched_stream() -> None:
    class Stream:
        interval = 0.01

    stream = Stream()
    assert set_interval(stream, 0.001) is True and stream.interval == 0.001
    assert set_interval(None, 0.001) is False
    assert set_interval(object(), 0.001) is False


def test_the_worker_plugin_sets_the_worker_stream() -> None:
    class Stream:
        interval = 0.002

    class Worker:
        batched_stream = Stream()

    worker = Worker()
    BatchIntervalWorkerPlugin(0.0004).setup(worker)
    assert worker.batched_stream.interval == 0.0004
