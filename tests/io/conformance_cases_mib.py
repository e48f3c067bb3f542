"""Conformance cases of Merlin raw-mode (``R64``) ``.mib`` files, counter depths 1 to 24."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from .writers_mib import write_raw_mib, write_raw_quad_mib

if TYPE_CHECKING:
    from .test_reader_conformance import Case

_DTYPES = {1: "uint8", 6: "uint8", 12: "uint16", 24: "uint32"}


def _raw(depth: int) -> Callable[[Path, np.random.Generator], Case]:
    def make(tmp: Path, rng: np.random.Generator) -> Case:
        # imported here: test_reader_conformance imports this module to collect CASES
        from .test_reader_conformance import Case

        scan, detector = (2, 3), (8, 16)  # rectangular scan and detector; 128 px = whole words
        a = rng.integers(0, 2**depth - 1, size=(*scan, *detector), endpoint=True)
        a = a.astype(_DTYPES[depth])
        p = write_raw_mib(tmp / "raw.mib", a.reshape(-1, *detector), counter_depth=depth)
        return Case(p, {"scan_shape": scan}, a, "mib")

    return make


def _quad(depth: int) -> Callable[[Path, np.random.Generator], Case]:
    def make(tmp: Path, rng: np.random.Generator) -> Case:
        from .test_reader_conformance import Case

        scan = (2, 3)  # quad frames are square: 2 x 2 chips of 64 x 64
        a = rng.integers(0, 2**depth - 1, size=(*scan, 128, 128), endpoint=True)
        a = a.astype(_DTYPES[depth])
        p = write_raw_quad_mib(tmp / "quad.mib", a.reshape(-1, 128, 128), counter_depth=depth)
        return Case(p, {"scan_shape": scan}, a, "mib")

    return make


CASES: dict[str, Callable[[Path, np.random.Generator], Case]] = {
    **{f"mib-R64-{depth}bit": _raw(depth) for depth in (1, 6, 12, 24)},
    **{f"mib-R64-{depth}bit-quad": _quad(depth) for depth in (1, 6, 12)},
}
