"""A pass's weight maps travel to a cluster once, held there for the passes that repeat them."""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import quantem_flow as qf
from quantem_flow.errors import ParameterError, ShapeError
from quantem_flow.graphs.held_weights import (
    HELD_SETS,
    HeldWeights,
    held_weights,
    held_weights_bytes,
    weights_task_key,
)
from quantem_flow.graphs.lowering import lower_pass
from quantem_flow.graphs.tasks import with_weights
from tests.conftest import dask_thread_cluster, probe_data


@pytest.fixture
def client() -> Iterator[Any]:
    """A client of a plain thread cluster in this process (one worker thread)."""
    from distributed import Client

    with dask_thread_cluster() as cluster, Client(cluster, set_as_default=False) as c:
        yield c


class _Future:
    """Stands for a distributed future: a key, a status, and whether it was released."""

    def __init__(self, key: str, status: str = "finished"):
        self.key = key
        self.status = status
        self.released = False

    def release(self) -> None:
        self.released = True


def test_the_key_is_the_content_shape_and_dtype() -> None:
    w = np.arange(12, dtype=np.float64).reshape(3, 4)
    assert weights_task_key(w) == weights_task_key(w.copy())
    assert weights_task_key(w).startswith("qf-weights-")
    other = w.copy()
    other[2, 3] += 1
    assert weights_task_key(other) != weights_task_key(w)
    assert weights_task_key(w.reshape(4, 3)) != weights_task_key(w)
    assert weights_task_key(w.astype(np.float32)) != weights_task_key(w)
    assert weights_task_key(np.zeros((0, 4))) != weights_task_key(np.zeros((0, 5)))
    assert weights_task_key(np.asfortranarray(w)) == weights_task_key(w)


def test_the_oldest_sets_are_released_beyond_the_count_and_the_bytes() -> None:
    held = HeldWeights(capacity_sets=3)
    futures = [_Future(f"k{i}") for i in range(5)]
    for f in futures:
        held.keep(f, 10, capacity_bytes=1000)
    assert held.keys() == ["k2", "k3", "k4"]
    assert [f.released for f in futures] == [True, True, False, False, False]
    assert held.holds("k2") and held.keys() == ["k3", "k4", "k2"]  # used: most recent
    held.keep(_Future("big"), 1001, capacity_bytes=1000)  # larger than the whole capacity
    assert held.keys() == ["k3", "k4", "k2"]  # "big" is not held
    held.keep(_Future("k5"), 985, capacity_bytes=1000)  # 985 + 10 + 10 > 1000: two go
    assert held.keys() == ["k2", "k5"]
    held.clear()
    assert held.keys() == [] and futures[2].released


@pytest.mark.parametrize("status", ["lost", "error", "cancelled"])
def test_a_future_that_erred_or_was_cancelled_is_not_held(status: str) -> None:
    held = HeldWeights()
    gone = _Future("k", status=status)
    held.keep(gone, 10, capacity_bytes=1000)
    assert not held.holds("k") and gone.released and held.keys() == []


def test_a_pending_future_is_held() -> None:
    held = HeldWeights()
    on_its_way = _Future("k", status="pending")
    held.keep(on_its_way, 10, capacity_bytes=1000)
    assert held.holds("k") and not on_its_way.released


def test_the_last_sets_used_are_remembered() -> None:
    held = HeldWeights(capacity_sets=2)
    held.saw(None)
    for key in ("a", "b", "c"):
        held.saw(key)
    assert not held.seen("a") and held.seen("b") and held.seen("c")


@pytest.mark.parametrize("bad", [-1, float("nan"), float("inf"), "lots"])
def test_a_bad_capacity_is_refused_with_the_value(bad: Any) -> None:
    with pytest.raises(ParameterError, match="held_weights_mib") as info:
        held_weights_bytes(bad)
    assert repr(bad) in str(info.value)
    assert str(pickle.loads(pickle.dumps(info.value))) == str(info.value)
    assert held_weights_bytes(0) == 0 and held_weights_bytes(1.5) == 3 * 2**19


def _file(tmp_path: Path, rng: np.random.Generator, scan: tuple[int, int] = (12, 5)) -> Path:
    path = tmp_path / "data.npy"
    np.save(path, probe_data(rng, scan=scan))
    return path


def _weights(ds: Any) -> dict[str, np.ndarray]:
    rr, cc = np.indices(ds.detector_shape)
    return {
        "bf": ((rr - 8) ** 2 + (cc - 13) ** 2 < 16).astype(np.float64),
        "row": rr.astype(np.float64),
    }


