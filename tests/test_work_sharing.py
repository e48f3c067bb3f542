"""The tasks of a pass in one process share their work: queued chunks, then stream tails."""

from __future__ import annotations

import copy
import dataclasses
import pickle
import threading
from typing import Any

import numpy as np
import pytest

import quantem_flow as qf
from quantem_flow.graphs.lowering import lower_pass
from quantem_flow.graphs.pass_groups import run_chunk_group
from quantem_flow.graphs.tasks import PassSpec, run_chunk_pass, run_taken_rows
from quantem_flow.graphs.work_sharing import (
    PassWork,
    active_passes,
    pass_work,
    why_not_shared,
)
from quantem_flow.runtimes.cpu.stream import CpuFramePassStream
from tests.conftest import dask_thread_cluster, probe_data
from tests.test_pass_groups import _pipeline as grouped_pipeline

ROW = 1000  # bytes of a scan row in the bookkeeping tests


def _running(work: PassWork, start: int, stop: int, *, rows_per_piece: int = 2) -> Any:
    rows = work.running(start, stop, row_bytes=ROW, piece_bytes=rows_per_piece * ROW)
    rows.open(splittable=True)
    return rows


def test_a_stream_gives_about_half_its_unstarted_rows_in_whole_pieces() -> None:
    work = PassWork()
    owner = _running(work, 0, 16)
    assert owner.begin((0, 2)) == 2  # running its first piece: rows 2..16 not started
    part = work.take_rows()
    # 14 left: 8 taken (whole pieces of 2 rows), the owner keeps 6 and the piece it is in
    assert part is not None and (part.start, part.stop) == (8, 16)
    assert owner.stop == 8 and owner.parts == [part]
    assert owner.begin((6, 8)) == 8
    assert owner.begin((8, 10)) is None  # taken: the owner's stream ends there
    # the taken part is not splittable until its taker starts it
    assert work.take_rows() is None
    part.open(splittable=True)
    assert part.begin((8, 10)) == 10
    again = work.take_rows()
    assert again is not None and (again.start, again.stop) == (12, 16)
    assert part.parts == [again]


def test_a_piece_that_crosses_the_split_is_cut_there() -> None:
    work = PassWork()
    owner = _running(work, 0, 9, rows_per_piece=3)
    assert owner.begin((0, 3)) == 3
    part = work.take_rows()
    assert part is not None and (part.start, part.stop) == (6, 9)
    owner.stop = 5  # as if rows 5.. had been taken at a row inside the next piece
    assert owner.begin((3, 6)) == 5


def test_nothing_is_taken_under_two_pieces_or_after_close() -> None:
    work = PassWork()
    owner = _running(work, 0, 5)
    assert owner.begin((0, 2)) == 2
    assert work.take_rows() is None  # 3 rows left: under two pieces of 2 rows
    big = _running(work, 0, 100)
    big.close()
    assert work.take_rows() is None
    fresh = work.running(0, 100, row_bytes=ROW, piece_bytes=2 * ROW)
    assert work.take_rows() is None  # registered, not opened: not splittable yet
    fresh.open(splittable=False)  # a stream that cannot stop early
    assert work.take_rows() is None


def test_helpers_take_queued_chunks_from_the_back_of_the_fullest_queue() -> None:
    work = PassWork()
    a = work.queue([(0, 0, 2), (1, 2, 4), (2, 4, 6)])
    b = work.queue([(3, 6, 8)])
    first = work.take_chunk()
    assert first is not None and first.chunk == (2, 4, 6)
    mine = iter(a)
    assert next(mine) == (0, 0, 2)
    second, third = work.take_chunk(), work.take_chunk()
    assert second is not None and third is not None
    assert {second.chunk, third.chunk} == {(1, 2, 4), (3, 6, 8)}
    assert list(mine) == [] and list(b) == []
    assert work.take_chunk() is None
    # each queue knows what it lent: the task waits for those and returns them itself
    assert [lent.chunk for lent in a.lent] == [(2, 4, 6), (1, 2, 4)]
    assert [lent.chunk for lent in b.lent] == [(3, 6, 8)]
    first.deliver("chunk 2")
    assert first.wait() == "chunk 2"
    second.fail(OSError("gone"))
    with pytest.raises(OSError, match="gone"):
        second.wait()


