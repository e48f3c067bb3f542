"""A pass's unpersisted chunks run in fewer, larger tasks; values and records stay per chunk."""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np
import pytest

import quantem_flow as qf
from quantem_flow.errors import AnnotationError, ParameterError
from quantem_flow.graphs import validate_annotations
from quantem_flow.graphs.lowering import lower_pass, partial_bytes, task_memory_need
from quantem_flow.graphs.pass_groups import GROUP_PARTIAL_BYTES, group_chunks, run_chunk_group
from quantem_flow.graphs.scheduler_plugin import PLUGIN_NAME
from quantem_flow.graphs.tasks import run_chunk_pass
from tests.conftest import dask_thread_cluster, probe_data

MiB = 2**20


def _covers_all_in_order(spans: list[tuple[int, int]], n: int) -> bool:
    flat = [i for a, b in spans for i in range(a, b)]
    return flat == list(range(n)) and all(b > a for a, b in spans)


@pytest.mark.parametrize(
    ("n", "threads", "per_thread", "expected"),
    [
        (16, 2, 2, [4, 4, 4, 4]),  # two tasks per thread
        (16, 8, 2, [1] * 16),  # more threads than chunks: one chunk per task
        (17, 2, 2, [5, 4, 4, 4]),  # near-equal runs, the first ones longer
        (3, 1, 1, [3]),
        (5, 1, 4, [2, 1, 1, 1]),
    ],
)
def test_chunks_go_to_tasks_in_contiguous_near_equal_runs(
    n: int, threads: int, per_thread: int, expected: list[int]
) -> None:
    spans = group_chunks(
        [100 * MiB] * n, [1000] * n, threads=threads, tasks_per_thread=per_thread, task_mib=10**6
    )
    assert [b - a for a, b in spans] == expected
    assert _covers_all_in_order(spans, n)


def test_no_task_covers_more_than_pass_task_mib() -> None:
    sizes = [128 * MiB] * 16
    spans = group_chunks(sizes, [0] * 16, threads=1, tasks_per_thread=1, task_mib=512)
    assert [b - a for a, b in spans] == [4, 4, 4, 4]
    # uneven chunks: runs grow in number until every run fits
    uneven = [300 * MiB, 10 * MiB, 10 * MiB, 300 * MiB, 300 * MiB, 10 * MiB]
    spans = group_chunks(uneven, [0] * 6, threads=1, tasks_per_thread=1, task_mib=512)
    assert _covers_all_in_order(spans, 6)
    assert all(sum(uneven[a:b]) <= 512 * MiB for a, b in spans if b - a > 1)
    # a chunk larger than the cap is still one task of its own
    assert group_chunks([2048 * MiB] * 2, [0, 0], threads=1, task_mib=512) == [(0, 1), (1, 2)]
    with qf.config.set(pass_task_mib=256.0, pass_tasks_per_thread=1):
        assert [b - a for a, b in group_chunks(sizes, [0] * 16, threads=1)] == [2] * 8


