"""Reader conformance cases of Norpix StreamPix ``.seq`` files (:mod:`tests.io.writers_seq`)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from .test_reader_conformance import DETECTOR, SCAN, Case, _random
from .writers_seq import write_seq


def _seq(dtype: str, version: int) -> Callable[[Path, np.random.Generator], Case]:
    def make(tmp: Path, rng: np.random.Generator) -> Case:
        expected = _random(rng, (*SCAN, *DETECTOR), dtype)
        path = write_seq(tmp / "movie.seq", expected.reshape(-1, *DETECTOR), version=version)
        return Case(path, {"scan_shape": SCAN}, expected, "seq")

    return make


CASES: dict[str, Callable[[Path, np.random.Generator], Case]] = {
    "seq-v5-uint16": _seq("uint16", 5),
    "seq-v4-uint8": _seq("uint8", 4),
    "seq-v5-uint32": _seq("uint32", 5),
}
