"""LiberTEM's sparse ``raw_csr`` layout: detection, the paired representation, damage.

Every input is written by :mod:`tests.io.writers_raw_csr` from the documented
descriptor; every result is compared with the same pass over a dense copy.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import quantem_flow as qf
from quantem_flow.errors import (
    CorruptChunkError,
    DtypeError,
    FormatError,
    ScanShapeError,
    SourceNotFoundError,
)
from quantem_flow.io import detect_format
from quantem_flow.io.raw_csr import RawCsrSource
from quantem_flow.io.registry import detect

from .writers_raw_csr import write_raw_csr

SCAN = (6, 8)
DET = (12, 10)
CENTER = (5.6, 4.3)


def _counts(rng: np.random.Generator, dtype: str = "uint16") -> np.ndarray:
    values = rng.poisson(2.0, size=(*SCAN, *DET)).astype(dtype)
    values[rng.random(values.shape) < 0.7] = 0
    return values


def _ops(ds: qf.Dataset4D) -> list[Any]:
    return [
        qf.virtual_bf(ds, radius=3.0, center=CENTER),
        qf.virtual_adf(ds, inner=4.0, outer=math.inf, center=CENTER),
        qf.center_of_mass(ds, center=CENTER),
    ]


def test_opens_as_pairs_and_equals_a_dense_copy(tmp_path: Path, rng: np.random.Generator) -> None:
    data = _counts(rng)
    toml = write_raw_csr(tmp_path, data.reshape(-1, *DET), nav_shape=SCAN, messy=True, rng=rng)
    ds = qf.open(toml, chunk_rows=2)
    assert ds.source.format == "raw_csr" and ds.representation == "paired"
    assert ds.shape == (*SCAN, *DET) and ds.dtype == np.uint16
    assert ds.source.metadata["scan_shape_from"].startswith("the descriptor's nav_shape")
    got = qf.compute(*_ops(ds), client="synchronous", progress=False)
    want = qf.compute(*_ops(qf.open(data)), client="synchronous", progress=False)
    for a, b in zip(got[:2], want[:2], strict=True):  # integer sums: exact
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # the centre of mass: the paired kernels sum moments in their own order (float64)
    np.testing.assert_allclose(np.asarray(got[2]), np.asarray(want[2]), rtol=1e-12, atol=1e-12)
    record = got[0].provenance.to_dict()["execution"]["chunks"][0]
    assert record["made"] == "native raw_csr read"


def test_real_values_open_dense(tmp_path: Path, rng: np.random.Generator) -> None:
    data = rng.normal(size=(*SCAN, *DET)).astype(np.float32)
    data[rng.random(data.shape) < 0.5] = 0
    toml = write_raw_csr(tmp_path, data.reshape(-1, *DET), nav_shape=SCAN)
    ds = qf.open(toml)
    assert ds.representation == "dense"
    np.testing.assert_array_equal(ds.source.read((0, SCAN[0]), (0, SCAN[1])), data)


def test_detected_by_content_under_any_name(tmp_path: Path, rng: np.random.Generator) -> None:
    toml = write_raw_csr(tmp_path, _counts(rng).reshape(-1, *DET), nav_shape=SCAN)
    renamed = toml.rename(tmp_path / "descriptor.txt")
    assert detect_format(renamed) == "raw_csr"
    other = tmp_path / "settings.toml"
    other.write_text('[params]\nfiletype = "something_else"\n')
    found = detect(other)  # not recognised by content: the suffix names the reader...
    assert found.format == "raw_csr" and found.how.startswith("suffix")
    with pytest.raises(FormatError, match="no \\[params\\] with filetype"):
        qf.open(other)  # ...whose error says what is wrong with the file


def test_a_block_reads_only_its_own_entries(
    tmp_path: Path, rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Out of core: a scan row reads the slice of the files its frames own, no more."""
    data = _counts(rng)
    source = RawCsrSource(write_raw_csr(tmp_path, data.reshape(-1, *DET), nav_shape=SCAN))
    ranges: list[tuple[str, int, int]] = []
    real = source._read

    def spy(name: str, start: int, stop: int) -> np.ndarray:
        ranges.append((name, start, stop))
        return real(name, start, stop)

    monkeypatch.setattr(source, "_read", spy)
    payload = source.read_payload("paired", (2, 3), (0, SCAN[1]))
    ptr = np.concatenate([[0], np.cumsum((data.reshape(-1, DET[0] * DET[1]) > 0).sum(axis=1))])
    first, last = 2 * SCAN[1], 3 * SCAN[1]
    assert set(ranges) == {(n, int(ptr[first]), int(ptr[last])) for n in ("indices", "data")}
    assert payload.scan_shape == (1, SCAN[1])


