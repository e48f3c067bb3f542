"""Gathered pixels kept as the chunks' blocks (graphs/gathered.py) and huge-page host arrays."""

from __future__ import annotations

import mmap

import numpy as np
import pytest

from quantem_flow.graphs.gathered import GatheredPixels
from quantem_flow.runtimes.host_arrays import HUGE_PAGE_MIN_BYTES, fresh_zeros


def _filled(rng: np.random.Generator) -> tuple[np.ndarray, GatheredPixels]:
    whole = rng.integers(0, 60000, size=(7, 9, 5), dtype=np.uint16)
    g = GatheredPixels(7, (9, 5), np.uint16)
    for r0, r1 in ((4, 9), (0, 1), (1, 4)):  # chunks arrive in any order
        g.add((r0, r1), np.ascontiguousarray(whole[:, r0:r1]))
    return whole, g


def test_reads_equal_one_array(rng: np.random.Generator) -> None:
    whole, g = _filled(rng)
    assert g.complete and g.shape == whole.shape and np.shape(g) == whole.shape
    assert len(g) == 7 and g.dtype == whole.dtype
    for key in (slice(None), slice(2, 5), slice(0, 0), np.array([6, 0, 3]), np.array([2, 3])):
        got = g[key]
        np.testing.assert_array_equal(got, whole[key])
        assert got.dtype == whole.dtype
    np.testing.assert_array_equal(g[4], whole[4])
    np.testing.assert_array_equal(np.asarray(g), whole)
    # a read is a copy: writing to it leaves the blocks as they were
    block = g[1:3]
    block[...] = 0
    np.testing.assert_array_equal(g[1:3], whole[1:3])


def test_wrong_blocks_and_early_reads_are_refused(rng: np.random.Generator) -> None:
    g = GatheredPixels(3, (4, 2), np.uint16)
    with pytest.raises(ValueError, match=r"expected \(3, 2, 2\)"):
        g.add((0, 2), np.zeros((3, 2, 3), dtype=np.uint16))
    with pytest.raises(ValueError, match="within 4 rows"):
        g.add((3, 5), np.zeros((3, 2, 2), dtype=np.uint16))
    with pytest.raises(ValueError, match="dtype float32"):
        g.add((0, 2), np.zeros((3, 2, 2), dtype=np.float32))
    g.add((0, 2), np.zeros((3, 2, 2), dtype=np.uint16))
    with pytest.raises(ValueError, match="gathered twice"):
        g.add((1, 3), np.zeros((3, 2, 2), dtype=np.uint16))
    with pytest.raises(ValueError, match=r"before scan rows \[2, 3\] arrived"):
        g[0:1]
    with pytest.raises(TypeError, match="first axis only"):
        g[0, 1]


def test_fresh_zeros_small_and_large() -> None:
    small = fresh_zeros((3, 4), np.float64)
    assert small.shape == (3, 4) and not small.any() and small.flags.writeable
    n = HUGE_PAGE_MIN_BYTES // 2 + 3
    large = fresh_zeros((2, n), "<u2")
    assert large.shape == (2, n) and large.dtype == np.dtype("<u2")
    assert large.flags.c_contiguous and large.flags.writeable
    assert not large[:, :: 4096 * 7].any()
    large[1, -1] = 7
    assert int(large.sum()) == 7
    if hasattr(mmap, "MADV_HUGEPAGE"):  # backed by its own anonymous map
        assert isinstance(large.base.base.obj, mmap.mmap)  # array <- memoryview <- map
