"""pnCCD FRMS6: unfolding, the .hdr's scan, dark and gain applied only when asked, damage.

Acquisitions come from :mod:`tests.io.writers_frms6` (the documented layout).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import quantem_flow as qf
from quantem_flow.errors import (
    FormatError,
    ParameterError,
    ScanShapeError,
    ShapeError,
    SourceNotFoundError,
)
from quantem_flow.io import detect_format
from quantem_flow.io.frms6 import Frms6Source, unfold

from .writers_frms6 import fold, write_frms6

SCAN = (3, 5)
DET = (8, 6)  # unfolded: read out as 4 rows of 12 columns


def _acq(
    tmp_path: Path, rng: np.random.Generator, **options: object
) -> tuple[Path, np.ndarray, np.ndarray]:
    frames = rng.integers(0, 3000, size=(SCAN[0] * SCAN[1], *DET)).astype(np.uint16)
    darks = rng.integers(90, 110, size=(5, *DET)).astype(np.uint16)
    hdr = write_frms6(tmp_path, frames, darks, stem_image_size=SCAN, per_file=4, **options)  # type: ignore[arg-type]
    return hdr, frames, darks


def test_unfold_inverts_the_readout() -> None:
    a = np.arange(2 * 8 * 6, dtype=np.uint16).reshape(2, 8, 6)
    np.testing.assert_array_equal(unfold(fold(a)), a)
    stored = fold(a)
    assert stored.shape == (2, 4, 12)
    # the right half holds the bottom rows upside down and mirrored
    assert stored[0, 0, -1] == a[0, -1, 0]


def test_reads_the_unfolded_frames_across_files(tmp_path: Path, rng: np.random.Generator) -> None:
    hdr, frames, _ = _acq(tmp_path, rng)
    for opened in (hdr, tmp_path / "acq_002.frms6"):
        source = Frms6Source(opened)
        assert source.shape == (*SCAN, *DET) and source.dtype == np.uint16
        np.testing.assert_array_equal(source.read_frames(0, len(frames)), frames)
        assert source.metadata["stored_frame_shape"] == [4, 12]
        assert "stemimagesize 3x5" in source.metadata["scan_shape_from"]
    assert detect_format(hdr) == "frms6" and detect_format(tmp_path / "acq_001.frms6") == "frms6"
    ds = qf.open(tmp_path / "acq_003.frms6")
    (total,) = qf.compute(qf.sum_diffraction(ds), client="synchronous")
    np.testing.assert_array_equal(np.asarray(total), frames.sum(axis=0, dtype=np.int64))


def test_dark_and_gain_only_when_asked(tmp_path: Path, rng: np.random.Generator) -> None:
    hdr, frames, darks = _acq(tmp_path, rng)
    plain = Frms6Source(hdr)
    assert plain.metadata["corrections"] == []
    assert any("dark frames" in n and "not subtracted" in n for n in plain.notes)
    gain = rng.uniform(0.8, 1.2, size=DET).astype(np.float32)
    np.save(tmp_path / "gain.npy", gain)
    fixed = Frms6Source(hdr, corrections=("dark", "gain"), gain_map=tmp_path / "gain.npy")
    assert fixed.dtype == np.float32
    dark = darks.astype(np.float64).mean(axis=0).astype(np.float32)
    want = (frames.astype(np.float32) - dark) * gain
    np.testing.assert_array_equal(fixed.read_frames(0, len(frames)), want)
    applied = fixed.metadata["corrections"]
    assert [c["kind"] for c in applied] == ["dark", "gain"] and applied[0]["frames"] == 5
    assert len(applied[1]["sha256"]) == 64
    assert str(tmp_path / "gain.npy") in fixed.identity.paths
    with pytest.raises(ParameterError, match="no gain map was given"):
        Frms6Source(hdr, corrections=("gain",))
    with pytest.raises(ParameterError, match="without corrections"):
        Frms6Source(hdr, gain_map=tmp_path / "gain.npy")
    np.save(tmp_path / "small.npy", gain[:4])
    with pytest.raises(ShapeError, match=r"\(4, 6\)"):
        Frms6Source(hdr, corrections=("gain",), gain_map=tmp_path / "small.npy")


def test_scan_shape_given_and_missing(tmp_path: Path, rng: np.random.Generator) -> None:
    frames = rng.integers(0, 9, size=(15, *DET)).astype(np.uint16)
    darks = np.zeros((1, *DET), np.uint16)
    hdr = write_frms6(tmp_path, frames, darks, stem_image_size=None)
    with pytest.raises(ScanShapeError, match="scan_shape"):
        Frms6Source(hdr)
    assert Frms6Source(hdr, scan_shape=(5, 3)).shape[:2] == (5, 3)


def test_damaged_acquisitions(tmp_path: Path, rng: np.random.Generator) -> None:
    hdr, _, _ = _acq(tmp_path, rng)
    text = hdr.read_text()
    hdr.write_text(text.replace("[measurementInfo]", "[other]"))
    with pytest.raises(FormatError, match=r"no \[measurementInfo\]"):
        Frms6Source(hdr)
    hdr.write_text(text.replace("stemimagesize=3x5", "stemimagesize=3by5"))
    with pytest.raises(FormatError, match="stemimagesize"):
        Frms6Source(hdr)
    hdr.write_text(text)
    signal = tmp_path / "acq_002.frms6"
    raw = signal.read_bytes()
    signal.write_bytes(raw[:-10])  # the last frame cut short
    with pytest.raises(FormatError, match="truncated"):
        Frms6Source(hdr)
    signal.write_bytes(b"\x00" * 1024 + raw[1024:])
    with pytest.raises(FormatError, match="not an FRMS6 file"):
        Frms6Source(hdr)
    signal.write_bytes(raw)
    (tmp_path / "acq_000.frms6").unlink()
    with pytest.raises(SourceNotFoundError, match=r"acq_000\.frms6"):
        Frms6Source(hdr)
    hdr.unlink()
    with pytest.raises(SourceNotFoundError, match=r"acq\.hdr"):
        Frms6Source(signal)


def test_unfold_pixel_by_pixel_from_the_documented_rule() -> None:
    """Row y < h is stored row y, left half; row h + j is stored row h - 1 - j, right half
    read backwards (an element-wise check, independent of the writer's ``fold``)."""
    stored = np.arange(3 * 4 * 10, dtype=np.uint16).reshape(3, 4, 10)
    got = unfold(stored)
    n, h, w = stored.shape
    half = w // 2
    assert got.shape == (n, 2 * h, half)
    for i in range(n):
        for y in range(2 * h):
            for x in range(half):
                want = stored[i, y, x] if y < h else stored[i, 2 * h - 1 - y, w - 1 - x]
                assert got[i, y, x] == want, (i, y, x)


def test_files_of_one_acquisition_only_and_without_gaps(
    tmp_path: Path, rng: np.random.Generator
) -> None:
    hdr, frames, _ = _acq(tmp_path, rng)
    other = rng.integers(0, 9, size=(4, *DET)).astype(np.uint16)
    write_frms6(tmp_path, other, other[:1], stem_image_size=(2, 2), name="acq_2", per_file=2)
    source = Frms6Source(hdr)  # acq_2_000.frms6... are another acquisition's
    assert len(source.metadata["files"]) == 4
    np.testing.assert_array_equal(source.read_frames(0, len(frames)), frames)
    np.testing.assert_array_equal(
        Frms6Source(tmp_path / "acq_2_001.frms6").read_frames(0, 4), other
    )
    (tmp_path / "acq_002.frms6").unlink()
    with pytest.raises(SourceNotFoundError, match=r"numbered \[0, 1, 3, 4\].*gap"):
        Frms6Source(hdr, scan_shape=(1, 11))


def test_the_hdrs_frame_counts_are_checked(tmp_path: Path, rng: np.random.Generator) -> None:
    hdr, _, _ = _acq(tmp_path, rng)
    text = hdr.read_text()
    hdr.write_text(text.replace("signalframes=15", "signalframes=16"))
    with pytest.raises(FormatError, match=r"announces 16 signal frames.*hold 15.*scan_shape="):
        Frms6Source(hdr)
    given = Frms6Source(hdr, scan_shape=(5, 3))
    assert any("announces 16 signal frames" in n for n in given.notes)
    hdr.write_text(text.replace("darkframes=5", "darkframes=7") + "comment=100% dark\n")
    noted = Frms6Source(hdr)  # a % in a value is text, not interpolation
    assert noted.metadata["measurement_info"]["comment"] == "100% dark"
    assert any("announces 7 dark frames" in n and "holds 5" in n for n in noted.notes)
    signal = tmp_path / "acq_004.frms6"
    signal.write_bytes(signal.read_bytes() + b"\x00" * 100)
    assert any("100 bytes after the 3 frames" in n for n in Frms6Source(hdr).notes)


def test_a_partial_frame_in_a_file_without_a_count_is_refused(
    tmp_path: Path, rng: np.random.Generator
) -> None:
    hdr, frames, _ = _acq(tmp_path, rng, count_in_header=False)
    np.testing.assert_array_equal(Frms6Source(hdr).read_frames(0, len(frames)), frames)
    signal = tmp_path / "acq_004.frms6"
    signal.write_bytes(signal.read_bytes()[:-10])
    with pytest.raises(FormatError, match=r"records no frame count.*partial last frame"):
        Frms6Source(hdr)


def test_a_binned_readout_is_returned_as_read_and_noted(
    tmp_path: Path, rng: np.random.Generator
) -> None:
    hdr, frames, _ = _acq(tmp_path, rng, binning=4)
    source = Frms6Source(hdr)
    assert source.metadata["readout_binning"] == 4
    assert any("bin: 4" in n and "not resampled" in n for n in source.notes)
    assert source.shape == (*SCAN, *DET)
    np.testing.assert_array_equal(source.read_frames(0, len(frames)), frames)


def test_the_dark_mean_is_summed_in_pieces(
    tmp_path: Path, rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    import quantem_flow.io.frms6 as frms6

    hdr, _, darks = _acq(tmp_path, rng)
    whole = Frms6Source(hdr, corrections=("dark",)).read_frames(0, 1)
    monkeypatch.setattr(frms6, "_DARK_PIECE_BYTES", 2 * DET[0] * DET[1] * 2)  # two frames
    pieces = Frms6Source(hdr, corrections=("dark",)).read_frames(0, 1)
    np.testing.assert_array_equal(pieces, whole)
    raw = Frms6Source(hdr).read_frames(0, 1).astype(np.float32)
    mean = darks.astype(np.float64).mean(axis=0).astype(np.float32)
    np.testing.assert_array_equal(pieces, raw - mean)
