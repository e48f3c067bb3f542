"""Reader conformance cases of Gatan K2 IS acquisitions (:mod:`tests.io.writers_k2is`).

The suite's scan; a small geometry (sectors of 6 x 2 in blocks of 3 x 2: a
6 x 16 frame) that the reader takes from the block headers; 12-bit values.
The sectors start mid-frame at different blocks and end with a partial frame.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from .test_reader_conformance import SCAN, Case
from .writers_k2is import write_k2is

FRAME = (6, 16)


def _k2is(gtg: bool) -> Callable[[Path, np.random.Generator], Case]:
    def make(tmp: Path, rng: np.random.Generator) -> Case:
        expected = rng.integers(0, 4096, size=(*SCAN, *FRAME)).astype(np.uint16)
        path = write_k2is(tmp, expected.reshape(-1, *FRAME), block=(3, 2), gtg=gtg)
        return Case(path, {"scan_shape": SCAN}, expected, "k2is")

    return make


CASES: dict[str, Callable[[Path, np.random.Generator], Case]] = {
    "k2is-gtg": _k2is(True),
    "k2is-sector-file": _k2is(False),
}
