"""The reader conformance suite: what every reader of a 4D-STEM format must do.

A case is an input written by an *independent* writer (never by the reader
under test) together with the array it must read back as: a rectangular scan
(rows != columns, so a swap of the two shows) of fresh random data.  The
checks open it through :func:`quantem_flow.io.open_source` (detection by
content and the reader's options) and hold the reader to:

- the format it reports, the shape and the native-byte-order dtype;
- exact values, read whole and in blocks (whole rows, interior columns, a
  corner, one column, a single position);
- :meth:`~quantem_flow.io.Source.block_bytes` naming the block's own stored
  bytes wherever it names any (a streamed pass views them in place);
- rows and columns not swapped, and bounds valid only for the transposed
  scan refused with :class:`~quantem_flow.errors.ShapeError`;
- a pickle round trip (a Dask worker gets the source that way), before and
  after :meth:`~quantem_flow.io.Source.close`;
- an identity (format, absolute paths with sizes, a header SHA-256) that is
  the same when the input is opened twice, and JSON-ready metadata.

Running it on a reader
----------------------
In a test module of any package whose reader joins through the
``quantem_flow.readers`` entry point group (docs/readers.md)::

    import numpy as np
    import pytest
    from quantem_flow.testing.readers import (
        DETECTOR, READER_CHECKS, SCAN, ReaderCase, random_values,
    )

    def make_case(tmp_path):
        expected = random_values(np.random.default_rng(), (*SCAN, *DETECTOR), "uint16")
        path = my_independent_writer(tmp_path / "scan.myfmt", expected)
        return ReaderCase(path, {}, expected, "myfmt")

    @pytest.mark.parametrize("check", READER_CHECKS, ids=lambda c: c.__name__)
    def test_myfmt_conforms(check, tmp_path):
        check(make_case(tmp_path))

:func:`check_reader` runs every check on one case.  Importing this module
does not import pytest.
"""

from __future__ import annotations

import json
import pickle
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import DtypeError, ShapeError
from ..io import Source, open_source
from ..io.base import FrameSource

__all__ = [
    "DETECTOR",
    "READER_CHECKS",
    "SCAN",
    "ReaderCase",
    "check_block_bytes",
    "check_block_reads",
    "check_format_and_shape",
    "check_full_read",
    "check_identity_and_metadata",
    "check_orientation",
    "check_pickle_round_trip",
    "check_reader",
    "random_values",
]

#: The scan of the suite's cases: rectangular, so a row/column swap shows.
SCAN = (5, 7)
#: The detector of the suite's cases: rectangular too.
DETECTOR = (6, 9)


@dataclass
class ReaderCase:
    """A written input: what to open, with which options, and what it must read back as.

    Attributes
    ----------
    target
        The path (or object) :func:`~quantem_flow.io.open_source` opens.
    options
        Keyword options for it (``scan_shape``, ``dataset_path``...).
    expected
        The array the writer wrote, ``(R, C, k_r, k_c)`` with ``R != C``, in
        the byte order it was written in.
    format
        The format name the reader must report.
    """

    target: Any
    options: dict[str, Any]
    expected: np.ndarray
    format: str


