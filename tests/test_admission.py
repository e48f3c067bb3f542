"""Admission counts what a chunk task really needs (issue 11 item 6), on a local cluster.

Workers of a few hundred MiB reproduce the issue at small scale: a chunk
that passed the old 80 % budget check but could not run next to the worker
process itself is now refused up front, before any chunk is read, with the
need broken down and a chunk size that fits; chunks that fit one at a time
but not three at a time run on a 3-thread worker without it being killed,
because each task holds its memory need as a Dask resource while it runs.
"""

from __future__ import annotations

import concurrent.futures
import time
from pathlib import Path

import numpy as np
import pytest

import quantem_flow as qf
from quantem_flow.errors import PlacementError

MiB = 2**20
FRAME = (256, 256)  # uint16: 128 KiB per frame


def sparse_npy(path: Path, scan: tuple[int, int], marks: dict[tuple[int, int], int]) -> Path:
    """A ``uint16`` ``.npy`` file that is zero (a sparse file) except one pixel per mark."""
    arr = np.lib.format.open_memmap(path, mode="w+", dtype=np.uint16, shape=(*scan, *FRAME))
    for (r, c), value in marks.items():
        arr[r, c, 128, 128] = value
    arr.flush()
    del arr
    return path


def cluster(nthreads: int, memory_limit: int):  # type: ignore[no-untyped-def]
    from distributed import Client

    from quantem_flow.graphs.cluster import start_local_cluster

    c = start_local_cluster(
        workers=[{"runtimes": ["cpu"], "nthreads": nthreads, "memory_limit": memory_limit}],
        dashboard_address="127.0.0.1:0",
    )
    return c, Client(c, set_as_default=False)


@pytest.mark.cluster
def test_a_chunk_that_cannot_fit_is_refused_up_front(tmp_path: Path) -> None:
    # 400 MiB chunks on a 600 MiB worker: under the old check (80 % = 480 MiB) they were
    # admitted, and the worker (about 190 MiB of its own once kernels ran) was killed
    path = sparse_npy(tmp_path / "big.npy", (4, 1600), {(0, 0): 7})
    ds = qf.open(path, chunk_rows=2)  # 200 MiB per scan row
    assert ds.chunks == [(0, 2), (2, 4)]
    lc, client = cluster(1, 600 * MiB)
    try:
        (info,) = client.scheduler_info()["workers"].values()
        pool = info["resources"]["qf-memory-host"]
        assert 0 < pool < info["resources"]["qf-budget-cpu"] < 400 * MiB * 1.25
        t0 = time.monotonic()
        # whole chunks (streaming off): a task holds its 400 MiB chunk
        with qf.config.set(stream_piece_mib=0), pytest.raises(PlacementError) as err:
            qf.compute(qf.virtual_bf(ds, radius=4, center=(128, 128)), client=client)
        elapsed = time.monotonic() - t0
        text = str(err.value)
        assert "admission refused before reading any chunk" in text
        assert "payload (in the staging buffer) 400.0 MiB" in text
        assert f"{pool / MiB:.1f} MiB" in text  # the worker's budget is named
        # and what the worker's own process takes, left out of that budget
        assert "its own process (interpreter, libraries, compiled kernels) takes" in text
        assert "of its 600.0 MiB memory limit" in text
        # the suggested chunk size fits: one row of 200 MiB (and its kernel memory)
        assert "chunk_rows=1)" in text and "chunk_mib=200.0 or less" in text
    finally:
        client.close()
        lc.close()
    assert elapsed < 10, "refused up front, not after workers died"


@pytest.mark.cluster
def test_a_streamed_pass_is_admitted_for_the_piece_it_holds(tmp_path: Path) -> None:
    """Issue 23, item 10: a streamed task holds one piece, and admission counts one piece.

    The same 400 MiB chunks that are refused whole on a 600 MiB worker stream in 2 MiB
    pieces: admitted, computed, equal to the reference.
    """
    path = sparse_npy(tmp_path / "big.npy", (4, 1600), {(0, 0): 7, (3, 5): 9})
    ds = qf.open(path, chunk_rows=2)
    from quantem_flow.graphs.lowering import streamed_piece_bytes, task_memory_need

    piece = streamed_piece_bytes(ds, "cpu", 2 * MiB)
    assert piece is not None and piece <= 2 * MiB
    # a mapped piece (pages held until dropped) counts where it is the larger one
    mapped = streamed_piece_bytes(ds, "cpu", 2 * MiB, map_piece=16 * MiB)
    assert mapped is not None and 8 * MiB < mapped <= 16 * MiB
    assert streamed_piece_bytes(ds, "cpu", 2 * MiB, map_piece=1 * MiB) == piece
    need = task_memory_need(ds, runtime="cpu", n_weights=1, piece_bytes=piece)
    assert need.parts["staging buffer (one streamed piece)"] <= 2 * MiB
    assert need.pools["host"] < 64 * MiB  # was > 400 MiB counted whole
    lc, client = cluster(1, 600 * MiB)
    try:
        (bf,) = qf.compute(qf.virtual_bf(ds, radius=4, center=(128, 128)), client=client)
        (ref,) = qf.compute(qf.virtual_bf(ds, radius=4, center=(128, 128)), client="synchronous")
        np.testing.assert_array_equal(bf.data, ref.data)
        records = bf.provenance.execution["chunks"]
        assert all(r["made"] == "dense read, streamed" for r in records), records
        # a read piece within what admission counted for the task: the setting's 2 MiB, or
        # a larger pread piece the worker's read probe chose (at most the mapped piece's bytes)
        for r in records:
            held = r["streamed"]["buffer_bytes"]
            assert held <= mapped
            assert held <= 2 * MiB or held <= r["streamed"]["read"]["piece_bytes"]
    finally:
        client.close()
        lc.close()