def test_scan_shape_and_frame_offset(tmp_path: Path, rng: np.random.Generator) -> None:
    data = _counts(rng)
    frames = np.concatenate([np.full((2, *DET), 9, np.uint16), data.reshape(-1, *DET)])
    toml = write_raw_csr(tmp_path, frames, nav_shape=SCAN)
    ds = qf.open(toml, frame_offset=2, scan_shape=SCAN)
    np.testing.assert_array_equal(ds.source.read((0, SCAN[0]), (0, SCAN[1])), data)


def _write(tmp_path: Path, rng: np.random.Generator) -> Path:
    return write_raw_csr(tmp_path, _counts(rng).reshape(-1, *DET), nav_shape=SCAN)


def test_damaged_descriptors(tmp_path: Path, rng: np.random.Generator) -> None:
    toml = _write(tmp_path, rng)
    text = toml.read_text()
    cases = {
        "not TOML": ("[params\nfiletype = raw_csr", FormatError, "not a TOML file"),
        "no files": (text.split("[raw_csr]")[0], FormatError, r"no \[raw_csr\] section"),
        "missing file": (
            text.replace("scan_values.raw", "gone.raw"),
            SourceNotFoundError,
            "named by data_file",
        ),
        "bad dtype": (text.replace('data_dtype = "<u2"', 'data_dtype = "<c8"'), DtypeError, "c8"),
        "bad shape": (
            text.replace("nav_shape = [6, 8]", "nav_shape = [6, 0]"),
            FormatError,
            "nav_shape must be a list of positive integers",
        ),
    }
    for body, error, words in cases.values():
        toml.write_text(body)
        with pytest.raises(error, match=words):
            RawCsrSource(toml)
        toml.write_text(text)
    assert RawCsrSource(toml).shape == (*SCAN, *DET)


def test_damaged_files(tmp_path: Path, rng: np.random.Generator) -> None:
    toml = _write(tmp_path, rng)
    values = tmp_path / "scan_values.raw"
    indptr = tmp_path / "scan_indptr.raw"
    raw = values.read_bytes()
    values.write_bytes(raw[:-1])  # not a whole number of uint16
    with pytest.raises(FormatError, match="not a whole number"):
        RawCsrSource(toml)
    values.write_bytes(raw[:-2])  # one value short of the indices
    with pytest.raises(FormatError, match="one entry each"):
        RawCsrSource(toml)
    values.write_bytes(raw)
    ptr = np.fromfile(indptr, dtype="<i8")
    good = ptr.copy()
    ptr[10] = ptr[11] + 1  # decreases after frame 10
    ptr.tofile(indptr)
    with pytest.raises(FormatError, match="decreases at frame 10"):
        RawCsrSource(toml)
    good.tofile(indptr)
    indices = tmp_path / "scan_indices.raw"
    idx = np.fromfile(indices, dtype="<u4")
    frame = int(np.searchsorted(good, 5, "right")) - 1  # the frame holding entry 5
    idx[5] = DET[0] * DET[1] + 3  # outside the detector
    idx.tofile(indices)
    ds = qf.open(toml)
    with pytest.raises(CorruptChunkError, match=f"frame {frame} of .* names detector pixel 123"):
        qf.compute(qf.sum_diffraction(ds), client="synchronous", progress=False)


def test_a_sum_beyond_the_values_dtype_is_refused(tmp_path: Path) -> None:
    frames = np.zeros((SCAN[0] * SCAN[1], *DET), dtype=np.uint8)
    frames[0, 0, 0] = 200
    toml = write_raw_csr(tmp_path, frames, nav_shape=SCAN, messy=True)  # 200 split in two
    np.testing.assert_array_equal(RawCsrSource(toml).read_frames(0, 1)[0], frames[0])
    idx = np.fromfile(tmp_path / "scan_indices.raw", dtype="<u4")
    vals = np.fromfile(tmp_path / "scan_values.raw", dtype="<u1")
    repeat = np.concatenate([idx[:1], idx[:1], idx[:1]]).astype("<u4")
    np.concatenate([repeat, idx[1:]]).tofile(tmp_path / "scan_indices.raw")
    np.concatenate([np.full(3, 100, "<u1"), vals[1:]]).tofile(tmp_path / "scan_values.raw")
    ptr = np.fromfile(tmp_path / "scan_indptr.raw", dtype="<i8")
    (ptr + np.where(np.arange(ptr.size) >= 1, 2, 0)).tofile(tmp_path / "scan_indptr.raw")
    with pytest.raises(CorruptChunkError, match="sum to 300"):
        RawCsrSource(toml).read_frames(0, 1)


