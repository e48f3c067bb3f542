"""One suite every reader passes: shapes, dtypes, exact reads, orientation, pickling.

Each case writes a rectangular scan (rows != cols) of fresh random data in
its format with the writers in :mod:`tests.io.writers`, opens it through
:func:`quantem_flow.io.open_source`, and compares what the reader returns
with the array that was written.

Cases of further formats live in modules ``tests/io/conformance_cases_<fmt>.py``,
each exporting ``CASES: dict[str, Callable[[Path, np.random.Generator], Case]]``
(importing :class:`Case` and :func:`_random` from this module); they are
collected here, and every registered built-in reader must have at least one
case (:func:`test_every_registered_reader_has_a_case`).
"""

from __future__ import annotations

import importlib
import json
import pickle
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from quantem_flow.errors import ShapeError
from quantem_flow.io import Source, open_source

from . import writers

SCAN = (5, 7)
DETECTOR = (6, 9)


@dataclass
class Case:
    """A written input: what to open, how, and what it must read back as."""

    target: Any
    options: dict[str, Any]
    expected: np.ndarray
    format: str


def _random(rng: np.random.Generator, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    dt = np.dtype(dtype)
    if dt.kind == "f":
        return rng.standard_normal(shape).astype(dt)
    hi = min(np.iinfo(dt).max, 2**31 - 1)
    return rng.integers(0, hi, size=shape, endpoint=True).astype(dt)


def _memory(tmp: Path, rng: np.random.Generator) -> Case:
    a = _random(rng, (*SCAN, *DETECTOR), "float32")
    return Case(a, {}, a, "memory")


def _npy_4d(tmp: Path, rng: np.random.Generator) -> Case:
    a = _random(rng, (*SCAN, *DETECTOR), "uint16")
    return Case(writers.write_npy(tmp / "data.npy", a), {}, a, "npy")


def _npy_3d(tmp: Path, rng: np.random.Generator) -> Case:
    a = _random(rng, (*SCAN, *DETECTOR), ">i4")
    p = writers.write_npy(tmp / "frames.npy", a.reshape(-1, *DETECTOR))
    return Case(p, {"scan_shape": SCAN}, a, "npy")


def _raw(tmp: Path, rng: np.random.Generator) -> Case:
    a = _random(rng, (*SCAN, *DETECTOR), ">u2")
    p = writers.write_raw(
        tmp / "data.bin",
        a.reshape(-1, *DETECTOR),
        dtype=">u2",
        offset=16,
        header_bytes=8,
        footer_bytes=4,
    )
    opts = {
        "format": "raw",
        "dtype": ">u2",
        "frame_shape": DETECTOR,
        "scan_shape": SCAN,
        "offset": 16,
        "frame_header_bytes": 8,
        "frame_footer_bytes": 4,
    }
    return Case(p, opts, a, "raw")


def _hdf5_3d(tmp: Path, rng: np.random.Generator) -> Case:
    a = _random(rng, (*SCAN, *DETECTOR), "uint32")
    p = writers.write_hdf5(tmp / "frames.h5", a.reshape(-1, *DETECTOR), dataset_path="/scan/frames")
    return Case(p, {"dataset_path": "/scan/frames", "scan_shape": SCAN}, a, "hdf5")


def _hdf5_4d(tmp: Path, rng: np.random.Generator) -> Case:
    a = _random(rng, (*SCAN, *DETECTOR), "uint16")
    p = writers.write_hdf5(tmp / "cube.h5", a, dataset_path="/entry/cube", bitshuffle=True)
    return Case(p, {"dataset_path": "/entry/cube"}, a, "hdf5")


def _dectris_single(tmp: Path, rng: np.random.Generator) -> Case:
    a = _random(rng, (*SCAN, *DETECTOR), "uint16")
    p = writers.write_dectris(tmp, "scan", a.reshape(-1, *DETECTOR), frames_per_file=1000)
    return Case(p, {"scan_shape": SCAN}, a, "dectris")


def _dectris_multi(tmp: Path, rng: np.random.Generator) -> Case:
    # 35 frames in files of 8: file boundaries fall inside scan rows.
    a = _random(rng, (*SCAN, *DETECTOR), "uint32")
    p = writers.write_dectris(
        tmp, "multi", a.reshape(-1, *DETECTOR), frames_per_file=8, bit_depth=32
    )
    return Case(p, {"scan_shape": SCAN}, a, "dectris")


def _dectris_8bit(tmp: Path, rng: np.random.Generator) -> Case:
    a = _random(rng, (*SCAN, *DETECTOR), "uint8")
    p = writers.write_dectris(
        tmp, "eight", a.reshape(-1, *DETECTOR), frames_per_file=10, bit_depth=8
    )
    return Case(p, {"scan_shape": SCAN}, a, "dectris")


def _zarr_3d(tmp: Path, rng: np.random.Generator) -> Case:
    a = _random(rng, (*SCAN, *DETECTOR), "uint16")
    p = writers.write_zarr(
        tmp / "frames.zarr",
        a.reshape(-1, *DETECTOR),
        array_path="scan/frames",
        chunks=(4, *DETECTOR),
        compressor="zstd",
    )
    return Case(p, {"array_path": "scan/frames", "scan_shape": SCAN}, a, "zarr")


def _zarr_4d(tmp: Path, rng: np.random.Generator) -> Case:
    a = _random(rng, (*SCAN, *DETECTOR), "float32")
    p = writers.write_zarr(tmp / "cube.zarr", a, chunks=(2, 3, *DETECTOR), compressor="blosc")
    return Case(p, {}, a, "zarr")


def _empad(tmp: Path, rng: np.random.Generator) -> Case:
    a = _random(rng, (3, 4, 128, 128), "float32")
    return Case(writers.write_empad(tmp, "acq", a), {}, a, "empad")


def _mib(depth: str, quad: bool) -> Callable[[Path, np.random.Generator], Case]:
    def make(tmp: Path, rng: np.random.Generator) -> Case:
        k = 512 if quad else 256
        scan = (2, 3)
        native = {"U08": "uint8", "U16": "uint16", "U32": "uint32"}[depth]
        a = _random(rng, (*scan, k, k), native)
        p = writers.write_mib(tmp / "scan.mib", a.reshape(-1, k, k), depth=depth, quad=quad)
        return Case(p, {"scan_shape": scan}, a, "mib")

    return make


CASES: dict[str, Callable[[Path, np.random.Generator], Case]] = {
    "memory": _memory,
    "npy-4d": _npy_4d,
    "npy-3d-bigendian": _npy_3d,
    "raw-bigendian": _raw,
    "hdf5-3d": _hdf5_3d,
    "hdf5-4d-bslz4": _hdf5_4d,
    "dectris-single": _dectris_single,
    "dectris-multi": _dectris_multi,
    "dectris-8bit": _dectris_8bit,
    "zarr-3d-zstd": _zarr_3d,
    "zarr-4d-blosc": _zarr_4d,
    "empad": _empad,
    "mib-U08": _mib("U08", False),
    "mib-U16": _mib("U16", False),
    "mib-U32": _mib("U32", False),
    "mib-U16-quad": _mib("U16", True),
    "mib-U32-quad": _mib("U32", True),
}


def _collect_case_modules() -> dict[str, Callable[[Path, np.random.Generator], Case]]:
    """The ``CASES`` of every ``conformance_cases_*.py`` module next to this one."""
    found: dict[str, Callable[[Path, np.random.Generator], Case]] = {}
    package = __package__ or "tests.io"
    for path in sorted(Path(__file__).parent.glob("conformance_cases_*.py")):
        module = importlib.import_module(f"{package}.{path.stem}")
        cases = getattr(module, "CASES", None)
        if not isinstance(cases, dict) or not all(callable(f) for f in cases.values()):
            raise TypeError(f"{path.name} must export CASES: dict[str, Callable -> Case]")
        for key, make in cases.items():
            if key in CASES or key in found:
                raise ValueError(f"conformance case {key!r} of {path.name} is already defined")
            found[key] = make
    return found


CASES.update(_collect_case_modules())


@pytest.fixture(params=sorted(CASES))
def case(request: pytest.FixtureRequest, tmp_path: Path) -> Case:
    rng = np.random.default_rng()  # fresh data every run
    return CASES[request.param](tmp_path, rng)


def _open(case: Case) -> Source:
    return open_source(case.target, **case.options)


def test_format_and_shape(case: Case) -> None:
    src = _open(case)
    assert src.format == case.format
    assert src.shape == case.expected.shape
    R, C = src.shape[:2]
    assert R != C, "conformance scans must be rectangular"
    assert src.dtype == case.expected.dtype.newbyteorder("=")
    assert src.dtype.isnative
    assert src.nbytes == case.expected.size * case.expected.dtype.itemsize


def test_full_read_is_exact(case: Case) -> None:
    src = _open(case)
    R, C = src.shape[:2]
    full = src.read((0, R), (0, C))
    assert full.dtype == src.dtype
    assert full.dtype.isnative
    assert full.shape == case.expected.shape
    np.testing.assert_array_equal(full, case.expected)


def test_block_reads_are_exact(case: Case) -> None:
    src = _open(case)
    R, C = src.shape[:2]
    e = case.expected
    blocks = [
        ((0, 1), (0, C)),  # one whole row
        ((1, R), (1, C - 1)),  # interior columns, all later rows
        ((R - 1, R), (C - 2, C)),  # bottom-right corner
        ((0, R), (C - 1, C)),  # one column
        ((R // 2, R // 2 + 1), (C // 2, C // 2 + 1)),  # a single position
    ]
    if R > 2:
        blocks.append(((1, R - 1), (2, C - 1)))
    for rows, cols in blocks:
        got = src.read(rows, cols)
        assert got.shape == (rows[1] - rows[0], cols[1] - cols[0], *e.shape[2:])
        np.testing.assert_array_equal(got, e[rows[0] : rows[1], cols[0] : cols[1]])


def test_block_bytes_name_the_blocks_own_bytes(case: Case) -> None:
    """Where a reader says a block is one run of stored bytes, those bytes are the block.

    A streamed pass may view them in place through a map (quantem_flow.io.mapped);
    a block of several rows and part of the columns is never one run.
    """
    src = _open(case)
    R, C = src.shape[:2]
    e = case.expected
    blocks = [((0, R), (0, C)), ((1, R), (0, C)), ((R - 1, R), (1, C - 1)), ((0, 1), (0, 1))]
    found = 0
    for rows, cols in blocks:
        where = src.block_bytes(rows, cols)
        if where is None:
            continue
        path, offset = where
        want = e[rows[0] : rows[1], cols[0] : cols[1]]
        with open(path, "rb") as f:
            f.seek(offset)
            raw = f.read(want.size * src.dtype.itemsize)
        got = np.frombuffer(raw, dtype=src.dtype).reshape(want.shape)
        np.testing.assert_array_equal(got, want)
        found += 1
    assert src.block_bytes((0, R), (1, C)) is None  # several rows, part of the columns
    if case.format == "npy" and case.expected.dtype.isnative:
        assert found == len(blocks)  # C-ordered native .npy: every such block is one run
    if case.format == "hdf5" and getattr(src, "_contiguous_at", None) is not None:
        assert found == len(blocks)  # a contiguous, unfiltered dataset is one run too


def test_rows_and_cols_are_not_swapped(case: Case) -> None:
    src = _open(case)
    R, C = src.shape[:2]
    e = case.expected
    # Frame (1, 0) must be the written frame (1, 0), not (0, 1).
    got = src.read((1, 2), (0, 1))[0, 0]
    np.testing.assert_array_equal(got, e[1, 0])
    assert not np.array_equal(got, e[0, 1])
    # A block read with swapped bounds differs from the transposed expectation.
    block = src.read((0, 2), (0, 2))
    assert not np.array_equal(block, e[:2, :2].swapaxes(0, 1))
    # Bounds only valid for the transposed scan are refused.
    with pytest.raises(ShapeError):
        src.read((0, C), (0, R))


def test_pickle_round_trip_reads(case: Case) -> None:
    src = _open(case)
    R, C = src.shape[:2]
    src.read((0, 1), (0, C))  # open handles before pickling
    clone = pickle.loads(pickle.dumps(src))
    assert clone.shape == src.shape
    assert clone.dtype == src.dtype
    np.testing.assert_array_equal(clone.read((0, R), (0, C)), case.expected)
    src.close()
    np.testing.assert_array_equal(src.read((R - 1, R), (0, C)), case.expected[R - 1 :])


def test_identity_and_metadata(case: Case) -> None:
    src = _open(case)
    ident = src.identity
    assert ident.format == case.format
    assert re.fullmatch(r"[0-9a-f]{64}", ident.header_sha256)
    assert len(ident.paths) == len(ident.file_sizes)
    if case.format != "memory":
        assert ident.paths
        for p, size in zip(ident.paths, ident.file_sizes, strict=True):
            assert Path(p).is_absolute() and Path(p).exists()
            assert size > 0
    json.dumps(ident.to_dict())
    json.dumps(src.metadata)
    assert all(isinstance(n, str) for n in src.notes)
    # Opening the same input twice gives the same identity.
    assert _open(case).identity == ident


def test_every_registered_reader_has_a_case(tmp_path: Path) -> None:
    from quantem_flow.io.registry import readers

    rng = np.random.default_rng()
    covered: dict[str, list[str]] = {}
    for key, make in CASES.items():
        where = tmp_path / key
        where.mkdir()
        covered.setdefault(make(where, rng).format, []).append(key)
    builtin = {name for name, entry in readers().items() if entry.origin == "built-in"}
    missing = sorted(builtin - set(covered))
    assert not missing, (
        f"registered readers without a conformance case: {missing}; add their cases in a "
        "tests/io/conformance_cases_<fmt>.py module exporting CASES"
    )