def test_a_taken_part_hands_back_its_result_or_its_error() -> None:
    work = PassWork()
    owner = _running(work, 0, 16)
    owner.begin((0, 2))
    ok = work.take_rows()
    assert ok is not None
    threading.Thread(target=ok.deliver, args=("rows",)).start()
    assert ok.wait() == "rows"
    owner.begin((2, 4))
    bad = work.take_rows()
    assert bad is not None
    bad.fail(OSError("disk gone"))
    with pytest.raises(OSError, match="disk gone"):
        bad.wait()


def test_the_shared_work_of_a_pass_lives_while_its_tasks_run() -> None:
    with pass_work("qf-pass-a") as first, pass_work("qf-pass-a") as second:
        assert first is second and "qf-pass-a" in active_passes()
        with pass_work("qf-pass-b") as other:
            assert other is not first
    assert "qf-pass-a" not in active_passes() and "qf-pass-b" not in active_passes()


def test_which_passes_may_share() -> None:
    assert why_not_shared(np.uint16, want_sum=True, representation="dense") is None
    assert why_not_shared(np.float32, want_sum=False, representation="dense") is None
    why = why_not_shared(np.float32, want_sum=True, representation="dense")
    assert why is not None and "rounding" in why
    assert "not streamed" in str(why_not_shared(np.uint16, want_sum=True, representation="paired"))


# -- a stream that stops early ----------------------------------------------------------------


def test_the_cpu_stream_stops_early_with_the_pass_over_the_frames_it_kept(
    rng: np.random.Generator,
) -> None:
    frames = rng.integers(0, 900, size=(40, 64), dtype=np.uint16)
    weights = rng.integers(0, 3, size=(3, 64)).astype(np.float64)
    gather = np.array([1, 5, 63])

    def stream() -> CpuFramePassStream:
        return CpuFramePassStream(
            weights,
            n_frames=40,
            frame_shape=(8, 8),
            dtype=np.dtype(np.uint16),
            want_sum=True,
            want_max=True,
            gather=gather,
        )

    s = stream()
    assert s.can_stop_early
    s.feed(frames[:12])
    s.feed(frames[12:24])
    with pytest.raises(ValueError, match="cannot stop after 10"):
        s.stop_early(10)
    s.stop_early(24)
    out, gathered = s.finish()
    whole = stream()
    whole.feed(frames)
    all_out, all_gathered = whole.finish()
    np.testing.assert_array_equal(out.per_frame, all_out.per_frame[:24])
    np.testing.assert_array_equal(out.pattern_sum, frames[:24].sum(axis=0, dtype=np.int64))
    np.testing.assert_array_equal(out.pattern_max, frames[:24].max(axis=0))
    assert gathered is not None and all_gathered is not None
    np.testing.assert_array_equal(gathered, all_gathered[:24])


def test_a_runtime_stream_cannot_stop_early_unless_it_says_so() -> None:
    from quantem_flow.runtimes.base import FramePassStream

    class Plain(FramePassStream):
        def feed(self, frames: np.ndarray) -> None:
            pass

        def finish(self) -> Any:
            return None

    plain = Plain()
    assert not plain.can_stop_early
    with pytest.raises(NotImplementedError, match="can_stop_early"):
        plain.stop_early(1)


# -- rows taken from a running chunk ----------------------------------------------------------


def _saved(data: np.ndarray, tmp_path: Any, *, chunk_rows: int) -> Any:
    """``data`` saved as a ``.npy`` (a file: its pieces can be mapped) and opened."""
    path = tmp_path / "data.npy"
    np.save(path, data)
    return qf.open(path, chunk_rows=chunk_rows)


def _spec(ds: Any, *, gather: np.ndarray | None = None, read_method: str = "auto") -> PassSpec:
    kr, kc = ds.detector_shape
    rr, cc = np.indices((kr, kc))
    weights = {
        "bf": ((rr - 8) ** 2 + (cc - 13) ** 2 < 16).astype(np.float64),
        "row": rr.astype(np.float64),
        "col": cc.astype(np.float64),
    }
    with qf.config.set(stream_piece_mib=0.01, map_piece_mib=0.01, read_method=read_method):
        lowered = lower_pass(
            ds, weights, want_sum=True, want_max=True, runtime="cpu", gather=gather, threads=2
        )
    assert lowered.spec.share_work
    return lowered.spec


