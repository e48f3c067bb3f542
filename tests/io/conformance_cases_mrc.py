"""Reader conformance cases of MRC stacks (collected by test_reader_conformance)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from .test_reader_conformance import DETECTOR, SCAN, Case, _random
from .writers_mrc import write_de_info, write_mrc


def _mrc_de(tmp: Path, rng: np.random.Generator) -> Case:
    # A DE movie: the scan shape comes from <name>_info.txt beside it.
    a = _random(rng, (*SCAN, *DETECTOR), "uint16")
    p = write_mrc(tmp / "20240101_00001_movie.mrc", a.reshape(-1, *DETECTOR), extended=bytes(256))
    write_de_info(tmp / "20240101_00001_info.txt", SCAN)
    return Case(p, {}, a, "mrc")


def _mrc_big_endian(tmp: Path, rng: np.random.Generator) -> Case:
    a = _random(rng, (*SCAN, *DETECTOR), "float32")
    p = write_mrc(tmp / "stack.mrc", a.reshape(-1, *DETECTOR), big_endian=True)
    return Case(p, {"scan_shape": SCAN}, a, "mrc")


def _mrc_int8(tmp: Path, rng: np.random.Generator) -> Case:
    a = rng.integers(-128, 127, size=(*SCAN, *DETECTOR), endpoint=True).astype(np.int8)
    p = write_mrc(tmp / "bytes.mrc", a.reshape(-1, *DETECTOR))
    return Case(p, {"scan_shape": SCAN}, a, "mrc")


CASES: dict[str, Callable[[Path, np.random.Generator], Case]] = {
    "mrc-de-info-u2": _mrc_de,
    "mrc-big-endian-f4": _mrc_big_endian,
    "mrc-int8": _mrc_int8,
}
