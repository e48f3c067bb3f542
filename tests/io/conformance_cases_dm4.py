"""Conformance cases of Gatan ``.dm4`` 4-D files: C order and the hybrid order."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from .writers_dm4 import write_dm4_4d

if TYPE_CHECKING:
    from .test_reader_conformance import Case


def _dm4(swapped: bool | None, dtype: str) -> Callable[[Path, np.random.Generator], Case]:
    def make(tmp: Path, rng: np.random.Generator) -> Case:
        # imported here: test_reader_conformance imports this module to collect CASES
        from .test_reader_conformance import Case, _random

        a = _random(rng, (5, 7, 6, 9), dtype)  # rectangular scan and detector
        return Case(write_dm4_4d(tmp / "scan.dm4", a, swapped=swapped), {}, a, "dm4")

    return make


CASES: dict[str, Callable[[Path, np.random.Generator], Case]] = {
    "dm4-c-order-uint16": _dm4(True, "uint16"),
    "dm4-hybrid-order-float32": _dm4(None, "float32"),
    "dm4-hybrid-order-tag0-int32": _dm4(False, "int32"),
}