@pytest.mark.cluster
def test_chunks_that_fit_one_at_a_time_run_without_killing_a_3_thread_worker(
    tmp_path: Path,
) -> None:
    # 150 MiB chunks, 3 threads, 600 MiB worker: three at once (450 MiB + the process)
    # passed the old check per chunk and got the worker killed; now the worker runs only
    # as many at once as its memory pool holds
    scan = (6, 1200)
    marks = {(r, 3 * r + 1): 10 + r for r in range(scan[0])}
    path = sparse_npy(tmp_path / "rows.npy", scan, marks)
    ds = qf.open(path, chunk_rows=1)
    lc, client = cluster(3, 600 * MiB)
    try:
        (info,) = client.scheduler_info()["workers"].values()
        pool = info["resources"]["qf-memory-host"]
        assert 150 * MiB < pool < 3 * 150 * MiB, "fits one at a time, not three"
        # before: three chunks at once took the worker over its memory limit (642 MiB RSS on
        # 600 MiB): paused, the pass never finished (under a nanny: killed, KilledWorker)
        with concurrent.futures.ThreadPoolExecutor(1) as pool_:
            run = pool_.submit(
                qf.compute, qf.virtual_bf(ds, radius=4, center=(128, 128)), client=client
            )
            try:
                (bf,) = run.result(timeout=120)
            except concurrent.futures.TimeoutError:
                client.close()  # ends the pass, so the thread returns
                pytest.fail("the pass did not finish: the worker ran out of memory and paused")
        expected = np.zeros(scan, dtype=np.int64)
        for (r, c), v in marks.items():
            expected[r, c] = v
        np.testing.assert_array_equal(np.asarray(bf.data), expected)
        (worker,) = client.scheduler_info()["workers"].values()
        assert worker["id"] == info["id"], "the worker was never restarted"
    finally:
        client.close()
        lc.close()


@pytest.mark.parametrize("kernel", ["compiled", "exact-numpy"])
@pytest.mark.parametrize("view", ["dense", "bin2", "crop", "packed", "paired"])
def test_the_counted_need_bounds_what_a_chunk_task_allocates(
    view: str, kernel: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both CPU paths: the compiled kernel, and NumPy's exact products while it compiles."""
    import tracemalloc

    from quantem_flow.runtimes.cpu import warmup

    if kernel == "exact-numpy":  # as in a process whose kernel has not compiled yet
        monkeypatch.setattr(warmup, "is_ready", lambda key: False)
        monkeypatch.setattr(warmup, "start", lambda key, warm: None)

    from quantem_flow.graphs.lowering import task_memory_need
    from quantem_flow.graphs.tasks import PassSpec, run_chunk_pass
    from quantem_flow.runtimes.staging import clear_staging_buffers

    data = np.random.default_rng(3).integers(0, 5, (32, 64, 64, 64)).astype(np.uint16)
    np.save(tmp_path / "d.npy", data)
    ds = qf.open(tmp_path / "d.npy", chunk_rows=16)
    ds = {
        "dense": ds,
        "bin2": ds.bin_detector(2),
        "crop": ds.crop_detector((8, 56, 8, 56)),
        "packed": ds.to_representation("packed"),
        "paired": ds.to_representation("paired"),
    }[view]
    k = ds.detector_shape[0] * ds.detector_shape[1]
    spec = PassSpec(
        dataset=ds, weights=np.ones((5, k)), want_sum=True, want_max=True, runtime="cpu"
    )
    with qf.config.set(jit_in_background=kernel == "exact-numpy"):
        run_chunk_pass(spec, 0, 0, 16)  # kernels compiled outside the measurement
        clear_staging_buffers()
        tracemalloc.start()
        try:
            part = run_chunk_pass(spec, 1, 16, 32)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    variant = part.records[0].get("frame_pass_variant", {}).get("variant")
    if view in ("dense", "bin2", "crop"):  # the others run their representation's kernels
        assert (variant == "exact-numpy") == (kernel == "exact-numpy"), variant
    need = task_memory_need(ds, runtime="cpu", n_weights=5)
    assert need.pools == {"host": need.total}
    # an upper bound (paired assumes every pixel may be an event), never wildly above
    assert peak <= need.total <= 2.1 * peak, (view, peak, need.parts)
    rows = need.rows
    assert need.total == need.fixed["host"] + rows * need.per_row["host"]
