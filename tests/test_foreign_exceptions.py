"""No foreign exception escapes a reader (issue 11, item 10).

The named cases from the reliability probe, then a bounded, seeded fuzz run
over every reader in a child process (a crash or a hang fails the test).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import quantem_flow as qf
from quantem_flow.errors import (
    FormatError,
    QuantemFlowError,
    ShapeError,
    SourceNotFoundError,
)
from tests.io.writers import write_dectris

ROOT = Path(__file__).resolve().parents[1]


def test_mutated_npy_headers_raise_format_error(tmp_path: Path) -> None:
    path = tmp_path / "d.npy"
    np.save(path, np.zeros((2, 3, 4, 4), dtype=np.uint16))
    raw = path.read_bytes()
    header_end = raw.index(b"}")
    cases = {
        "token": raw[:header_end] + b"(" + raw[header_end + 1 :],  # tokenize.TokenError
        "overflow": raw.replace(b"(2, 3, 4, 4)", b"(9999999999999999999999, 3, 4, 4)"[:12]),
        "huge": raw.replace(b"'shape': (2, 3", b"'shape': (9**99"),
    }
    for name, content in cases.items():
        bad = tmp_path / f"{name}.npy"
        bad.write_bytes(content)
        with pytest.raises(QuantemFlowError) as info:
            qf.open(bad).load_block((0, 1))
        assert str(bad) in str(info.value), name


def test_raw_frame_shape_with_a_zero_axis_is_a_shape_error(tmp_path: Path) -> None:
    path = tmp_path / "d.raw"
    path.write_bytes(b"\x00" * 64)
    with pytest.raises(ShapeError, match="frame_shape must be two positive sizes"):
        qf.open(path, format="raw", dtype="<u2", frame_shape=(0, 16), scan_shape=(1, 1))


def test_a_dectris_data_file_removed_after_open(tmp_path: Path) -> None:
    frames = np.random.default_rng(0).poisson(2, size=(6, 16, 16)).astype(np.uint16)
    master = write_dectris(tmp_path, "acq", frames, frames_per_file=4)
    ds = qf.open(master, scan_shape=(2, 3))
    (tmp_path / "acq_data_000002.h5").unlink()
    with pytest.raises(SourceNotFoundError, match=r"acq_data_000002\.h5"):
        qf.compute(qf.virtual_bf(ds), client="synchronous")


def test_corrupt_hdf5_metadata_is_a_format_error(tmp_path: Path) -> None:
    import h5py

    path = tmp_path / "d.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("data", data=np.zeros((6, 8, 8), dtype=np.uint16))
    raw = bytearray(path.read_bytes())
    pos = raw.index(b"TREE")  # the root group's B-tree signature
    raw[pos : pos + 4] = b"XXXX"
    path.write_bytes(bytes(raw))
    with pytest.raises(FormatError, match=r"d\.h5"):
        qf.open(path, scan_shape=(2, 3))


def test_load_results_with_an_unknown_codec_is_a_format_error(tmp_path: Path) -> None:
    import json

    (bf,) = qf.compute(
        qf.virtual_bf(qf.open(np.ones((2, 3, 8, 8), dtype=np.uint16)), radius=2, center=(4, 4)),
        client="synchronous",
    )
    store = qf.save_results({"bf": bf}, tmp_path / "r.zarr")
    meta_path = store / "bf" / "data" / "zarr.json"
    meta = json.loads(meta_path.read_text())
    meta["codecs"].append({"name": "no-such-codec", "configuration": {}})
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(FormatError, match=r"r\.zarr"):
        qf.load_results(store)


@pytest.mark.slow
def test_bounded_fuzz_over_every_reader_raises_only_project_errors() -> None:
    # 21 inputs (issue 15 added 9): about 1 s each, the first read of each (warm-up) included
    proc = subprocess.run(
        [sys.executable, "-m", "tests.fuzz_readers", "20261203", "24"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    report = proc.stdout[-4000:] + proc.stderr[-2000:]
    assert proc.returncode == 0, f"the fuzzer found foreign exceptions or crashed:\n{report}"
    assert "DONE" in proc.stdout and ", 0 foreign exceptions" in proc.stdout, report


def test_a_huge_ssb_pad_to_is_refused_before_allocating() -> None:
    from quantem_flow.errors import ParameterError
    from quantem_flow.operators.ssb import ssb

    cal = qf.Calibration(
        scan_sampling=0.5, scan_units="Å", detector_sampling=1.0, detector_units="mrad"
    )
    ds = qf.open(np.ones((4, 5, 16, 16), dtype=np.uint16), calibration=cal)
    with pytest.raises(ParameterError, match=r"pad_to=\[1000000, 1000000\] needs about"):
        ssb(ds, voltage_kV=300, semiangle_mrad=20, pad_to=(1_000_000, 1_000_000))


def test_a_dataset_name_that_is_not_utf8_is_a_dataset_path_error(tmp_path: Path) -> None:
    # h5py hands such a name to visititems as bytes (a flipped byte in a link name)
    import h5py

    from quantem_flow.errors import DatasetPathError

    path = tmp_path / "n.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset(b"d\xff", data=np.zeros((6, 8, 8), dtype=np.uint16))
    with pytest.raises(DatasetPathError, match=r"not UTF-8") as info:
        qf.open(path, scan_shape=(2, 3))
    assert str(path) in str(info.value) and repr(r"/d\xff") in str(info.value)


def _replace_dataset(path: Path, old: str, new: str) -> None:
    import h5py

    with h5py.File(path, "a") as f:
        f.move(old, new)


@pytest.mark.parametrize("fmt", ["hdf5", "emd"])
def test_a_dataset_gone_at_read_time_is_a_format_error(fmt: str, tmp_path: Path) -> None:
    # Hdf5Source._dset reopens the dataset at read time; h5py raised a bare KeyError
    from tests.io.writers import write_hdf5
    from tests.io.writers_emd import write_emd

    cube = np.arange(2 * 3 * 4 * 4, dtype=np.uint16).reshape(2, 3, 4, 4)
    if fmt == "hdf5":
        path = write_hdf5(tmp_path / "d.h5", cube, bitshuffle=False)
        inner = "/data"
    else:
        path = write_emd(tmp_path / "d.emd", cube)
        inner = "/experiment/datacube/data"
    ds = qf.open(path, format=fmt)
    _replace_dataset(path, inner, inner + "_moved")
    with pytest.raises(FormatError) as info:
        ds.load_block((0, 1))
    message = str(info.value)
    assert str(path) in message and repr(inner) in message and "changed or damaged" in message
    ds.source.close()  # nothing left open: closing again is harmless


def test_a_chunk_index_entry_outside_the_chunk_grid_is_a_corrupt_chunk_error(
    tmp_path: Path,
) -> None:
    # found by tests/fuzz_readers.py: the chunk index walk (io/bslz4_read.py) raised IndexError
    from quantem_flow.errors import CorruptChunkError
    from tests.io.writers import write_hdf5

    path = write_hdf5(tmp_path / "d.h5", np.ones((2, 3, 16, 16), dtype=np.uint16))
    raw = bytearray(path.read_bytes())
    node = raw.index(b"TREE\x01\x00")  # the v1 B-tree of raw data chunks, a leaf
    # 24 header bytes; then per entry a key (size 4, filter mask 4, 5 offsets of 8) and a child
    key = node + 24 + 2 * (48 + 8)
    raw[key + 8 + 4] ^= 0x04  # the third chunk's row offset + 2**34: outside the grid
    path.write_bytes(bytes(raw))
    ds = qf.open(path, dataset_path="/data")
    with pytest.raises(CorruptChunkError, match=r"chunk index") as info:
        ds.load_block((0, 2))
    assert str(path) in str(info.value)