def test_a_pass_of_several_tasks_takes_its_weights_from_their_own_task(
    tmp_path: Path, rng: np.random.Generator
) -> None:
    ds = qf.open(_file(tmp_path, rng), chunk_rows=2)
    lowered = lower_pass(ds, _weights(ds), want_sum=False, want_max=False, runtime="cpu", threads=1)
    assert lowered.weights_task and lowered.weights_key == weights_task_key(lowered.spec.weights)
    layers = dict(lowered.graph.layers)
    assert lowered.weights_key in layers
    assert not any(name.startswith("qf-spec-") for name in layers)  # the spec rides inline
    from dask.local import get_sync

    graph = dict(lowered.graph)
    values = get_sync(graph, lowered.chunk_keys)
    assert [rows for v in values for rows, _ in v.blocks] == list(ds.chunks)
    task = graph[lowered.chunk_keys[0]]
    assert lowered.weights_key in task.dependencies


def test_an_in_memory_dataset_keeps_its_spec_a_task_of_its_own(rng: np.random.Generator) -> None:
    ds = qf.open(probe_data(rng, scan=(12, 5)), chunk_rows=2)
    lowered = lower_pass(ds, _weights(ds), want_sum=False, want_max=False, runtime="cpu", threads=1)
    names = list(dict(lowered.graph.layers))
    assert lowered.weights_task and any(name.startswith("qf-spec-") for name in names)


def test_with_no_capacity_the_weights_travel_inside_the_spec(
    tmp_path: Path, rng: np.random.Generator
) -> None:
    ds = qf.open(_file(tmp_path, rng), chunk_rows=2)
    with qf.config.set(held_weights_mib=0):
        lowered = lower_pass(
            ds, _weights(ds), want_sum=False, want_max=False, runtime="cpu", threads=1
        )
    assert not lowered.weights_task and lowered.weights_key is None
    assert not any(n.startswith("qf-weights-") for n in dict(lowered.graph.layers))


def test_a_spec_takes_its_rows_once_and_of_the_detectors_size(rng: np.random.Generator) -> None:
    ds = qf.open(probe_data(rng, scan=(4, 5)))
    spec = lower_pass(ds, _weights(ds), want_sum=False, want_max=False, runtime="cpu").spec
    slim = with_weights(
        lower_pass(ds, {}, want_sum=True, want_max=False, runtime="cpu").spec, spec.weights
    )
    np.testing.assert_array_equal(slim.weights, spec.weights)
    with pytest.raises(ShapeError, match="once") as info:
        with_weights(spec, spec.weights)
    assert "(2, 520)" in str(info.value)
    assert str(pickle.loads(pickle.dumps(info.value))) == str(info.value)
    empty = lower_pass(ds, {}, want_sum=True, want_max=False, runtime="cpu").spec
    with pytest.raises(ShapeError, match=r"\(2, 7\)"):
        with_weights(empty, np.zeros((2, 7)))


def _ops(ds: Any) -> list[Any]:
    return [qf.virtual_bf(ds, radius=3, center=(8, 13)), qf.center_of_mass(ds)]


def test_passes_that_repeat_their_weights_send_them_once(
    tmp_path: Path, rng: np.random.Generator, client: Any
) -> None:
    path = _file(tmp_path, rng)
    ds = qf.open(path, chunk_rows=2)  # 6 chunks; one worker thread: two tasks
    expected = qf.compute(*_ops(ds), client="synchronous", progress=False)
    first = qf.compute(*_ops(ds), client=client, progress=False)
    second = qf.compute(*_ops(ds), client=client, progress=False)
    held = held_weights(client)
    key = held.keys()[-1]
    assert client.run_on_scheduler(_in_memory, key=key)
    # the held task lost (a worker gone with it, say): the next pass sends it again
    for f in held._held.values():
        f[0].cancel()
    third = qf.compute(*_ops(ds), client=client, progress=False)
    assert held.keys() == [key]
    for got in (first, second, third):
        for a, b in zip(got, expected, strict=True):
            np.testing.assert_array_equal(a.data, b.data)
    travel = [r[0].provenance.execution["weights_travel"] for r in (first, second, third)]
    assert travel[0].startswith("in a task of their own") and key in travel[0]
    assert travel[1].startswith("held on the cluster since an earlier pass") and key in travel[1]
    assert travel[2].startswith("in a task of their own")
    in_process = expected[0].provenance.execution["weights_travel"]
    assert in_process == "in a task of their own, in this process"


def _in_memory(dask_scheduler: Any, key: str) -> bool:
    ts = dask_scheduler.tasks.get(key)
    return ts is not None and ts.state == "memory"


def test_a_pass_of_one_task_sends_its_weights_inline_until_they_repeat(
    tmp_path: Path, rng: np.random.Generator, client: Any
) -> None:
    ds = qf.open(_file(tmp_path, rng, scan=(4, 5)))  # one chunk: one task
    expected = qf.compute(*_ops(ds), client="synchronous", progress=False)
    runs = [qf.compute(*_ops(ds), client=client, progress=False) for _ in range(3)]
    travel = [r[0].provenance.execution["weights_travel"] for r in runs]
    assert travel[0] == "inside the pass spec"
    assert travel[1].startswith("in a task of their own")
    assert travel[2].startswith("held on the cluster since an earlier pass")
    for got in runs:
        for a, b in zip(got, expected, strict=True):
            np.testing.assert_array_equal(a.data, b.data)


