"""Reader conformance cases of NanoMEGAS blockfiles (collected by test_reader_conformance)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from .test_reader_conformance import Case, _random
from .writers_blockfile import write_blockfile


def _blockfile(tmp: Path, rng: np.random.Generator) -> Case:
    # Blockfile frames are always square; the scan is rectangular.
    a = _random(rng, (5, 7, 8, 8), "uint8")
    return Case(write_blockfile(tmp / "scan.blo", a), {}, a, "blockfile")


def _blockfile_given_shape(tmp: Path, rng: np.random.Generator) -> Case:
    a = _random(rng, (3, 8, 6, 6), "uint8")
    p = write_blockfile(tmp / "given.blo", a.reshape(6, 4, 6, 6))
    return Case(p, {"scan_shape": (3, 8)}, a, "blockfile")


CASES: dict[str, Callable[[Path, np.random.Generator], Case]] = {
    "blockfile": _blockfile,
    "blockfile-scan-shape-given": _blockfile_given_shape,
}
