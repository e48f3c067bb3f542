"""The radius rule quantem-flow uses, and how far LiberTEM's rule differs (docs/conventions.md)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from quantem_flow.operators.geometry import annulus

DOC = Path(__file__).resolve().parents[1] / "docs" / "conventions.md"


def _libertem_rule(
    shape: tuple[int, int], centre: tuple[float, float], inner: float, outer: float
) -> np.ndarray:
    """``inner < d <= outer`` (a disk ``d <= outer`` when inner is 0), from its description."""
    rr, cc = np.indices(shape, dtype=np.float64)
    d = np.sqrt((rr - centre[0]) ** 2 + (cc - centre[1]) ** 2)
    return (d <= outer) & ((d > inner) if inner > 0 else np.ones(shape, dtype=bool))


@pytest.mark.parametrize(
    ("centre", "inner", "outer"),
    [((64.0, 64.0), 0.0, 10.0), ((64.0, 64.0), 20.0, 50.0), ((63.5, 63.5), 0.0, 10.0)],
)
def test_the_documented_table_is_what_the_rules_give(
    centre: tuple[float, float], inner: float, outer: float
) -> None:
    ours = int(annulus((128, 128), centre, inner, outer, (1.0, 1.0)).sum())
    theirs = int(_libertem_rule((128, 128), centre, inner, outer).sum())
    rows = DOC.read_text(encoding="utf-8").splitlines()
    what = (f"disk, r = {outer:g} px" if inner == 0 else f"ring, {inner:g}-{outer:g} px") + (
        "" if centre == (64.0, 64.0) else f", centre ({centre[0]:g}, {centre[1]:g})"
    )
    line = next(r for r in rows if r.startswith(f"| {what} |"))
    numbers = [int(v) for v in re.findall(r"\|\s*(\d+)", line)[:3]]
    assert numbers == [ours, theirs, theirs - ours]


def test_adjacent_regions_share_no_pixel_and_tile_the_disk() -> None:
    shape, centre = (64, 64), (31.0, 32.0)
    disk = annulus(shape, centre, 0.0, 10.0, (1.0, 1.0))
    ring = annulus(shape, centre, 10.0, 20.0, (1.0, 1.0))
    assert not (disk & ring).any()
    np.testing.assert_array_equal(disk | ring, annulus(shape, centre, 0.0, 20.0, (1.0, 1.0)))
    on_boundary = np.isclose(np.hypot(*(np.indices(shape) - np.array(centre)[:, None, None])), 10.0)
    assert on_boundary.any() and ring[on_boundary].all() and not disk[on_boundary].any()