def test_large_results_keep_one_chunk_per_task() -> None:
    # an SSB gather returns every gathered pixel of its chunk: a group would hold them all
    big = [GROUP_PARTIAL_BYTES // 2 + 1] * 8
    spans = group_chunks([MiB] * 8, big, threads=1, tasks_per_thread=1, task_mib=10**6)
    assert [b - a for a, b in spans] == [1] * 8
    small = [GROUP_PARTIAL_BYTES // 4] * 8
    spans = group_chunks([MiB] * 8, small, threads=1, tasks_per_thread=1, task_mib=10**6)
    assert [b - a for a, b in spans] == [4, 4]


def test_bad_grouping_settings_are_refused_with_the_values() -> None:
    with pytest.raises(ParameterError, match="threads=0"):
        group_chunks([1], [1], threads=0)
    with pytest.raises(ParameterError, match="pass_tasks_per_thread=0"):
        group_chunks([1], [1], threads=1, tasks_per_thread=0)
    with pytest.raises(ParameterError, match="2 chunks, 1 partial sizes"):
        group_chunks([1, 1], [1], threads=1)
    with pytest.raises(ParameterError, match="none") as info:
        run_chunk_group(None, ())  # type: ignore[arg-type]
    assert "none" in str(pickle.loads(pickle.dumps(info.value)))
    assert group_chunks([], [], threads=1) == []


def test_the_qf_chunks_annotation_is_checked() -> None:
    assert validate_annotations({"qf_chunks": (0, 1, 2)}) == {"qf_chunks": (0, 1, 2)}
    for bad in ((), (-1,), ("0",), 3, (True,)):
        with pytest.raises(AnnotationError, match="qf_chunks"):
            validate_annotations({"qf_chunks": bad})


def _weights(ds: Any) -> dict[str, np.ndarray]:
    kr, kc = ds.detector_shape
    rr, cc = np.indices((kr, kc))
    return {
        "bf": ((rr - 8) ** 2 + (cc - 13) ** 2 < 16).astype(np.float64),
        "row": rr.astype(np.float64),
    }


def test_a_lowered_pass_groups_its_chunks_and_says_so(rng: np.random.Generator) -> None:
    ds = qf.open(probe_data(rng, scan=(16, 5)), chunk_rows=2)  # 8 chunks
    # two worker processes: two tasks per thread for Dask to balance (one process shares work:
    # tests/test_work_sharing.py)
    lowered = lower_pass(
        ds, _weights(ds), want_sum=True, want_max=False, runtime="cpu", threads=2, processes=2
    )
    assert lowered.covers == [(0, 1), (2, 3), (4, 5), (6, 7)]
    assert [k[1] for k in lowered.chunk_keys] == [0, 2, 4, 6]
    assert lowered.tasks["n_tasks"] == 4 and lowered.tasks["chunks_per_task"] == [2]
    assert "pass_tasks_per_thread=2" in lowered.tasks["rule"]
    layer = lowered.graph.layers[str(lowered.chunk_keys[0][0])]
    annotations = layer.annotations or {}
    assert annotations["qf_chunks"](lowered.chunk_keys[3]) == (6, 7)
    # the memory need counts the results of every chunk the task runs, and no more
    need = annotations["qf_need"]
    one = task_memory_need(ds, runtime="cpu", n_weights=2, want_max=False)
    assert need["parts"]["partial"] == 2 * one.parts["partial"]
    assert need["parts"]["partial"] == 2 * partial_bytes(ds, 2, n_weights=2, gather_pixels=0)
    assert need["total"]["host"] - one.pools["host"] == one.parts["partial"]
    # enough threads: one task per chunk, as before
    wide = lower_pass(
        ds, _weights(ds), want_sum=True, want_max=False, runtime="cpu", threads=4, processes=2
    )
    assert wide.covers == [(i,) for i in range(8)]
    assert wide.tasks["chunks_per_task"] == [1]


def test_a_group_returns_what_its_chunks_return_one_by_one(rng: np.random.Generator) -> None:
    ds = qf.open(probe_data(rng, scan=(6, 5)), chunk_rows=2)
    gather = np.array([3, 40, 41, 300], dtype=np.int64)
    lowered = lower_pass(
        ds, _weights(ds), want_sum=True, want_max=True, runtime="cpu", gather=gather, threads=1
    )
    spec = lowered.spec
    chunks = tuple((i, r0, r1) for i, (r0, r1) in enumerate(ds.chunks))
    group = run_chunk_group(spec, chunks)
    singles = [run_chunk_pass(spec, i, r0, r1) for i, r0, r1 in chunks]
    assert [rows for rows, _ in group.blocks] == [(0, 2), (2, 4), (4, 6)]
    for (_, got), one in zip(group.blocks, singles, strict=True):
        np.testing.assert_array_equal(got, one.blocks[0][1])
    assert [r["chunk"] for r in group.records] == [0, 1, 2]
    assert [r["content_digest"] for r in group.records] == [
        one.records[0]["content_digest"] for one in singles
    ]
    np.testing.assert_array_equal(group.pattern_sum, sum(one.pattern_sum for one in singles))
    np.testing.assert_array_equal(
        group.pattern_max, np.maximum.reduce([one.pattern_max for one in singles])
    )
    assert [rows for rows, _ in group.gathered] == [(0, 2), (2, 4), (4, 6)]
    for (_, got), one in zip(group.gathered, singles, strict=True):
        np.testing.assert_array_equal(got, one.gathered[0][1])


def test_a_partials_values_pickle_out_of_band(
    rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Blocks are contiguous, so they pickle without a copy, whatever view a kernel returns.

    The worker's event loop serialises the partials; the integer dot kernel
    returns its values as columns of a wider array (moment supports beside them).
    """
    from quantem_flow.runtimes import get_runtime

    runtime = get_runtime("cpu")
    run = runtime.run_frame_pass

    def as_columns_of_a_wider_array(*args: Any, **kwargs: Any) -> Any:
        out = run(*args, **kwargs)
        wide = np.zeros((out.per_frame.shape[0], out.per_frame.shape[1] + 2))
        wide[:, : out.per_frame.shape[1]] = out.per_frame
        out.per_frame = wide[:, : out.per_frame.shape[1]]
        return out

    monkeypatch.setattr(runtime, "run_frame_pass", as_columns_of_a_wider_array)
    ds = qf.open(probe_data(rng, scan=(6, 5)), chunk_rows=2)
    lowered = lower_pass(ds, _weights(ds), want_sum=False, want_max=False, runtime="cpu")
    monkeypatch.setattr(lowered.spec, "stream_piece_bytes", 0)  # the chunk's kernels, in one
    part = run_chunk_group(lowered.spec, tuple((i, *c) for i, c in enumerate(ds.chunks)))
    assert all(block.flags.c_contiguous for _, block in part.blocks)
    buffers: list[pickle.PickleBuffer] = []
    inband = pickle.dumps(part, protocol=5, buffer_callback=buffers.append)
    assert sum(memoryview(b).nbytes for b in buffers) == sum(b.nbytes for _, b in part.blocks)
    again = pickle.loads(inband, buffers=buffers)
    for (_, got), (_, want) in zip(again.blocks, part.blocks, strict=True):
        np.testing.assert_array_equal(got, want)


def _pipeline(ds: Any) -> list[Any]:
    return [
        qf.virtual_bf(ds, radius=3, center=(8, 13)),
        qf.virtual_adf(ds, inner=5, center=(8, 13)),
        qf.center_of_mass(ds),
        qf.mean_diffraction(ds),
    ]


def _same(a: list[Any], b: list[Any]) -> None:
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x.data, y.data)


@pytest.mark.parametrize("client", ["synchronous", "threads"])
def test_grouped_passes_give_the_same_values_and_records_in_process(
    rng: np.random.Generator, client: str
) -> None:
    ds = qf.open(probe_data(rng, scan=(12, 5)), chunk_rows=2)  # 6 chunks
    with qf.config.set(pass_tasks_per_thread=1000, share_work=False):
        alone = qf.compute(*_pipeline(ds), client=client, progress=False)
    with qf.config.set(pass_tasks_per_thread=1, share_work=False):
        grouped = qf.compute(*_pipeline(ds), client=client, progress=False)
    _same(list(alone), list(grouped))
    a, g = alone[0].provenance.execution, grouped[0].provenance.execution
    assert a["tasks"]["chunks_per_task"] == [1]
    assert max(g["tasks"]["chunks_per_task"]) >= 3 and g["tasks"]["n_tasks"] < 6
    assert [r["chunk"] for r in g["chunks"]] == list(range(6))
    assert g["content_digest"] == a["content_digest"]
    assert g["read_once"] and g["bytes_read"] == a["bytes_read"]


def test_grouped_passes_on_a_cluster_show_every_chunk_done(rng: np.random.Generator) -> None:
    from distributed import Client

    data = probe_data(rng, scan=(12, 5))
    ds = qf.open(data, chunk_rows=2)  # 6 chunks, one worker thread: 2 tasks of 3
    with (
        dask_thread_cluster() as cluster,
        Client(cluster, set_as_default=False) as client,
        qf.config.set(share_work=False),  # two tasks per thread (sharing: test_work_sharing.py)
    ):
        with qf.config.set(pass_tasks_per_thread=1000):
            alone = qf.compute(*_pipeline(ds), client=client, progress=False)
        grouped = qf.compute(*_pipeline(ds), client=client, progress=False)

        def passes(dask_scheduler: Any) -> list[dict[str, Any]]:
            return list(dask_scheduler.plugins[PLUGIN_NAME].state()["passes"])

        shown = client.run_on_scheduler(passes)
    _same(list(alone), list(grouped))
    rr, cc = np.indices(data.shape[2:])
    disk = np.hypot(rr - 8, cc - 13) < 3
    np.testing.assert_array_equal(grouped[0].data, data[:, :, disk].sum(axis=-1))
    g = grouped[0].provenance.execution
    assert g["tasks"]["threads"] == 1 and g["tasks"]["n_tasks"] == 2
    assert g["tasks"]["chunks_per_task"] == [3]
    assert [r["chunk"] for r in g["chunks"]] == list(range(6))
    last = [p for p in shown if p["scan_shape"] == [12, 5]][-1]
    assert last["status"] == ["done"] * 6 and last["n_done"] == 6
    assert len({w for w in last["worker"]}) == 1 and last["worker"][0]


def test_gathered_pixels_of_grouped_tasks_reach_the_client(rng: np.random.Generator) -> None:
    from distributed import Client

    from quantem_flow.graphs.runner import Runner

    data = probe_data(rng, scan=(8, 5))
    ds = qf.open(data, chunk_rows=2)
    gather = np.array([0, 17, 200, 519], dtype=np.int64)
    expected = np.moveaxis(data.reshape(8, 5, -1)[:, :, gather], -1, 0)
    with dask_thread_cluster() as cluster, Client(cluster, set_as_default=False) as client:
        runner = Runner(client)
        lowered = lower_pass(
            ds,
            {},
            want_sum=False,
            want_max=False,
            runtime="cpu",
            gather=gather,
            threads=1,
            processes=2,
        )
        assert lowered.covers == [(0, 1), (2, 3)]
        runner.run([lowered], progress=False)
        got = runner.gathered[0][np.arange(4)]
    np.testing.assert_array_equal(got, expected)