def test_a_client_holds_at_most_the_last_sets(
    tmp_path: Path, rng: np.random.Generator, client: Any
) -> None:
    ds = qf.open(_file(tmp_path, rng), chunk_rows=2)
    for radius in range(1, HELD_SETS + 3):
        qf.compute(qf.virtual_bf(ds, radius=radius, center=(8, 13)), client=client)
    held = held_weights(client).keys()
    on_cluster = client.run_on_scheduler(_weights_tasks)
    assert len(held) == HELD_SETS
    assert sorted(on_cluster) == sorted(held)


def _weights_tasks(dask_scheduler: Any) -> list[str]:
    return [str(k) for k in dask_scheduler.tasks if str(k).startswith("qf-weights-")]


def test_passes_computed_at_once_from_threads_share_the_weights(
    tmp_path: Path, rng: np.random.Generator
) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from distributed import Client

    ds = qf.open(_file(tmp_path, rng), chunk_rows=2)
    expected = qf.compute(*_ops(ds), client="synchronous", progress=False)
    with (
        dask_thread_cluster(threads_per_worker=2) as cluster,
        Client(cluster, set_as_default=False) as client,
        ThreadPoolExecutor(4) as pool,
    ):
        runs = list(
            pool.map(lambda _: qf.compute(*_ops(ds), client=client, progress=False), range(8))
        )
        held = held_weights(client).keys()
        on_cluster = client.run_on_scheduler(_weights_tasks)
    for got in runs:
        for a, b in zip(got, expected, strict=True):
            np.testing.assert_array_equal(a.data, b.data)
    assert len(held) == 1 and on_cluster == held


def _wait_until(check: Any, timeout_s: float = 5.0) -> bool:
    import time

    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if check():
            return True
        time.sleep(0.02)
    return bool(check())


def test_a_pinned_set_outlives_its_eviction_until_the_pin_goes(
    tmp_path: Path, rng: np.random.Generator, client: Any
) -> None:
    ds = qf.open(_file(tmp_path, rng), chunk_rows=2)
    qf.compute(*_ops(ds), client=client, progress=False)
    held = held_weights(client)
    (key,) = held.keys()
    pin = held.pin(key)
    assert pin is not None and pin.key == key
    held.clear()  # another thread's eviction, say
    assert held.keys() == [] and held.pin(key) is None
    assert not _wait_until(lambda: not client.run_on_scheduler(_in_memory, key=key), 0.3)
    pin.release()
    assert _wait_until(lambda: not client.run_on_scheduler(_in_memory, key=key))


def test_a_lower_capacity_releases_what_is_held_at_the_next_pass(
    tmp_path: Path, rng: np.random.Generator, client: Any
) -> None:
    ds = qf.open(_file(tmp_path, rng), chunk_rows=2)
    qf.compute(*_ops(ds), client=client, progress=False)
    assert len(held_weights(client).keys()) == 1
    with qf.config.set(held_weights_mib=0):
        (bf, _) = qf.compute(*_ops(ds), client=client, progress=False)
    assert bf.provenance.execution["weights_travel"] == "inside the pass spec"
    assert held_weights(client).keys() == []
    assert _wait_until(lambda: client.run_on_scheduler(_weights_tasks) == [])


def test_a_set_larger_than_the_capacity_is_sent_and_not_held(
    tmp_path: Path, rng: np.random.Generator
) -> None:
    from distributed import Client

    ds = qf.open(_file(tmp_path, rng), chunk_rows=2)  # 2 rows x 520 px x 8 B = 8320 B of rows
    with (
        dask_thread_cluster() as cluster,
        Client(cluster, set_as_default=False) as client,
        qf.config.set(held_weights_mib=4096 / 2**20),
    ):
        runs = [qf.compute(*_ops(ds), client=client, progress=False) for _ in range(2)]
        travel = [got[0].provenance.execution["weights_travel"] for got in runs]
        key = travel[0].rsplit("task ", 1)[-1].rstrip(")")
        assert held_weights(client).keys() == []
        assert key.startswith("qf-weights-") and not held_weights(client).seen(key)
    assert travel == [f"in a task of their own (task {key})"] * 2


def test_a_closed_clients_sets_are_forgotten(tmp_path: Path, rng: np.random.Generator) -> None:
    from distributed import Client

    from quantem_flow.graphs import held_weights as module

    ds = qf.open(_file(tmp_path, rng), chunk_rows=2)
    with dask_thread_cluster() as cluster:
        with Client(cluster, set_as_default=False) as first:
            qf.compute(*_ops(ds), client=first, progress=False)
            first_id = first.id
            assert first_id in module._BY_CLIENT
        with Client(cluster, set_as_default=False) as second:
            held_weights(second)
            assert first_id not in module._BY_CLIENT and second.id in module._BY_CLIENT
