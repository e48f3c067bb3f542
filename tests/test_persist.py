"""Persisted datasets, pinning, bytes moved between workers, worker loss, the page."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import urllib.request
from typing import Any

import numpy as np
import pytest

import quantem_flow as qf
from quantem_flow.dataset import Dataset4D
from quantem_flow.errors import ParameterError, PlacementError
from quantem_flow.graphs.lowering import lower_pass
from tests.conftest import probe_data
from tests.reference import ref_annulus, ref_com, ref_virtual
from tests.slow_source import SlowArraySource

CENTER = (8.6, 14.2)


def queries(ds: Dataset4D) -> list[Any]:
    return [
        qf.virtual_bf(ds, radius=4.5, center=CENTER),
        qf.virtual_adf(ds, inner=7.0, center=CENTER),
        qf.center_of_mass(ds, center=CENTER),
    ]


def check_against_reference(data: np.ndarray, bf: Any, adf: Any, com: Any) -> None:
    det = data.shape[2:]
    np.testing.assert_array_equal(bf.data, ref_virtual(data, ref_annulus(det, CENTER, 0, 4.5)))
    np.testing.assert_array_equal(
        adf.data, ref_virtual(data, ref_annulus(det, CENTER, 7.0, np.inf))
    )
    np.testing.assert_allclose(com.data, ref_com(data, CENTER), rtol=1e-5)


def incoming_bytes(client: Any) -> int:
    """Bytes the workers fetched from each other, but the weight maps a pass sends them.

    A pass's weights are a task of their own (graphs/held_weights.py): the workers
    that did not run it fetch them (kilobytes), as they fetched the spec before.
    """

    def total(dask_worker: Any) -> int:
        return int(
            sum(
                n
                for t in dask_worker.transfer_incoming_log
                for key, n in t.get("keys", {}).items()
                if not str(key).startswith("qf-weights-")
            )
        )

    return sum(client.run(total).values())


def test_persist_in_process_reads_once_and_matches(rng: np.random.Generator, tmp_path) -> None:
    data = probe_data(rng, scan=(9, 7))
    np.save(tmp_path / "d.npy", data)
    ds = qf.open(tmp_path / "d.npy", chunk_rows=2)
    p = ds.persist(client="synchronous")
    assert p.is_persisted and not ds.is_persisted
    for _ in range(2):
        bf, adf, com = qf.compute(*queries(p))
        check_against_reference(data, bf, adf, com)
        ex = bf.provenance.execution
        assert ex["bytes_read"] == 0  # nothing read: the chunks are resident
        assert ex["resident"]["loaded_bytes"] == data.nbytes
        assert all(r["resident"] for r in ex["chunks"])
    # views that change the chunks read the source again; calibration keeps residency
    assert not p.crop_scan((0, 4, 0, 7)).is_persisted
    assert p.with_calibration(scan_units="nm", scan_sampling=0.2).is_persisted
    with pytest.raises(ParameterError, match="persisted for runtime 'cpu'"):
        qf.compute(qf.virtual_bf(p, radius=3, center=CENTER), backend="mps")
    released = p.release()
    assert not released.is_persisted
    with pytest.raises(ParameterError, match="released"):
        qf.compute(qf.virtual_bf(p, radius=3, center=CENTER))


@pytest.mark.cluster
def test_resident_queries_move_no_chunk_between_workers(
    rng: np.random.Generator, tmp_path, cluster_client: Any
) -> None:
    import dask

    assert dask.config.get("distributed.scheduler.work-stealing") is True
    data = probe_data(rng, scan=(24, 9))
    np.save(tmp_path / "d.npy", data)
    p = qf.open(tmp_path / "d.npy", chunk_rows=1).persist(client=cluster_client)
    holders = p.resident.holders()
    assert {w for ws in holders.values() for w in ws} == set(
        cluster_client.scheduler_info()["workers"]
    )  # balanced over both workers
    before = incoming_bytes(cluster_client)
    chunk_bytes = data.nbytes // 24
    for _ in range(4):
        bf, adf, com = qf.compute(*queries(p), client=cluster_client)
        check_against_reference(data, bf, adf, com)
        for key, rec in zip(p.resident.keys, bf.provenance.execution["chunks"], strict=True):
            assert holders[str(key)] == [rec["worker"]]  # kernel ran where its chunk lives
    moved = incoming_bytes(cluster_client) - before
    # only small partials and the pass spec travel: far less than one chunk per query
    assert moved < chunk_bytes, (moved, chunk_bytes)
    page = _fetch(cluster_client, "/quantem-flow")
    assert "quantem-flow placement" in page and "dense" in page
    state = json.loads(_fetch(cluster_client, "/quantem-flow/state.json"))
    per_worker = {w["address"]: w for w in state["workers"]}
    assert sum(len(w["chunks_in_memory"]) for w in per_worker.values()) >= 24
    assert all("cpu" in w["runtimes"] for w in per_worker.values())
    assert sum(w["resident_bytes"].get("dense", 0) for w in per_worker.values()) >= data.nbytes
    p.release()


def _fetch(client: Any, path: str) -> str:
    from quantem_flow.graphs import dashboard_url

    url = dashboard_url(client)
    assert url is not None and url.startswith("http://127.0.0.1:")
    base = url.rsplit("/", 1)[0]
    with urllib.request.urlopen(base + path, timeout=10) as resp:
        return str(resp.read().decode())


@pytest.mark.cluster
def test_admission_refusal_is_a_clear_error(rng: np.random.Generator, tmp_path) -> None:
    from distributed import Client

    from quantem_flow.graphs.cluster import start_local_cluster

    cluster = start_local_cluster(n_workers=1, memory_limit="400MiB")
    client = Client(cluster, set_as_default=False)
    try:
        budget = client.scheduler_info()["workers"]
        (info,) = budget.values()
        assert info["resources"]["qf-budget-cpu"] < 400 * 2**20
        # a file-backed 512 MiB chunk (sparse file: nothing is written or read)
        path = tmp_path / "huge.npy"
        np.lib.format.open_memmap(path, mode="w+", dtype=np.float64, shape=(1, 1, 8192, 8192))
        with pytest.raises(PlacementError, match="admission refused") as err:
            qf.open(path).persist(client=client)
        assert "536870912 bytes" in str(err.value)
        small = qf.open(probe_data(rng, scan=(4, 5)))
        small.persist(client=client).release()  # what fits is admitted
    finally:
        client.close()
        cluster.close()


@pytest.mark.cluster
@pytest.mark.slow
@pytest.mark.parametrize("persisted", [False, True])
def test_worker_killed_mid_computation(rng: np.random.Generator, persisted: bool) -> None:
    """A real SIGKILL of a worker process: chunks are re-placed, recomputed, identical."""
    from distributed import Client

    from quantem_flow.graphs.cluster import start_local_cluster

    data = probe_data(rng, scan=(16, 6))
    cluster = start_local_cluster(n_workers=2)
    client = Client(cluster, set_as_default=False)
    try:
        (expected_bf, expected_adf, expected_com) = qf.compute(
            *queries(qf.open(data)), client="synchronous"
        )
        ds = Dataset4D(SlowArraySource(data, delay_s=0.25), chunk_rows=1)
        if persisted:
            ds = ds.persist(client=client)
            victim = next(iter(ds.resident.holders().values()))[0]
        else:
            victim = sorted(client.scheduler_info()["workers"])[0]
        pids = client.run(os.getpid)
        out: dict[str, Any] = {}

        def run() -> None:
            try:
                out["results"] = qf.compute(*queries(ds), client=client)
            except BaseException as exc:  # surfaced below
                out["error"] = exc

        t = threading.Thread(target=run)
        t.start()
        if not persisted:
            _wait_for_some_chunks(client, 3)
        # persisted: kill at once; the victim's resident chunks are lost and must be
        # reloaded (slowly) on a live worker before their kernels can run
        os.kill(pids[victim], signal.SIGKILL)
        t.join(timeout=120)
        assert not t.is_alive(), "computation did not finish after the worker was killed"
        assert "error" not in out, out.get("error")
        bf, adf, com = out["results"]
        np.testing.assert_array_equal(bf.data, expected_bf.data)
        np.testing.assert_array_equal(adf.data, expected_adf.data)
        np.testing.assert_allclose(com.data, expected_com.data, rtol=1e-12)
        records = bf.provenance.execution["chunks"]
        assert len(records) == len(ds.chunks)
        assert all(r["runtime"] == "cpu" and r["worker"].startswith("tcp://") for r in records)
        if persisted:
            live = set(client.scheduler_info()["workers"])
            holders = ds.resident.holders()
            assert all(ws and set(ws) <= live for ws in holders.values())
            assert victim not in {w for ws in holders.values() for w in ws}
    finally:
        client.close()
        cluster.close()


def _wait_for_some_chunks(client: Any, n: int, timeout: float = 30.0) -> None:
    def done(dask_scheduler: Any) -> int:
        return sum(
            1
            for k, ts in dask_scheduler.tasks.items()
            if str(k).startswith("('qf-pass-") and ts.state == "memory"
        )

    end = time.time() + timeout
    while time.time() < end:
        if client.run_on_scheduler(done) >= n:
            return
        time.sleep(0.05)
    raise AssertionError("no chunk finished in time")


class _Recorder:
    """A scheduler plugin that keeps the quantem-flow annotations it sees."""

    name = "qf-test-recorder"

    def update_graph(self, scheduler: Any, *, annotations: Any = None, **kwargs: Any) -> None:
        seen = scheduler.__dict__.setdefault("_qf_seen_annotations", {})
        for name, per_key in (annotations or {}).items():
            if name.startswith("qf_"):
                seen.setdefault(name, {}).update(per_key)


@pytest.mark.cluster
def test_resident_key_annotation_reaches_the_scheduler_per_key(
    rng: np.random.Generator, cluster_client: Any
) -> None:
    from distributed.diagnostics.plugin import SchedulerPlugin

    recorder = type("Recorder", (_Recorder, SchedulerPlugin), {})()
    cluster_client.register_plugin(recorder, name="qf-test-recorder")
    p = qf.open(probe_data(rng, scan=(6, 5)), chunk_rows=2).persist(client=cluster_client)
    try:
        with qf.config.set(direct_queries=False):  # the graph route (the direct one has no graph)
            (bf,) = qf.compute(qf.virtual_bf(p, radius=4.5, center=CENTER), client=cluster_client)
        assert bf.provenance.execution["query_route"]["path"] == "graph"

        def seen(dask_scheduler: Any) -> dict[str, dict[str, str]]:
            got = dask_scheduler.__dict__.get("_qf_seen_annotations", {})
            return {n: {str(k): str(v) for k, v in m.items()} for n, m in got.items()}

        got = cluster_client.run_on_scheduler(seen)
        kernels = {k: v for k, v in got["qf_role"].items() if v == "kernel"}
        # one kernel task per worker thread holding chunks (issue 14), named by its first chunk
        holders = p.resident.holders()
        groups = p.resident.task_groups()
        assert groups is not None and sorted(i for g in groups for i in g) == [0, 1, 2]
        keys = [str(k) for k in p.resident.keys]
        assert all(len({holders[keys[i]][0] for i in g}) == 1 for g in groups)  # one holder
        assert len(kernels) == len(groups)
        resident = got["qf_resident"]
        assert {resident[k] for k in kernels} == {keys[g[0]] for g in groups}
        loads = {k for k, v in got["qf_role"].items() if v == "load"}
        assert loads == {str(k) for k in p.resident.keys}
        assert {got["qf_runtime"][k] for k in kernels} == {"cpu"}
        assert {got["qf_representation"][k] for k in kernels} == {"dense"}
    finally:
        p.release()
        cluster_client.unregister_scheduler_plugin("qf-test-recorder")


# -- resident queries: one kernel task per worker (issue 14) ------------------------------
@pytest.mark.cluster
@pytest.mark.parametrize("direct", [True, False])
def test_ring_queries_run_one_task_per_worker_and_move_no_chunk(
    rng: np.random.Generator, tmp_path, cluster_client: Any, direct: bool
) -> None:
    with qf.config.set(direct_queries=direct):
        _ring_queries(rng, tmp_path, cluster_client, direct=direct)


def _ring_queries(
    rng: np.random.Generator, tmp_path: Any, cluster_client: Any, *, direct: bool
) -> None:
    data = probe_data(rng, scan=(24, 9))
    np.save(tmp_path / "d.npy", data)
    ds = qf.open(tmp_path / "d.npy", chunk_rows=1)
    p = ds.persist(client=cluster_client)
    holders = p.resident.holders()
    workers = {ws[0] for ws in holders.values()}
    assert len(workers) == 2
    before = incoming_bytes(cluster_client)
    det = data.shape[2:]
    for inner in (5.0, 6.0, 7.5):
        (ring,) = qf.compute(
            qf.virtual_annular(p, inner=inner, outer=np.inf, center=CENTER), client=cluster_client
        )
        (ref,) = qf.compute(
            qf.virtual_annular(ds, inner=inner, outer=np.inf, center=CENTER),
            client="synchronous",
        )
        np.testing.assert_array_equal(ring.data, ref.data)  # identical to reading the file
        np.testing.assert_array_equal(
            ring.data, ref_virtual(data, ref_annulus(det, CENTER, inner, np.inf))
        )
        route = ring.provenance.execution["query_route"]
        assert route["path"] == ("direct" if direct else "graph"), route
        recs = ring.provenance.execution["chunks"]
        assert len(recs) == 24 and [r["chunk"] for r in recs] == list(range(24))
        for key, rec in zip(p.resident.keys, recs, strict=True):
            assert holders[str(key)] == [rec["worker"]]  # ran where its chunk lives
    moved = incoming_bytes(cluster_client) - before
    assert moved < data.nbytes // 24, moved  # small partials only, never a chunk
    lowered = lower_pass(
        p,
        {"w": np.ones(det)},
        want_sum=False,
        want_max=False,
        runtime="cpu",
        resident=p.resident.graph_refs(),
    )
    threads = {w: n for w, n in cluster_client.nthreads().items() if w in workers}
    groups = p.resident.task_groups()
    assert groups is not None and len(groups) == sum(threads.values())  # one task per thread
    assert len(lowered.chunk_keys) == len(groups) < 24
    assert sorted(i for g in groups for i in g) == list(range(24))
    keys = [str(k) for k in p.resident.keys]
    assert all(len({holders[keys[i]][0] for i in g}) == 1 for g in groups)  # one holder each
    # the page still sees every chunk of the last query done (a task covers its chunks; a
    # direct query is reported to the scheduler after its result, without waiting)
    kind = "resident query" if direct else "resident pass"
    deadline = time.monotonic() + 10
    while True:
        state = json.loads(_fetch(cluster_client, "/quantem-flow/state.json"))
        mine = [x for x in state["passes"] if x["kind"] == kind]
        if len(mine) >= 3 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    last = mine[-1]
    assert len(mine) >= 3  # every query shows
    assert last["n_done"] == last["n_chunks"] == 24 and last["finished"] is not None
    assert set(last["worker"]) == workers
    p.release()


def test_in_process_resident_passes_keep_one_task_per_chunk(rng: np.random.Generator) -> None:
    from quantem_flow.graphs.lowering import resident_groups
    from quantem_flow.graphs.resident_query import run_resident_group

    data = probe_data(rng, scan=(9, 7))
    p = qf.open(data, chunk_rows=2).persist(client="synchronous")
    refs = p.resident.graph_refs()
    assert resident_groups(p, refs) is None  # no scheduler, no groups
    lowered = lower_pass(p, {}, want_sum=True, want_max=False, runtime="cpu", resident=refs)
    assert len(lowered.chunk_keys) == len(p.chunks) == 5
    with pytest.raises(ParameterError, match="one chunk index per chunk"):
        run_resident_group(lowered.spec, (0, 1), refs[0])
    both = run_resident_group(lowered.spec, (0, 1), refs[0], refs[1])
    assert [r["chunk"] for r in both.records] == [0, 1]
    assert both.pattern_sum is not None
    np.testing.assert_array_equal(
        both.pattern_sum, data[:4].reshape(-1, data.shape[2] * data.shape[3]).sum(axis=0)
    )


def test_task_groups_cut_each_workers_chunks_by_its_threads() -> None:
    from types import SimpleNamespace

    from quantem_flow.graphs.persist import ResidentChunks
    from quantem_flow.runtimes import BackendChoice

    keys = [("qf-load-x", i) for i in range(7)]
    placed = {
        "who_has": {
            str(k): ["tcp://a" if i in (0, 1, 2, 5, 6) else "tcp://b"] for i, k in enumerate(keys)
        },
        "nthreads": {"tcp://a": 2, "tcp://b": 4},
    }
    client = SimpleNamespace(run_on_scheduler=lambda fn, *args: placed)
    res = ResidentChunks(
        refs=[SimpleNamespace(key=k) for k in keys],
        runtime="cpu",
        representation="dense",
        storage_schema="dense-v1",
        backend=BackendChoice("auto", "cpu", "test"),
        scheduler="tcp://s",
        client=client,
        loaded_bytes=0,
        resident_bytes=0,
        load_s=0.0,
    )
    # a: chunks 0 1 2 5 6 in 2 groups; b: chunks 3 4, at most one group per chunk
    assert res.task_groups() == [[0, 1], [2, 5, 6], [3], [4]]
    placed["who_has"].pop(str(keys[3]))
    assert res.task_groups() is None  # a holder unknown: one task per chunk


def test_placement_of_a_chunk_whose_holder_was_lost_is_unknown_not_an_error() -> None:
    """A lost worker's chunk has ``who_has=None`` on the scheduler until it is reloaded.

    Regression: lowering a query right after a worker was killed raised
    ``TypeError: 'NoneType' object is not iterable`` (CI, test_worker_killed_mid_computation).
    """
    from types import SimpleNamespace

    from quantem_flow.graphs.persist import _placement_of

    held = SimpleNamespace(who_has=[SimpleNamespace(address="tcp://a")])
    lost = SimpleNamespace(who_has=None)
    scheduler = SimpleNamespace(
        tasks={"k0": held, "k1": lost},
        workers={"tcp://a": SimpleNamespace(address="tcp://a", nthreads=2)},
    )
    placed = _placement_of(["k0", "k1", "k2"], dask_scheduler=scheduler)
    assert placed["who_has"] == {"k0": ["tcp://a"], "k1": []}
    assert placed["nthreads"] == {"tcp://a": 2}


def test_passes_on_a_persisted_in_memory_dataset_ship_no_copy_of_the_array(
    rng: np.random.Generator,
) -> None:
    import pickle

    from quantem_flow.errors import UnsupportedOperationError
    from quantem_flow.io.base import ResidentOnlySource

    data = probe_data(rng, scan=(24, 20))
    ds = qf.open(data, chunk_rows=4)
    p = ds.persist(client="synchronous")
    refs = p.resident.graph_refs()
    resident = lower_pass(p, {}, want_sum=True, want_max=False, runtime="cpu", resident=refs)
    from_source = lower_pass(ds, {}, want_sum=True, want_max=False, runtime="cpu")
    # the pass over the source carries the array; the pass over resident chunks does not
    assert len(pickle.dumps(from_source.spec)) > data.nbytes
    assert len(pickle.dumps(resident.spec)) < data.nbytes // 4
    stand_in = resident.spec.dataset.source
    assert isinstance(stand_in, ResidentOnlySource)
    assert stand_in.identity == ds.source.identity and stand_in.shape == data.shape
    with pytest.raises(UnsupportedOperationError, match="stayed on the client") as err:
        stand_in.read((0, 1), (0, 1))
    assert "rows=(0, 1)" in str(pickle.loads(pickle.dumps(err.value)))
    # and the queries still equal the reference, identity and provenance as before
    bf, adf, com = qf.compute(*queries(p))
    check_against_reference(data, bf, adf, com)
    assert bf.provenance.source == qf.compute(queries(ds)[0])[0].provenance.source
