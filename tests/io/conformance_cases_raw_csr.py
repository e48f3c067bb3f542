"""Reader conformance cases of LiberTEM's sparse ``raw_csr`` layout.

Sparse random counts (most pixels zero) written by :mod:`tests.io.writers_raw_csr`
from the documented descriptor: tidy CSR, messy CSR (entries out of order,
a pixel's value split over repeated entries, stored zeros), 32-bit index
pointers, and real values (which open dense).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from .test_reader_conformance import DETECTOR, SCAN, Case
from .writers_raw_csr import write_raw_csr


def _sparse(rng: np.random.Generator, dtype: str) -> np.ndarray:
    values = rng.integers(1, 200, size=(*SCAN, *DETECTOR)).astype(dtype)
    values[rng.random(values.shape) < 0.8] = 0
    return values


def _case(dtype: str, **options: object) -> Callable[[Path, np.random.Generator], Case]:
    def make(tmp: Path, rng: np.random.Generator) -> Case:
        expected = _sparse(rng, dtype)
        toml = write_raw_csr(
            tmp,
            expected.reshape(-1, *DETECTOR),
            nav_shape=SCAN,
            rng=rng,
            **options,  # type: ignore[arg-type]
        )
        return Case(toml, {}, expected, "raw_csr")

    return make


CASES: dict[str, Callable[[Path, np.random.Generator], Case]] = {
    "raw_csr-uint16": _case("uint16"),
    "raw_csr-messy-uint32": _case("uint32", messy=True, indptr_dtype="<i4"),
    "raw_csr-float32-dense": _case("float32"),
}
