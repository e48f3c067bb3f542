"""Reader conformance cases of TVIPS streams (collected by test_reader_conformance)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from .test_reader_conformance import DETECTOR, SCAN, Case, _random
from .writers_tvips import write_tvips


def _tvips_multi(tmp: Path, rng: np.random.Generator) -> Case:
    # 35 frames in files of 8: file boundaries fall inside scan rows.
    a = _random(rng, (*SCAN, *DETECTOR), "uint16")
    p = write_tvips(tmp, "rec", a.reshape(-1, *DETECTOR), frames_per_file=8)
    return Case(p, {"scan_shape": SCAN}, a, "tvips")


def _tvips_rotidx(tmp: Path, rng: np.random.Generator) -> Case:
    # 3 frames before the scan (rotidx 0) and 2 after it, 8-bit, padded frame headers.
    a = _random(rng, (*SCAN, *DETECTOR), "uint8")
    n = SCAN[0] * SCAN[1]
    before = _random(rng, (3, *DETECTOR), "uint8")
    after = _random(rng, (2, *DETECTOR), "uint8")
    frames = np.concatenate([before, a.reshape(-1, *DETECTOR), after])
    rot = np.concatenate([np.zeros(3), np.arange(1, n + 1), [n, n]]).astype(np.uint32)
    p = write_tvips(tmp, "scan", frames, frames_per_file=11, rotidx=rot, extra_frame_header=4)
    return Case(p, {"scan_shape": SCAN, "frame_offset": "rotidx"}, a, "tvips")


CASES: dict[str, Callable[[Path, np.random.Generator], Case]] = {
    "tvips-multi-file": _tvips_multi,
    "tvips-rotidx-start": _tvips_rotidx,
}
