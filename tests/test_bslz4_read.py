"""Dense bitshuffle reads decode the stored chunks themselves, in threads (issue 14).

Every read is compared with h5py's own read through the HDF5 filter, bit for
bit; corrupt chunks are CorruptChunkErrors naming file, dataset, chunk and
byte offset; the dense readers no longer read every chunk twice (check, then
HDF5 filter).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from quantem_flow.errors import CorruptChunkError
from quantem_flow.io import bslz4_read
from quantem_flow.io.hdf5 import dataset_filters
from tests.io.writers import write_dectris, write_hdf5


def _write(path: Path, data: np.ndarray, chunks: tuple[int, ...], cname: str = "lz4") -> Path:
    import h5py
    import hdf5plugin

    with h5py.File(path, "w") as f:
        f.create_dataset("data", data=data, chunks=chunks, **hdf5plugin.Bitshuffle(cname=cname))
    return path


def _read(path: Path, bounds: list[tuple[int, int]], threads: int) -> tuple[Any, Any]:
    import h5py

    with h5py.File(path, "r") as f:
        d = f["data"]
        expected = d[tuple(slice(a, b) for a, b in bounds)]
        out = np.empty(expected.shape, dtype=expected.dtype.newbyteorder("="))
        bslz4_read.read_bitshuffle(d, bounds, out, where="test", threads=threads)
    return out, expected


@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize(
    ("shape", "chunks", "dtype", "cname", "bounds"),
    [
        ((30, 24, 20), (1, 24, 20), "<u2", "lz4", [(0, 30), (0, 24), (0, 20)]),
        ((30, 24, 20), (4, 24, 20), "<u2", "lz4", [(3, 29), (0, 24), (0, 20)]),
        ((30, 24, 20), (4, 8, 20), ">u4", "lz4", [(5, 17), (3, 22), (2, 19)]),
        ((5, 6, 16, 16), (1, 1, 16, 16), "<u2", "lz4", [(1, 4), (2, 5), (0, 16), (0, 16)]),
        ((5, 6, 16, 16), (1, 6, 16, 16), "<f4", "zstd", [(0, 5), (0, 6), (0, 16), (0, 16)]),
    ],
)
def test_parallel_decode_equals_h5py(
    tmp_path: Path,
    shape: tuple[int, ...],
    chunks: tuple[int, ...],
    dtype: str,
    cname: str,
    bounds: list[tuple[int, int]],
    threads: int,
) -> None:
    rng = np.random.default_rng(1)
    data = rng.poisson(3, size=shape).astype(dtype)
    path = _write(tmp_path / "d.h5", data, chunks, cname)
    out, expected = _read(path, bounds, threads)
    assert out.dtype == expected.dtype.newbyteorder("=")
    np.testing.assert_array_equal(out, expected)


def test_unwritten_and_unfiltered_chunks_read_as_hdf5_defines(tmp_path: Path) -> None:
    import h5py
    import hdf5plugin

    path = tmp_path / "sparse.h5"
    raw = np.arange(8 * 8, dtype=np.uint16).reshape(1, 8, 8)
    with h5py.File(path, "w") as f:
        d = f.create_dataset(
            "data",
            shape=(6, 8, 8),
            dtype=np.uint16,
            chunks=(1, 8, 8),
            fillvalue=7,
            **hdf5plugin.Bitshuffle(cname="lz4"),
        )
        d[0] = np.full((8, 8), 3, np.uint16)
        d.id.write_direct_chunk((2, 0, 0), raw.tobytes(), filter_mask=1)  # filter skipped
        d[4] = np.full((8, 8), 5, np.uint16)
    out, expected = _read(path, [(0, 6), (0, 8), (0, 8)], 2)
    np.testing.assert_array_equal(out, expected)
    assert out[1, 0, 0] == 7 and out[2].tolist() == raw[0].tolist()


def test_offsets_checked_and_hdf5_fallback_gives_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = np.random.default_rng(2).poisson(2, size=(12, 16, 16)).astype(np.uint16)
    path = _write(tmp_path / "d.h5", data, (1, 16, 16))
    import h5py

    with h5py.File(path, "r") as f:
        assert bslz4_read.chunk_index(f["data"]).direct
    monkeypatch.setattr(bslz4_read, "_offsets_usable", lambda *a: False)
    bslz4_read._cache.clear()
    try:
        out, expected = _read(path, [(2, 11), (0, 16), (0, 16)], 2)
        with h5py.File(path, "r") as f:
            assert not bslz4_read.chunk_index(f["data"]).direct
    finally:
        bslz4_read._cache.clear()
    np.testing.assert_array_equal(out, expected)


def _flip(path: Path, chunk: tuple[int, ...], byte: int, bit: int = 6) -> int:
    import h5py

    with h5py.File(path, "r") as f:
        where = int(f["data"].id.get_chunk_info_by_coord(chunk).byte_offset)
    with open(path, "r+b") as fh:
        fh.seek(where + byte)
        value = fh.read(1)[0]
        fh.seek(where + byte)
        fh.write(bytes([value ^ (1 << bit)]))
    return where


@pytest.mark.parametrize(("byte", "bit"), [(4, 6), (10, 5), (12, 6)])
def test_corrupt_chunk_is_named(tmp_path: Path, byte: int, bit: int) -> None:
    import quantem_flow as qf

    data = np.random.default_rng(3).poisson(3, size=(24, 32, 32)).astype(np.uint16)
    path = _write(tmp_path / "d.h5", data, (1, 32, 32))
    where = _flip(path, (9, 0, 0), byte, bit)
    ds = qf.open(path, dataset_path="/data", scan_shape=(4, 6))
    with pytest.raises(CorruptChunkError) as info:
        ds.load_block((0, 4))
    msg = str(info.value)
    assert str(path) in msg and "'/data'" in msg, msg
    assert "stored chunk (9, 0, 0)" in msg and f"byte offset {where}" in msg, msg


def test_dense_readers_read_each_chunk_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check-then-HDF5-filter path (every chunk read twice) is not taken any more."""
    import quantem_flow as qf
    from quantem_flow.io import dectris, encoded_chunks, hdf5

    def twice(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("chunks were checked, then read again through the HDF5 filter")

    monkeypatch.setattr(encoded_chunks, "check_bitshuffle_chunks", twice)
    monkeypatch.setattr(dectris, "check_bitshuffle_chunks", twice)
    frames = np.random.default_rng(5).poisson(3, size=(24, 32, 32)).astype(np.uint16)
    path = write_hdf5(tmp_path / "d.h5", frames)
    layout = hdf5.Hdf5Source(path, dataset_path="/data", scan_shape=(4, 6))._layout
    assert bslz4_read.supports(layout)
    ds = qf.open(path, dataset_path="/data", scan_shape=(4, 6))
    np.testing.assert_array_equal(ds.load_block((0, 4)), frames.reshape(4, 6, 32, 32))
    np.testing.assert_array_equal(
        ds.load_block((1, 3), (2, 5)), frames.reshape(4, 6, 32, 32)[1:3, 2:5]
    )
    path4 = write_hdf5(tmp_path / "d4.h5", frames.reshape(4, 6, 32, 32))
    ds4 = qf.open(path4, dataset_path="/data")
    np.testing.assert_array_equal(ds4.load_block((1, 4)), frames.reshape(4, 6, 32, 32)[1:4])
    master = write_dectris(tmp_path, "acq", frames, frames_per_file=10)
    dsd = qf.open(master, scan_shape=(4, 6))
    np.testing.assert_array_equal(dsd.load_block((0, 4)), frames.reshape(4, 6, 32, 32))


def test_supports_only_bitshuffle_lz4_or_zstd(tmp_path: Path) -> None:
    import h5py

    data = np.zeros((4, 8, 8), np.uint16)
    path = _write(tmp_path / "b.h5", data, (1, 8, 8))
    with h5py.File(path, "a") as f:
        f.create_dataset("plain", data=data)
        f.create_dataset("gzip", data=data, chunks=(1, 8, 8), compression="gzip")
        assert bslz4_read.supports(dataset_filters(f["data"]))
        assert not bslz4_read.supports(dataset_filters(f["plain"]))
        assert not bslz4_read.supports(dataset_filters(f["gzip"]))
        sel = bslz4_read.read_selection(
            f["plain"], dataset_filters(f["plain"]), np.s_[0:2], where="x"
        )
        assert sel is None


def test_runs_of_frames_decoded_as_one_stream_equal_h5py(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """64 x 64 uint16 frames hold whole bitshuffle blocks: Zstandard runs decode in groups."""
    monkeypatch.setattr(bslz4_read, "GROUP_BYTES", 10 * 64 * 64 * 2)  # groups of 10 frames
    data = np.random.default_rng(6).poisson(2, size=(95, 64, 64)).astype(np.uint16)
    path = _write(tmp_path / "g.h5", data, (1, 64, 64), cname="zstd")
    calls: list[int] = []
    real = bslz4_read._bodies

    def spy(*args: Any) -> Any:
        calls.append(1)
        return real(*args)

    monkeypatch.setattr(bslz4_read, "_bodies", spy)
    for threads in (1, 2):
        out, expected = _read(path, [(3, 94), (0, 64), (0, 64)], threads)
        np.testing.assert_array_equal(out, expected)
    assert calls  # the grouped path was taken


def test_the_in_place_decoder_equals_the_binding() -> None:
    """``bshuf_decompress_lz4`` through ctypes: the binding's values, written in place.

    (Streams are checked before this decoder sees them; corrupt chunks are
    tests/test_corrupt_bitshuffle.py's.)
    """
    import bitshuffle

    from quantem_flow.io.bslz4_read import decode_lz4_into

    into = decode_lz4_into()
    assert into is not None, "the bitshuffle build exports bshuf_decompress_lz4"
    rng = np.random.default_rng(4)
    values = rng.poisson(3.0, size=3 * 64 * 64).astype(np.uint16)
    stream = bitshuffle.compress_lz4(values, 0)
    out = np.zeros_like(values)
    assert into(stream.ctypes.data, out.ctypes.data, values.size, 2, 0) == stream.size
    np.testing.assert_array_equal(out, values)
    np.testing.assert_array_equal(
        out, bitshuffle.decompress_lz4(stream, values.shape, values.dtype, 0)
    )


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(
    ("shape", "bounds"),
    [
        ((95, 32, 32), [(3, 94), (0, 32), (0, 32)]),
        ((7, 9, 32, 32), [(1, 6), (2, 9), (0, 32), (0, 32)]),
        ((7, 9, 32, 32), [(2, 3), (0, 5), (0, 32), (0, 32)]),
    ],
)
def test_lz4_frames_decode_in_one_compiled_call_per_run(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    shape: tuple[int, ...],
    bounds: list[tuple[int, int]],
    threads: int,
) -> None:
    """One-frame LZ4 chunks (3-D or 4-D) are checked and decoded without Python per frame.

    Runs are read across the few bytes of chunk index HDF5 writes between
    them (``GAP_BYTES``); values equal h5py's for 3-D and 4-D selections.
    """
    data = np.random.default_rng(8).poisson(3, size=shape).astype(np.uint16)
    path = _write(tmp_path / "f.h5", data, (1,) * (len(shape) - 2) + shape[-2:])
    calls: list[int] = []
    real = bslz4_read._decode_span

    def spy(*args: Any) -> Any:
        calls.append(int(args[2].shape[0]))
        return real(*args)

    monkeypatch.setattr(bslz4_read, "_decode_span", spy)
    out, expected = _read(path, bounds, threads)
    np.testing.assert_array_equal(out, expected)
    assert sum(calls) == int(np.prod([b - a for a, b in bounds[:-2]]))


def test_a_chunk_index_gap_inside_a_run_is_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Chunks apart by a few bytes are read in one call and decoded from their own offsets."""
    monkeypatch.setattr(bslz4_read, "GAP_BYTES", 0)
    data = np.random.default_rng(9).poisson(3, size=(300, 16, 16)).astype(np.uint16)
    path = _write(tmp_path / "gap.h5", data, (1, 16, 16))
    import h5py

    with h5py.File(path, "r") as f:
        index = bslz4_read.chunk_index(f["data"])
    ends = index.byte_offset[:-1] + index.size[:-1]
    gaps = index.byte_offset[1:] - ends
    assert (gaps > 0).any(), "HDF5 wrote chunk-index nodes between chunks"
    reads: list[int] = []
    real = bslz4_read.os.preadv

    def counting(fd: int, buffers: Any, offset: int) -> int:
        reads.append(offset)
        return real(fd, buffers, offset)

    monkeypatch.setattr(bslz4_read.os, "preadv", counting)
    exact, _ = _read(path, [(0, 300), (0, 16), (0, 16)], 1)
    apart = len(reads)
    monkeypatch.setattr(bslz4_read, "GAP_BYTES", 64 << 10)
    merged, expected = _read(path, [(0, 300), (0, 16), (0, 16)], 1)
    np.testing.assert_array_equal(exact, expected)
    np.testing.assert_array_equal(merged, expected)
    assert len(reads) - apart < apart, (apart, len(reads) - apart)


def test_bounds_outside_the_dataset_are_refused(tmp_path: Path) -> None:
    """Bounds beyond the shape name the shape, instead of reading other chunks."""
    import h5py

    from quantem_flow.errors import ShapeError

    data = np.random.default_rng(10).poisson(3, size=(5, 7, 16, 16)).astype(np.uint16)
    path = _write(tmp_path / "b.h5", data, (1, 1, 16, 16))
    with h5py.File(path, "r") as f:
        out = np.empty((1, 2, 16, 16), dtype=np.uint16)
        with pytest.raises(ShapeError, match=r"\(5, 7, 16, 16\)"):
            bslz4_read.read_bitshuffle(
                f["data"], [(1, 2), (6, 8), (0, 16), (0, 16)], out, where="t"
            )
        with pytest.raises(ShapeError, match="within"):
            bslz4_read.read_bitshuffle(
                f["data"], [(-1, 0), (0, 2), (0, 16), (0, 16)], out, where="t"
            )


def test_every_decoding_thread_runs_the_codec_on_one_openmp_thread(tmp_path: Path) -> None:
    """The library splits each call over OpenMP threads unless told not to, per thread.

    A task thread's first read must set it (a team per call in every thread
    but the first measured 5-50x slower).
    """
    import threading

    import h5py

    from quantem_flow.representations import encoded

    data = np.random.default_rng(11).poisson(3, size=(40, 16, 16)).astype(np.uint16)
    path = _write(tmp_path / "t.h5", data, (1, 16, 16))
    seen: list[bool] = []
    with h5py.File(path, "r") as f:

        def read() -> None:
            out = np.empty((40, 16, 16), dtype=np.uint16)
            bslz4_read.read_bitshuffle(f["data"], [(0, 40), (0, 16), (0, 16)], out, where="t")
            np.testing.assert_array_equal(out, data)
            seen.append(bool(getattr(encoded._OPENMP, "done", False)))

        read()  # the codec loaded in this thread first, as in a worker
        for _ in range(3):  # then each new task thread's first read
            t = threading.Thread(target=read)
            t.start()
            t.join()
    assert seen == [True, True, True, True]


def test_a_rewritten_file_is_read_anew(tmp_path: Path) -> None:
    """The per-dataset plan is checked against the file on every read."""
    import os

    import h5py

    first = np.random.default_rng(12).poisson(3, size=(20, 16, 16)).astype(np.uint16)
    path = _write(tmp_path / "r.h5", first, (1, 16, 16))
    a, _ = _read(path, [(0, 20), (0, 16), (0, 16)], 1)
    second = first[::-1].copy() + 1
    _write(tmp_path / "r.h5", second, (1, 16, 16))
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    b, _ = _read(path, [(0, 20), (0, 16), (0, 16)], 1)
    np.testing.assert_array_equal(a, first)
    np.testing.assert_array_equal(b, second)
    with h5py.File(path, "r") as f:
        d = f["data"]
        out = np.empty((20, 16, 16), dtype=np.uint16)
        bslz4_read.read_bitshuffle(d, [(0, 20), (0, 16), (0, 16)], out, where="t")
        f.close()
        with pytest.raises((ValueError, RuntimeError, OSError)):
            bslz4_read.read_bitshuffle(d, [(0, 20), (0, 16), (0, 16)], out, where="t")
