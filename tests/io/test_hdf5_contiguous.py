"""Contiguous, unfiltered HDF5 datasets are read with ``pread`` at their offset (issue 14).

h5py serialises every call of a process behind one lock, so two task
threads reading one file took turns; these datasets are one run of bytes
whose place ``H5Dget_offset`` gives.
"""

from __future__ import annotations

import pickle
import threading
from pathlib import Path

import h5py
import numpy as np
import pytest

import quantem_flow as qf
from quantem_flow.io.hdf5 import Hdf5Source, contiguous_offset


@pytest.mark.parametrize("dtype", ["<u2", ">u2", "<f4", ">i4", "u1"])
@pytest.mark.parametrize("ndim", [3, 4])
def test_contiguous_reads_equal_h5py_without_calling_it(
    tmp_path: Path, dtype: str, ndim: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = np.random.default_rng(7)
    data = (rng.random((5, 6, 7, 8)) * 200).astype(dtype)
    stored = data if ndim == 4 else data.reshape(30, 7, 8)
    with h5py.File(tmp_path / "d.h5", "w") as f:
        f.create_dataset("data", data=stored)
        f.create_dataset("empty", shape=stored.shape, dtype=dtype)  # never written
    src = Hdf5Source(tmp_path / "d.h5", dataset_path="/data", scan_shape=(5, 6))
    assert src._contiguous_at is not None
    # every read below must come from pread: h5py opens the dataset once (to check it is
    # still where it was) but reads nothing
    for name in ("__getitem__", "read_direct"):
        monkeypatch.setattr(h5py.Dataset, name, lambda *a, **k: pytest.fail("read through h5py"))
    expected = data.astype(data.dtype.newbyteorder("="))
    for rows, cols in [((0, 5), (0, 6)), ((1, 3), (0, 6)), ((2, 4), (1, 5)), ((4, 5), (5, 6))]:
        got = src.read(rows, cols)
        np.testing.assert_array_equal(got, expected[rows[0] : rows[1], cols[0] : cols[1]])
        assert got.dtype == expected.dtype and got.dtype.isnative
        buf = np.empty((rows[1] - rows[0], cols[1] - cols[0], 7, 8), dtype=expected.dtype)
        into = src.read(rows, cols, buffer=buf)  # authoritative (may be buf, or a view of it)
        np.testing.assert_array_equal(into, expected[rows[0] : rows[1], cols[0] : cols[1]])
    np.testing.assert_array_equal(src.read_frames(7, 19), expected.reshape(30, 7, 8)[7:19])
    copy = pickle.loads(pickle.dumps(src))
    np.testing.assert_array_equal(copy.read((0, 5), (0, 6)), expected)
    monkeypatch.undo()
    with h5py.File(tmp_path / "d.h5", "r") as f:
        assert contiguous_offset(f["empty"]) is None  # unwritten: through HDF5 (fill values)
    empty = Hdf5Source(tmp_path / "d.h5", dataset_path="/empty", scan_shape=(5, 6))
    assert empty._contiguous_at is None
    np.testing.assert_array_equal(empty.read((0, 2), (0, 6)), 0)


def test_chunked_and_filtered_datasets_read_through_hdf5(tmp_path: Path) -> None:
    data = np.arange(4 * 5 * 6 * 7, dtype=np.uint16).reshape(4, 5, 6, 7)
    with h5py.File(tmp_path / "d.h5", "w") as f:
        f.create_dataset("chunked", data=data, chunks=(1, 1, 6, 7))
        f.create_dataset("zipped", data=data, chunks=(1, 1, 6, 7), compression="gzip")
    for name in ("chunked", "zipped"):
        src = Hdf5Source(tmp_path / "d.h5", dataset_path=f"/{name}")
        assert src._contiguous_at is None
        np.testing.assert_array_equal(src.read((1, 3), (2, 5)), data[1:3, 2:5])


def test_two_threads_read_a_contiguous_file_in_parallel_and_right(tmp_path: Path) -> None:
    data = np.random.default_rng(1).integers(0, 4000, size=(16, 32, 32, 32), dtype=np.uint16)
    with h5py.File(tmp_path / "d.h5", "w") as f:
        f.create_dataset("data", data=data)
    ds = qf.open(tmp_path / "d.h5", dataset_path="/data", chunk_rows=2)
    got: dict[int, np.ndarray] = {}

    def read(r: int) -> None:
        for i in range(r, 16, 2):
            got[i] = ds.load_block((i, i + 1))

    threads = [threading.Thread(target=read, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    np.testing.assert_array_equal(np.concatenate([got[i] for i in range(16)]), data)


def test_stored_types_hdf5_converts_are_read_through_hdf5(tmp_path: Path) -> None:
    """A reduced precision or bit offset is HDF5's to convert, not raw bytes to take."""
    tid = h5py.h5t.STD_U16LE.copy()
    tid.set_precision(12)
    tid.set_offset(4)
    with h5py.File(tmp_path / "p.h5", "w") as f:
        space = h5py.h5s.create_simple((1, 2, 2, 2))
        dset = h5py.Dataset(h5py.h5d.create(f.id, b"data", tid, space))
        dset[...] = np.arange(8, dtype=np.uint16).reshape(1, 2, 2, 2)
    src = Hdf5Source(tmp_path / "p.h5", dataset_path="/data")
    assert src._contiguous_at is None
    np.testing.assert_array_equal(src.read((0, 1), (0, 2)).ravel(), np.arange(8))


def test_a_dataset_rewritten_in_place_with_another_type_is_refused(tmp_path: Path) -> None:
    from quantem_flow.errors import FormatError

    data = np.arange(1, 2 * 3 * 4 * 4 + 1, dtype="<u2").reshape(2, 3, 4, 4)
    with h5py.File(tmp_path / "d.h5", "w") as f:
        f.create_dataset("data", data=data)
    src = Hdf5Source(tmp_path / "d.h5", dataset_path="/data")
    with h5py.File(tmp_path / "d.h5", "w") as f:  # same shape and offset, big-endian now
        f.create_dataset("data", data=data.astype(">u2"))
    with pytest.raises(FormatError, match="changed or damaged"):
        src.read((0, 1), (0, 3))
