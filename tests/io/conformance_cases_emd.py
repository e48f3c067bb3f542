"""Conformance cases of EMD 1.0 (py4DSTEM / emdfile) datacubes."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from .writers_emd import write_emd

if TYPE_CHECKING:
    from .test_reader_conformance import Case


def _emd(dtype: str, chunks: tuple[int, ...] | None) -> Callable[[Path, np.random.Generator], Case]:
    def make(tmp: Path, rng: np.random.Generator) -> Case:
        # imported here: test_reader_conformance imports this module to collect CASES
        from .test_reader_conformance import Case, _random

        a = _random(rng, (5, 7, 6, 9), dtype)  # rectangular scan and detector
        return Case(write_emd(tmp / "scan.emd", a, chunks=chunks), {}, a, "emd")

    return make


CASES: dict[str, Callable[[Path, np.random.Generator], Case]] = {
    "emd-uint16": _emd("uint16", None),
    "emd-float32-chunked": _emd("float32", (2, 3, 6, 9)),
}