def _with_entries(
    tmp_path: Path, dtype: str, entries: list[tuple[int, int, float]], n: int = 4
) -> Path:
    """A descriptor whose files hold exactly ``entries`` (frame, pixel, value), in that order."""
    toml = write_raw_csr(tmp_path, np.zeros((n, *DET), dtype=dtype), nav_shape=(2, n // 2))
    frames = np.asarray([f for f, _, _ in entries], dtype=np.int64)
    ptr = np.searchsorted(frames, np.arange(n + 1), side="left").astype("<i8")
    ptr.tofile(tmp_path / "scan_indptr.raw")
    np.asarray([p for _, p, _ in entries], dtype="<u4").tofile(tmp_path / "scan_indices.raw")
    np.asarray([v for _, _, v in entries]).astype(np.dtype(dtype).newbyteorder("<")).tofile(
        tmp_path / "scan_values.raw"
    )
    return toml


@pytest.mark.parametrize("dtype", ["int8", "int16", "float32"])
def test_repeated_pixels_of_signed_and_real_values_are_summed(tmp_path: Path, dtype: str) -> None:
    entries = [(0, 7, 100), (0, 7, -60), (0, 3, -5), (1, 0, 2), (1, 0, 2), (3, 119, -1)]
    source = RawCsrSource(_with_entries(tmp_path, dtype, entries))
    want = np.zeros((4, DET[0] * DET[1]), dtype=dtype)
    for f, p, v in entries:
        want[f, p] += v
    np.testing.assert_array_equal(source.read_frames(0, 4).reshape(4, -1), want)


def test_a_signed_sum_beyond_the_values_dtype_is_refused(tmp_path: Path) -> None:
    toml = _with_entries(tmp_path, "int8", [(0, 5, 100), (1, 9, 100), (1, 9, 100)])
    np.testing.assert_array_equal(RawCsrSource(toml).read_frames(0, 1).reshape(-1)[5], 100)
    with pytest.raises(CorruptChunkError, match=r"sum to 200 .*int8 .*-128\.\.127"):
        RawCsrSource(toml).read_frames(0, 2)  # it was read back as -56
    low = _with_entries(tmp_path, "int16", [(2, 1, -20000), (2, 1, -20000)])
    with pytest.raises(CorruptChunkError, match="sum to -40000"):
        RawCsrSource(low).read_frames(2, 3)


def test_a_64_bit_sum_that_wraps_is_refused(tmp_path: Path) -> None:
    big = 2**63
    toml = _with_entries(tmp_path, "uint64", [(0, 4, big), (0, 4, big + 5)])
    with pytest.raises(CorruptChunkError, match=r"beyond 2\*\*64 - 1"):
        RawCsrSource(toml).read_frames(0, 1)  # it was read back as 5
    wide = _with_entries(tmp_path, "int64", [(0, 4, 2**62), (0, 4, 2**62), (0, 4, 2**62)])
    with pytest.raises(CorruptChunkError, match=r"sum to 1\.38\d*e\+19 .*beyond the int64"):
        RawCsrSource(wide).read_frames(0, 1)


def test_line_and_many_axis_nav_shapes(tmp_path: Path, rng: np.random.Generator) -> None:
    """A 1-D nav_shape is one row (recorded); more than two axes need scan_shape=."""
    data = _counts(rng)
    toml = write_raw_csr(tmp_path, data.reshape(-1, *DET), nav_shape=SCAN)
    text = toml.read_text()
    toml.write_text(text.replace("nav_shape = [6, 8]", "nav_shape = [48]"))
    line = RawCsrSource(toml)
    assert line.shape == (1, 48, *DET)
    assert "one line: read as one row" in line.metadata["scan_shape_from"]
    np.testing.assert_array_equal(line.read((0, 1), (0, 48))[0], data.reshape(48, *DET))
    toml.write_text(text.replace("nav_shape = [6, 8]", "nav_shape = [2, 3, 8]"))
    with pytest.raises(ScanShapeError, match=r"nav_shape \[2, 3, 8\] has 3 axes.*48 frames"):
        RawCsrSource(toml)
    given = RawCsrSource(toml, scan_shape=(8, 6))
    assert given.shape == (8, 6, *DET)
    np.testing.assert_array_equal(given.read((0, 8), (0, 6)), data.reshape(8, 6, *DET))