def random_values(rng: np.random.Generator, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    """Fresh random values: normal for reals, integers in ``[0, min(max, 2**31 - 1)]``."""
    dt = np.dtype(dtype)
    if dt.kind == "f":
        return rng.standard_normal(shape).astype(dt)
    hi = min(np.iinfo(dt).max, 2**31 - 1)
    return rng.integers(0, hi, size=shape, endpoint=True).astype(dt)


def _open(case: ReaderCase) -> Source:
    return open_source(case.target, **case.options)


def check_format_and_shape(case: ReaderCase) -> None:
    """The reported format, shape, native dtype and byte count."""
    src = _open(case)
    assert src.format == case.format, f"format {src.format!r}, expected {case.format!r}"
    assert src.shape == case.expected.shape, f"shape {src.shape}, expected {case.expected.shape}"
    rows, cols = src.shape[:2]
    assert rows != cols, "conformance scans must be rectangular"
    assert src.dtype == case.expected.dtype.newbyteorder("="), (src.dtype, case.expected.dtype)
    assert src.dtype.isnative
    assert src.nbytes == case.expected.size * case.expected.dtype.itemsize


def check_full_read(case: ReaderCase) -> None:
    """The whole scan read at once equals what was written."""
    src = _open(case)
    rows, cols = src.shape[:2]
    full = src.read((0, rows), (0, cols))
    assert full.dtype == src.dtype and full.dtype.isnative
    assert full.shape == case.expected.shape
    np.testing.assert_array_equal(full, case.expected)


def check_block_reads(case: ReaderCase) -> None:
    """Blocks (whole rows, interior columns, a corner, a column, one position) are exact."""
    src = _open(case)
    rows, cols = src.shape[:2]
    e = case.expected
    blocks = [
        ((0, 1), (0, cols)),
        ((1, rows), (1, cols - 1)),
        ((rows - 1, rows), (cols - 2, cols)),
        ((0, rows), (cols - 1, cols)),
        ((rows // 2, rows // 2 + 1), (cols // 2, cols // 2 + 1)),
    ]
    if rows > 2:
        blocks.append(((1, rows - 1), (2, cols - 1)))
    for r, c in blocks:
        got = src.read(r, c)
        assert got.shape == (r[1] - r[0], c[1] - c[0], *e.shape[2:]), (r, c, got.shape)
        np.testing.assert_array_equal(got, e[r[0] : r[1], c[0] : c[1]])


def check_block_bytes(case: ReaderCase) -> None:
    """Where a reader says a block is one run of stored bytes, those bytes are the block.

    A streamed pass may view them in place through a map; a block of several
    rows and part of the columns is never one run.
    """
    src = _open(case)
    rows, cols = src.shape[:2]
    e = case.expected
    blocks = [
        ((0, rows), (0, cols)),
        ((1, rows), (0, cols)),
        ((rows - 1, rows), (1, cols - 1)),
        ((0, 1), (0, 1)),
    ]
    found = 0
    for r, c in blocks:
        where = src.block_bytes(r, c)
        if where is None:
            continue
        path, offset = where
        want = e[r[0] : r[1], c[0] : c[1]]
        with open(path, "rb") as f:
            f.seek(offset)
            raw = f.read(want.size * src.dtype.itemsize)
        got = np.frombuffer(raw, dtype=src.dtype).reshape(want.shape)
        np.testing.assert_array_equal(got, want)
        found += 1
    assert src.block_bytes((0, rows), (1, cols)) is None  # several rows, part of the columns
    if case.format == "npy" and case.expected.dtype.isnative:
        assert found == len(blocks)  # C-ordered native .npy: every such block is one run
    if case.format == "hdf5" and getattr(src, "_contiguous_at", None) is not None:
        assert found == len(blocks)  # a contiguous, unfiltered dataset is one run too


def check_orientation(case: ReaderCase) -> None:
    """Rows and columns are not swapped; bounds only valid for the transpose are refused."""
    src = _open(case)
    rows, cols = src.shape[:2]
    e = case.expected
    got = src.read((1, 2), (0, 1))[0, 0]  # frame (1, 0) is the written (1, 0), not (0, 1)
    np.testing.assert_array_equal(got, e[1, 0])
    assert not np.array_equal(got, e[0, 1])
    block = src.read((0, 2), (0, 2))
    assert not np.array_equal(block, e[:2, :2].swapaxes(0, 1))
    try:
        src.read((0, cols), (0, rows))
    except ShapeError:
        pass
    else:
        raise AssertionError(f"bounds of the transposed scan ({cols} rows) were not refused")


def check_pickle_round_trip(case: ReaderCase) -> None:
    """A pickled source reads the same, before and after the original is closed."""
    src = _open(case)
    rows, cols = src.shape[:2]
    src.read((0, 1), (0, cols))  # open handles before pickling
    clone = pickle.loads(pickle.dumps(src))
    assert clone.shape == src.shape and clone.dtype == src.dtype
    np.testing.assert_array_equal(clone.read((0, rows), (0, cols)), case.expected)
    src.close()
    np.testing.assert_array_equal(src.read((rows - 1, rows), (0, cols)), case.expected[rows - 1 :])


def check_identity_and_metadata(case: ReaderCase) -> None:
    """The identity (format, paths and sizes, header SHA-256) is stable; metadata is JSON."""
    src = _open(case)
    ident = src.identity
    assert ident.format == case.format
    assert re.fullmatch(r"[0-9a-f]{64}", ident.header_sha256)
    assert len(ident.paths) == len(ident.file_sizes)
    if case.format != "memory":
        assert ident.paths
        for p, size in zip(ident.paths, ident.file_sizes, strict=True):
            assert Path(p).is_absolute() and Path(p).exists(), p
            assert size > 0
    json.dumps(ident.to_dict())
    json.dumps(src.metadata)
    assert all(isinstance(n, str) for n in src.notes)
    assert _open(case).identity == ident  # the same input opened twice


def check_frames_into_out(case: ReaderCase) -> None:
    """``read_frames(out=)`` fills an array of the frames' shape and dtype, refuses others.

    Readers whose sources read frame by frame (:class:`~quantem_flow.io.base.FrameSource`)
    fill a C-contiguous ``out`` in place or copy into a strided one (or a wider
    dtype); an ``out`` of another shape, or of a dtype that would lose values, is
    refused, never broadcast or narrowed into
    (:func:`~quantem_flow.io.base.check_frames_out`).
    """
    src = _open(case)
    if not isinstance(src, FrameSource):
        return
    rows, cols = src.shape[:2]
    kr, kc = src.shape[2:]
    first = src.scan_metadata().get("frame_offset", 0)
    want = case.expected.reshape(rows * cols, kr, kc)[1:3]
    out = np.zeros((2, kr, kc), dtype=src.dtype)
    got = src.read_frames(first + 1, first + 3, out=out)
    assert got is out, "read_frames(out=) returned another array than out"
    np.testing.assert_array_equal(out, want)
    strided = np.zeros((2, kr, 2 * kc), dtype=src.dtype)[:, :, ::2]
    np.testing.assert_array_equal(src.read_frames(first + 1, first + 3, out=strided), want)
    np.testing.assert_array_equal(strided, want)
    if np.can_cast(src.dtype, np.float64, casting="safe"):
        wide = np.zeros((2, kr, kc), dtype=np.float64)  # a wider buffer is the caller's choice
        src.read_frames(first + 1, first + 3, out=wide)
        np.testing.assert_array_equal(wide, want)
    bad_outs: list[tuple[np.ndarray, type[Exception]]] = [
        (np.zeros((3, kr, kc), dtype=src.dtype), ShapeError),
        (np.zeros((1, kr, kc), dtype=src.dtype), ShapeError),
    ]
    narrow = [t for t in (np.bool_, np.int8, np.uint8) if not np.can_cast(src.dtype, t, "safe")]
    if narrow:
        bad_outs.append((np.zeros((2, kr, kc), dtype=narrow[0]), DtypeError))
    for bad, error in bad_outs:
        try:
            src.read_frames(first + 1, first + 3, out=bad)
        except error:
            pass
        else:
            raise AssertionError(
                f"read_frames(out=) of shape {bad.shape}, dtype {bad.dtype} was not refused "
                f"with {error.__name__}"
            )


#: Every check, in the order :func:`check_reader` runs them.
READER_CHECKS: tuple[Callable[[ReaderCase], None], ...] = (
    check_format_and_shape,
    check_full_read,
    check_block_reads,
    check_block_bytes,
    check_orientation,
    check_pickle_round_trip,
    check_identity_and_metadata,
    check_frames_into_out,
)


def check_reader(case: ReaderCase) -> None:
    """Run every check of the suite on one case (an ``AssertionError`` names what failed)."""
    for check in READER_CHECKS:
        check(case)
