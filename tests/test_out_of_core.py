"""Out-of-core reads: file-backed readers never keep a file mapped (issue 11, item 1).

A memory map keeps every page a pass has read resident in the worker
process (``RssFile``); Dask counts it as worker memory, pauses the worker at
its pause fraction and never resumes it.  The readers of ``.npy``, raw,
Merlin and EMPAD files read with ``pread`` into the buffer they fill.
"""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import quantem_flow as qf
from quantem_flow.io.npy import NpySource
from quantem_flow.io.raw import RawSource

MiB = 1 << 20


def _rss_file() -> int:
    """This process's file-backed resident memory in bytes (Linux)."""
    text = Path("/proc/self/status").read_text()
    m = re.search(r"^RssFile:\s+(\d+) kB", text, re.MULTILINE)
    assert m is not None
    return int(m.group(1)) * 1024


linux_only = pytest.mark.skipif(
    not Path("/proc/self/status").exists(), reason="needs /proc/self/status (Linux)"
)


def _write_npy(path: Path, frames: int, det: tuple[int, int], fortran: bool = False) -> np.ndarray:
    arr = np.lib.format.open_memmap(
        path, mode="w+", dtype=np.uint16, shape=(frames, *det), fortran_order=fortran
    )
    for i in range(0, frames, 1024):
        n = min(1024, frames - i)
        arr[i : i + n] = (np.arange(i, i + n, dtype=np.uint64)[:, None, None] % 65521).astype(
            np.uint16
        ) + np.arange(det[1], dtype=np.uint16)
    arr.flush()
    del arr
    return np.load(path)


@linux_only
@pytest.mark.parametrize("kind", ["npy3", "npy4", "raw", "raw_headers", "raw_be"])
def test_reading_a_whole_file_keeps_no_file_pages_resident(tmp_path: Path, kind: str) -> None:
    det = (64, 64)
    frames = 8192  # 64 MiB of uint16
    path = tmp_path / "d.bin"
    rng = np.random.default_rng(5)
    data = rng.integers(0, 60000, size=(frames, *det), dtype=np.uint16)
    src: Any
    if kind == "npy3":
        np.save(path.with_suffix(".npy"), data)
        src = NpySource(path.with_suffix(".npy"), scan_shape=(64, 128))
    elif kind == "npy4":
        np.save(path.with_suffix(".npy"), data.reshape(64, 128, *det))
        src = NpySource(path.with_suffix(".npy"))
    elif kind == "raw":
        data.tofile(path)
        src = RawSource(path, dtype="<u2", frame_shape=det, scan_shape=(64, 128))
    elif kind == "raw_be":
        data.astype(">u2").tofile(path)
        src = RawSource(path, dtype=">u2", frame_shape=det, scan_shape=(64, 128))
    else:
        rec = np.zeros(frames, dtype=[("h", "V24"), ("f", "<u2", det), ("t", "V8")])
        rec["f"] = data
        with open(path, "wb") as fh:
            fh.write(b"X" * 100)
            rec.tofile(fh)
        src = RawSource(
            path,
            dtype="<u2",
            frame_shape=det,
            scan_shape=(64, 128),
            offset=100,
            frame_header_bytes=24,
            frame_footer_bytes=8,
        )
    expect = data.reshape(64, 128, *det)
    before = _rss_file()
    buf = np.empty((4, 128, *det), dtype=np.uint16)
    for r in range(0, 64, 4):
        block = src.read((r, r + 4), (0, 128), buffer=buf)
        np.testing.assert_array_equal(block, expect[r : r + 4])
    # a partial-column block (row-wise reads) and an allocating read
    np.testing.assert_array_equal(src.read((3, 9), (5, 70)), expect[3:9, 5:70])
    np.testing.assert_array_equal(src.read_frames(100, 140), data[100:140])
    grown = _rss_file() - before
    assert grown < 8 * MiB, f"file-backed RSS grew by {grown / MiB:.1f} MiB reading 64 MiB"


