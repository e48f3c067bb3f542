"""Reader conformance cases of electron-counted HDF5 files (stempy layout).

Each case draws random electron events per scan position, writes them with
:func:`tests.io.writers.write_stempy` (from the documented layout, not the
reader's own writer) and expects the dense counts: ``expected[r, c, i, j]``
is the number of events at flat pixel ``i * k_c + j`` for scan position
``r * C + c``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from . import writers
from .test_reader_conformance import DETECTOR, SCAN, Case


def _events(
    rng: np.random.Generator, scan: tuple[int, int], frame: tuple[int, int], dtype: str
) -> tuple[list[np.ndarray], np.ndarray]:
    """Random events per scan position (4-11 of them, so frames differ; repeats = counts > 1)."""
    R, C = scan
    kr, kc = frame
    expected = np.zeros((R, C, kr, kc), dtype=dtype)
    events: list[np.ndarray] = []
    for flat in range(R * C):
        ev = rng.integers(0, kr * kc, size=int(rng.integers(4, 12)), dtype=np.uint32)
        events.append(ev)
        expected.reshape(R * C, kr * kc)[flat] = np.bincount(ev, minlength=kr * kc)
    return events, expected


def _counted(attrs: str) -> Callable[[Path, np.random.Generator], Case]:
    def make(tmp: Path, rng: np.random.Generator) -> Case:
        events, expected = _events(rng, SCAN, DETECTOR, "uint32")
        p = writers.write_stempy(tmp / "events.h5", events, SCAN, DETECTOR, attrs=attrs)
        return Case(p, {}, expected, "counted")

    return make


def _counted_shuffled(tmp: Path, rng: np.random.Generator) -> Case:
    # Frame entries in a random scan order, one position missing (all zero).
    events, expected = _events(rng, SCAN, DETECTOR, "uint32")
    order = rng.permutation(len(events))
    missing = int(order[-1])
    order = order[:-1]
    expected.reshape(-1, *DETECTOR)[missing] = 0
    p = writers.write_stempy(
        tmp / "shuffled.h5", [events[i] for i in order], SCAN, DETECTOR, positions=order
    )
    return Case(p, {}, expected, "counted")


def _counted_uint16(tmp: Path, rng: np.random.Generator) -> Case:
    events, expected = _events(rng, SCAN, DETECTOR, "uint16")
    p = writers.write_stempy(tmp / "u16.h5", events, SCAN, DETECTOR, attrs="none")
    opts = {"scan_shape": SCAN, "frame_shape": DETECTOR, "dtype": "uint16"}
    return Case(p, opts, expected, "counted")


CASES: dict[str, Callable[[Path, np.random.Generator], Case]] = {
    "counted-NxNy": _counted("NxNy"),
    "counted-dimensions": _counted("dimensions"),
    "counted-shuffled-missing": _counted_shuffled,
    "counted-uint16-shapes-given": _counted_uint16,
}
