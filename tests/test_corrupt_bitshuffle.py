"""A flipped bit in a bitshuffle+LZ4 chunk header is an error, never a crash (issue 11, item 2).

The HDF5 bitshuffle filter trusts the uncompressed size in a chunk's header
and writes past its buffer when it is wrong (SIGSEGV in plain h5py too; see
docs/upstream-bitshuffle-crash.md).  Every dense read of a bitshuffle
dataset checks the chunks it touches first.  Each read runs in a child
process so that a crash fails the test instead of killing pytest.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from tests.io.writers import write_dectris, write_hdf5

CHILD = textwrap.dedent(
    """
    import json, sys
    import quantem_flow as qf
    from quantem_flow.errors import CorruptChunkError
    args = json.loads(sys.argv[1])
    try:
        ds = qf.open(args["path"], **args["options"])
        ds.load_block((0, ds.scan_shape[0]))
    except CorruptChunkError as exc:
        print("CORRUPT:" + str(exc))
        sys.exit(0)
    print("NO ERROR")
    """
)


def _flip(path: Path, dataset: str, chunk: tuple[int, ...], byte: int, bit: int = 6) -> int:
    import h5py

    with h5py.File(path, "r") as f:
        where = int(f[dataset].id.get_chunk_info_by_coord(chunk).byte_offset)
    with open(path, "r+b") as fh:
        fh.seek(where + byte)
        value = fh.read(1)[0]
        fh.seek(where + byte)
        fh.write(bytes([value ^ (1 << bit)]))
    return where


def _read_in_child(path: Path, **options: object) -> str:
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps({"path": str(path), "options": options})],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, (
        f"the read crashed (exit status {proc.returncode}); stderr: {proc.stderr[-2000:]}"
    )
    return proc.stdout


@pytest.mark.parametrize(("byte", "bit"), [(4, 6), (5, 0), (10, 5), (12, 6)])
def test_hdf5_bitshuffle_chunk_with_a_flipped_header_bit(
    tmp_path: Path, byte: int, bit: int
) -> None:
    # bytes 0-7: uncompressed size; 8-11: block size (0x2000); 12-15: first LZ4 block length
    rng = np.random.default_rng(3)
    frames = rng.poisson(3, size=(24, 64, 64)).astype(np.uint16)
    path = write_hdf5(tmp_path / "d.h5", frames)
    where = _flip(path, "/data", (7, 0, 0), byte, bit)
    out = _read_in_child(path, dataset_path="/data", scan_shape=(4, 6))
    assert out.startswith("CORRUPT:"), out
    assert str(path) in out and "'/data'" in out
    assert "stored chunk (7, 0, 0)" in out
    assert f"byte offset {where}" in out


def test_4d_hdf5_and_dectris_chunks_are_checked_too(tmp_path: Path) -> None:
    rng = np.random.default_rng(4)
    frames = rng.poisson(3, size=(24, 32, 32)).astype(np.uint16)
    path = write_hdf5(tmp_path / "d4.h5", frames.reshape(4, 6, 32, 32))
    _flip(path, "/data", (2, 3, 0, 0), 5)
    out = _read_in_child(path, dataset_path="/data")
    assert out.startswith("CORRUPT:") and "stored chunk (2, 3, 0, 0)" in out, out

    master = write_dectris(tmp_path, "acq", frames, frames_per_file=10)
    data_file = tmp_path / "acq_data_000002.h5"
    assert data_file.exists()
    _flip(data_file, "/entry/data/data", (3, 0, 0), 4)
    out = _read_in_child(master, scan_shape=(4, 6))
    assert out.startswith("CORRUPT:"), out
    assert str(data_file) in out and "stored chunk (3, 0, 0)" in out


def test_sound_bitshuffle_files_read_unchanged(tmp_path: Path) -> None:
    import quantem_flow as qf

    frames = np.random.default_rng(5).poisson(3, size=(24, 64, 64)).astype(np.uint16)
    path = write_hdf5(tmp_path / "d.h5", frames)
    ds = qf.open(path, dataset_path="/data", scan_shape=(4, 6))
    np.testing.assert_array_equal(ds.load_block((0, 4)), frames.reshape(4, 6, 64, 64))
    np.testing.assert_array_equal(
        ds.load_block((1, 3), (2, 5)), frames.reshape(4, 6, 64, 64)[1:3, 2:5]
    )