@linux_only
def test_fortran_ordered_npy_reads_correctly_without_keeping_a_map(tmp_path: Path) -> None:
    path = tmp_path / "f.npy"
    data = _write_npy(path, 512, (16, 24), fortran=True)
    src = NpySource(path, scan_shape=(16, 32))
    np.testing.assert_array_equal(src.read((2, 7), (0, 32)), data.reshape(16, 32, 16, 24)[2:7])
    np.testing.assert_array_equal(src.read((2, 7), (3, 9)), data.reshape(16, 32, 16, 24)[2:7, 3:9])
    assert not hasattr(src, "_handle_mm")


def _worker_rss() -> dict[str, int]:
    import psutil

    mem = psutil.Process().memory_full_info()
    return {"rss": int(mem.rss), "anon": int(mem.rss - getattr(mem, "shared", 0))}


@pytest.mark.cluster
@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["npy", "raw"])
def test_bf_adf_com_over_a_file_larger_than_the_workers_memory(tmp_path: Path, fmt: str) -> None:
    """576 MiB through 2 workers limited to 300 MiB each: completes, RSS bounded.

    An idle worker process already holds ~130 MiB, so each worker has ~170
    MiB to work in and must read ~290 MiB of the file.
    """
    from distributed import Client

    from quantem_flow.graphs.cluster import start_local_cluster

    det = (64, 64)
    scan = (288, 256)  # 73728 frames of 8 KiB = 576 MiB
    path = tmp_path / ("d.npy" if fmt == "npy" else "d.raw")
    data = _write_npy(tmp_path / "d.npy", scan[0] * scan[1], det)
    if fmt == "raw":
        data.tofile(path)
        (tmp_path / "d.npy").unlink()
        ds = qf.open(path, format="raw", dtype="<u2", frame_shape=det, scan_shape=scan)
    else:
        ds = qf.open(path, scan_shape=scan)
    ds = ds.rechunk(rows=2)  # 4 MiB chunks
    limit = 300 * MiB
    assert path.stat().st_size > 1.9 * limit
    expect_total = data.reshape(*scan, -1).sum(axis=2, dtype=np.float64)
    del data
    cluster = start_local_cluster(n_workers=2, threads_per_worker=1, memory_limit=limit)
    client = Client(cluster, set_as_default=False)
    peaks: dict[str, int] = {}
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            try:
                for addr, m in client.run(_worker_rss).items():
                    peaks[addr] = max(peaks.get(addr, 0), m["rss"])
            except Exception:
                pass
            stop.wait(0.25)

    sampler = threading.Thread(target=sample, daemon=True)
    try:
        sampler.start()
        result: dict[str, Any] = {}

        def run() -> None:
            try:
                result["out"] = qf.compute(
                    qf.virtual_bf(ds, radius=46, center=(32, 32)),  # every pixel (<= 45.3)
                    qf.virtual_adf(ds, inner=20, center=(32, 32)),
                    qf.center_of_mass(ds, center=(32, 32)),
                    client=client,
                    progress=False,
                )
            except BaseException as exc:
                result["error"] = exc

        t = threading.Thread(target=run, daemon=True)
        t0 = time.perf_counter()
        t.start()
        t.join(timeout=150)
        assert not t.is_alive(), (
            f"the {fmt} pass did not finish within 150 s (workers paused?); peak worker RSS "
            f"{ {a: p // MiB for a, p in peaks.items()} } MiB"
        )
        assert "error" not in result, f"the {fmt} pass failed: {result.get('error')!r}"
        bf, _adf, com = result["out"]
        np.testing.assert_array_equal(bf.data, expect_total)
        assert np.isfinite(com.data).all()
        assert peaks, "no RSS sample was taken"
        assert max(peaks.values()) < 0.8 * limit, (
            f"worker RSS reached {max(peaks.values()) / MiB:.0f} MiB of a {limit // MiB} MiB "
            f"limit in {time.perf_counter() - t0:.1f} s"
        )
    finally:
        stop.set()
        sampler.join(timeout=5)
        client.close()
        cluster.close()
