"""Reader conformance cases of TIA ``.ser`` series (collected by test_reader_conformance)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from .test_reader_conformance import DETECTOR, SCAN, Case, _random
from .writers_ser import write_emi, write_ser


def _ser(dtype: str, version: int) -> Callable[[Path, np.random.Generator], Case]:
    def make(tmp: Path, rng: np.random.Generator) -> Case:
        a = _random(rng, (*SCAN, *DETECTOR), dtype)
        p = write_ser(tmp / "scan_1.ser", a, version=version)
        write_emi(tmp / "scan.emi")
        return Case(p, {}, a, "ser")

    return make


def _ser_series(tmp: Path, rng: np.random.Generator) -> Case:
    a = _random(rng, (*SCAN, *DETECTOR), "float32")
    p = write_ser(tmp / "series_1.ser", a, ndim=1, positions=False, version=0x0210)
    return Case(p, {"scan_shape": SCAN}, a, "ser")


CASES: dict[str, Callable[[Path, np.random.Generator], Case]] = {
    "ser-u2-v0220": _ser("uint16", 0x0220),
    "ser-i4-v0210": _ser("int32", 0x0210),
    "ser-f4-series": _ser_series,
}