def _taking_after_first_piece(
    monkeypatch: pytest.MonkeyPatch, spec: PassSpec, fail: bool, takes: int = 1
) -> Any:
    """After the owner's first piece, ``takes`` threads each take half the rest and run it.

    Each take splits the owner's stream (the parts are not started yet): the
    second part ends where the first begins.
    """
    feed = CpuFramePassStream.feed
    taken: list[Any] = []
    helpers: list[threading.Thread] = []

    def feed_then_let_another_take(self: CpuFramePassStream, frames: np.ndarray) -> None:
        feed(self, frames)
        if taken:  # the first piece is the owner's: helpers start after it
            return
        from quantem_flow.graphs import work_sharing

        work = work_sharing._POOLS[spec.pass_name]
        for _ in range(takes):
            part = work.take_rows()
            assert part is not None
            taken.append((part.start, part.stop))
            helper = threading.Thread(target=_run_part, args=(spec, work, part, fail))
            helpers.append(helper)
        for helper in helpers:
            helper.start()

    monkeypatch.setattr(CpuFramePassStream, "feed", feed_then_let_another_take)
    return taken, helpers


def _run_part(spec: PassSpec, work: PassWork, part: Any, fail: bool) -> None:
    mine = spec
    if fail:  # the taker's own read fails (the owner's dataset is untouched)
        broken = copy.copy(spec.dataset)
        object.__setattr__(broken, "load_block", _broken)
        mine = dataclasses.replace(spec, dataset=broken)
    run_taken_rows(mine, work, part)


def _broken(*args: Any, **kwargs: Any) -> Any:
    raise OSError("the file went away under the helper")


@pytest.mark.parametrize("read_method", ["mmap", "pread"])
@pytest.mark.parametrize("gathered", [False, True])
@pytest.mark.parametrize("takes", [1, 2])
def test_a_chunk_whose_tail_another_thread_ran_is_the_same_chunk(
    rng: np.random.Generator,
    tmp_path: Any,
    monkeypatch: pytest.MonkeyPatch,
    read_method: str,
    gathered: bool,
    takes: int,
) -> None:
    # one chunk of 24 rows, pieces of a row or so
    ds = _saved(probe_data(rng, scan=(24, 6)), tmp_path, chunk_rows=24)
    spec = _spec(ds, gather=np.array([0, 77, 519]) if gathered else None, read_method=read_method)
    alone = run_chunk_pass(spec, 0, 0, 24)
    taken, helpers = _taking_after_first_piece(monkeypatch, spec, fail=False, takes=takes)
    shared = run_chunk_group(spec, ((0, 0, 24),))
    for h in helpers:
        h.join(timeout=60)
    assert len(taken) == takes and 0 < taken[0][0] < 24
    if takes == 2:
        assert taken[1][1] == taken[0][0]  # the second part ends where the first begins
    np.testing.assert_array_equal(shared.blocks[0][1], alone.blocks[0][1])
    np.testing.assert_array_equal(shared.pattern_sum, alone.pattern_sum)
    np.testing.assert_array_equal(shared.pattern_max, alone.pattern_max)
    record = shared.records[0]
    assert record["content_digest"] == alone.records[0]["content_digest"]
    assert [u[:2] for u in record["digest_units"]] == [(r, r + 1) for r in range(24)]
    parts = record["streamed"]["shared"]
    assert [p["rows"] for p in parts] == sorted([list(t) for t in taken])
    assert all(p["thread"] != threading.current_thread().name for p in parts)
    if gathered:
        assert [rows for rows, _ in shared.gathered] == [(0, 24)]
        np.testing.assert_array_equal(shared.gathered[0][1], alone.gathered[0][1])
    assert pickle.loads(pickle.dumps(shared)).records[0]["streamed"]["shared"] == parts


