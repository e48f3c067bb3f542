"""The shipped reader conformance suite catches what it claims to (quantem_flow.testing.readers)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from quantem_flow.testing.readers import (
    DETECTOR,
    READER_CHECKS,
    SCAN,
    ReaderCase,
    check_block_reads,
    check_format_and_shape,
    check_full_read,
    check_orientation,
    check_reader,
    random_values,
)


def _npy_case(tmp_path: Path) -> ReaderCase:
    a = random_values(np.random.default_rng(1), (*SCAN, *DETECTOR), "uint16")
    path = tmp_path / "scan.npy"
    np.save(path, a)
    return ReaderCase(path, {}, a, "npy")


def test_a_conforming_reader_passes_every_check(tmp_path: Path) -> None:
    check_reader(_npy_case(tmp_path))
    assert len(READER_CHECKS) == 8


def test_a_transposed_expectation_fails(tmp_path: Path) -> None:
    case = _npy_case(tmp_path)
    wrong = ReaderCase(case.target, {}, np.ascontiguousarray(case.expected.swapaxes(0, 1)), "npy")
    with pytest.raises(AssertionError):
        check_format_and_shape(wrong)
    with pytest.raises(AssertionError):
        check_full_read(wrong)


def test_a_reader_that_swaps_rows_and_columns_fails(tmp_path: Path) -> None:
    # a square-looking mistake: the file holds the transpose of what the case expects
    a = random_values(np.random.default_rng(2), (*SCAN, *DETECTOR), "uint16")
    path = tmp_path / "swapped.npy"
    np.save(path, np.ascontiguousarray(a.swapaxes(0, 1)).reshape(-1, *DETECTOR))
    case = ReaderCase(path, {"scan_shape": SCAN}, a, "npy")
    with pytest.raises(AssertionError):
        check_orientation(case)
    with pytest.raises(AssertionError):
        check_block_reads(case)


def test_a_wrong_format_name_fails(tmp_path: Path) -> None:
    case = _npy_case(tmp_path)
    with pytest.raises(AssertionError, match="format 'npy'"):
        check_format_and_shape(ReaderCase(case.target, {}, case.expected, "mrc"))
