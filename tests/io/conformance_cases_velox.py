"""Conformance cases of Velox ``.emd`` 4D-STEM camera stacks."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from .writers_velox import write_velox

if TYPE_CHECKING:
    from .test_reader_conformance import Case


def _velox(dtype: str, chunks: bool) -> Callable[[Path, np.random.Generator], Case]:
    def make(tmp: Path, rng: np.random.Generator) -> Case:
        # imported here: test_reader_conformance imports this module to collect CASES
        from .test_reader_conformance import Case, _random

        a = _random(rng, (5, 7, 6, 9), dtype)  # rectangular scan and detector
        return Case(write_velox(tmp / "scan.emd", a, chunks=chunks), {}, a, "velox")

    return make


CASES: dict[str, Callable[[Path, np.random.Generator], Case]] = {
    "velox-uint16-frame-chunks": _velox("uint16", True),
    "velox-float32-contiguous": _velox("float32", False),
}