def test_the_owner_raises_the_error_of_rows_another_thread_ran(
    rng: np.random.Generator, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    ds = _saved(probe_data(rng, scan=(24, 6)), tmp_path, chunk_rows=24)
    spec = _spec(ds, read_method="pread")
    _, helpers = _taking_after_first_piece(monkeypatch, spec, fail=True)
    done: list[BaseException] = []

    def owner() -> None:
        try:
            run_chunk_group(spec, ((0, 0, 24),))
        except BaseException as exc:
            done.append(exc)

    # the owner runs in a thread of its own so that a hang fails the test instead of blocking it
    t = threading.Thread(target=owner)
    t.start()
    t.join(timeout=60)
    assert not t.is_alive(), "the owner hung waiting for rows another thread ran"
    for h in helpers:
        h.join(timeout=60)
    assert len(done) == 1 and isinstance(done[0], OSError)
    assert "went away" in str(done[0])
    assert spec.pass_name not in active_passes()


# -- whole passes --------------------------------------------------------------------------------


def _pipeline(ds: Any) -> list[Any]:
    """The grouped passes' pipeline (BF, ADF, CoM, the mean pattern) and the maximum pattern."""
    return [*grouped_pipeline(ds), qf.max_diffraction(ds)]


def test_shared_passes_give_the_same_values_and_digests_as_unshared_ones(
    rng: np.random.Generator, tmp_path: Any
) -> None:
    ds = _saved(probe_data(rng, scan=(40, 7)), tmp_path, chunk_rows=5)  # 8 chunks
    with qf.config.set(share_work=False):
        plain = qf.compute(*_pipeline(ds), client="threads", progress=False)
    p = plain[0].provenance.execution
    assert p["tasks"]["work_sharing"].startswith("off: the share_work setting")
    # small pieces: many places to split, taken at whatever moment the threads meet
    with qf.config.set(stream_piece_mib=0.01, map_piece_mib=0.01):
        for _ in range(8):
            shared = qf.compute(*_pipeline(ds), client="threads", progress=False)
            for a, b in zip(plain, shared, strict=True):
                np.testing.assert_array_equal(a.data, b.data)
            s = shared[0].provenance.execution
            assert s["tasks"]["work_sharing"].startswith("on:")
            assert s["content_digest"] == p["content_digest"]
            assert [r["chunk"] for r in s["chunks"]] == list(range(8))
            assert s["bytes_read"] == p["bytes_read"]


def test_a_pass_that_sums_real_values_does_not_share(rng: np.random.Generator) -> None:
    ds = qf.open(probe_data(rng, scan=(8, 5)).astype(np.float32), chunk_rows=2)
    (out,) = qf.compute(qf.mean_diffraction(ds), client="threads", progress=False)
    assert out.provenance.execution["tasks"]["work_sharing"].startswith("off: the pass sums real")
    (bf,) = qf.compute(
        qf.virtual_bf(ds, radius=3, center=(8, 13)), client="threads", progress=False
    )
    assert bf.provenance.execution["tasks"]["work_sharing"].startswith("on:")


def test_sharing_runs_one_task_per_thread_of_one_process_only(rng: np.random.Generator) -> None:
    # 8 chunks of 1 MiB
    ds = qf.open(probe_data(rng, scan=(16, 16), det=(128, 128)), chunk_rows=2)
    w = {"bf": np.ones(ds.detector_shape)}
    one = lower_pass(ds, w, want_sum=True, want_max=False, runtime="cpu", threads=2)
    assert one.spec.share_work and one.covers == [(0, 1, 2, 3), (4, 5, 6, 7)]
    assert "one task per thread of 2 in one process" in one.tasks["rule"]
    two = lower_pass(ds, w, want_sum=True, want_max=False, runtime="cpu", threads=2, processes=2)
    assert not two.spec.share_work and len(two.covers) == 4
    assert "2 worker processes" in two.tasks["work_sharing"]
    with qf.config.set(pass_task_mib=1):  # every chunk its own task: more than the threads
        many = lower_pass(ds, w, want_sum=True, want_max=False, runtime="cpu", threads=2)
    assert not many.spec.share_work and "8 tasks for 2 threads" in many.tasks["work_sharing"]
    alone = lower_pass(ds, w, want_sum=True, want_max=False, runtime="cpu", threads=1)
    assert not alone.spec.share_work and "one thread" in alone.tasks["work_sharing"]
    assert len(alone.covers) == 2  # two tasks per thread, as without sharing


def test_shared_passes_on_a_cluster_worker(rng: np.random.Generator, tmp_path: Any) -> None:
    from distributed import Client

    ds = _saved(probe_data(rng, scan=(40, 7)), tmp_path, chunk_rows=5)
    with (
        dask_thread_cluster(threads_per_worker=2) as cluster,
        Client(cluster, set_as_default=False) as client,
        qf.config.set(stream_piece_mib=0.01, map_piece_mib=0.01),
    ):
        with qf.config.set(share_work=False):
            plain = qf.compute(*_pipeline(ds), client=client, progress=False)
        for _ in range(4):
            shared = qf.compute(*_pipeline(ds), client=client, progress=False)
            for a, b in zip(plain, shared, strict=True):
                np.testing.assert_array_equal(a.data, b.data)
    e = shared[0].provenance.execution
    assert e["tasks"]["work_sharing"].startswith("on:") and e["tasks"]["n_tasks"] == 2
    assert e["content_digest"] == plain[0].provenance.execution["content_digest"]


@pytest.mark.parametrize("where", ["threads", "cluster"])
def test_gathered_pixels_of_shared_passes_reach_the_client(
    rng: np.random.Generator, tmp_path: Any, where: str
) -> None:
    from distributed import Client

    from quantem_flow.graphs.runner import Runner

    data = probe_data(rng, scan=(40, 7))
    ds = _saved(data, tmp_path, chunk_rows=5)
    gather = np.array([0, 17, 200, 519], dtype=np.int64)
    expected = np.moveaxis(data.reshape(40, 7, -1)[:, :, gather], -1, 0)

    def run(runner: Runner) -> Any:
        with qf.config.set(stream_piece_mib=0.01, map_piece_mib=0.01):
            lowered = lower_pass(
                ds,
                {"bf": np.ones(ds.detector_shape)},
                want_sum=True,
                want_max=False,
                runtime="cpu",
                gather=gather,
                threads=2,
            )
        assert lowered.spec.share_work and len(lowered.covers) == 2
        runner.run([lowered], progress=False)
        return runner.gathered[0][np.arange(4)]

    for _ in range(4):
        if where == "threads":
            got = run(Runner("threads"))
        else:
            with (
                dask_thread_cluster(threads_per_worker=2) as cluster,
                Client(cluster, set_as_default=False) as client,
            ):
                got = run(Runner(client))
        np.testing.assert_array_equal(got, expected)


def test_a_chunk_another_thread_took_from_a_queue_comes_back_to_its_task(
    rng: np.random.Generator, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from quantem_flow.graphs import pass_groups, work_sharing

    # 4 chunks, one task's queue
    ds = _saved(probe_data(rng, scan=(16, 6)), tmp_path, chunk_rows=4)
    spec = _spec(ds)
    chunks = tuple((i, r0, r1) for i, (r0, r1) in enumerate(ds.chunks))
    alone = [run_chunk_pass(spec, *c) for c in chunks]
    feed = CpuFramePassStream.feed
    helpers: list[threading.Thread] = []

    def feed_then_let_another_take(self: CpuFramePassStream, frames: np.ndarray) -> None:
        feed(self, frames)
        if helpers:
            return
        work = work_sharing._POOLS[spec.pass_name]
        lent = work.take_chunk()
        assert lent is not None and lent.chunk == chunks[-1]
        helper = threading.Thread(target=pass_groups._run_lent, args=(spec, work, lent))
        helpers.append(helper)
        helper.start()

    monkeypatch.setattr(CpuFramePassStream, "feed", feed_then_let_another_take)
    group = run_chunk_group(spec, chunks)
    for h in helpers:
        h.join(timeout=60)
    assert len(helpers) == 1
    # the task returns exactly its chunks, in order, the last one run by the other thread
    assert [r["chunk"] for r in group.records] == [0, 1, 2, 3]
    assert [rows for rows, _ in group.blocks] == list(ds.chunks)
    assert [bool(r.get("taken_from_queue")) for r in group.records] == [False] * 3 + [True]
    for (_, got), one in zip(group.blocks, alone, strict=True):
        np.testing.assert_array_equal(got, one.blocks[0][1])
    np.testing.assert_array_equal(group.pattern_sum, sum(one.pattern_sum for one in alone))
    assert [r["content_digest"] for r in group.records] == [
        one.records[0]["content_digest"] for one in alone
    ]
