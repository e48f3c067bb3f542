"""The value a worker holds for one chunk of a dataset."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from ..errors import ParameterError

__all__ = ["REPRESENTATIONS", "RESIDENCIES", "Chunk", "check_representation"]

#: Every representation the architecture names; kernels exist for those a
#: runtime registers (see :mod:`quantem_flow.runtimes`).
REPRESENTATIONS = ("dense", "encoded", "paired", "packed")

#: Residency prefixes: ``host``, ``cuda:<n>``, ``mps``, ``external:<worker>``.
RESIDENCIES = ("host", "cuda", "mps", "external")


def check_representation(name: str) -> str:
    """Return ``name`` if it is a known representation, else raise."""
    if name not in REPRESENTATIONS:
        raise ParameterError(
            f"unknown representation {name!r}; expected one of {list(REPRESENTATIONS)}"
        )
    return name


@dataclasses.dataclass
class Chunk:
    """One chunk of a dataset, as held on a worker.

    Attributes
    ----------
    representation
        ``"dense"``, ``"encoded"``, ``"paired"`` or ``"packed"``.
    residency
        Where the payload lives: ``"host"``, ``"cuda:0"``, ``"mps"``,
        ``"external:<worker>"``.
    scan_slice
        Half-open ``((row_start, row_stop), (col_start, col_stop))`` of the
        dataset's scan that the chunk covers.
    payload
        The data; for ``dense`` an array ``(rows, cols, k_r, k_c)``.
    storage_schema
        Versioned name of the exact payload layout (``"dense-v1"``...).
    """

    representation: str
    residency: str
    scan_slice: tuple[tuple[int, int], tuple[int, int]]
    payload: Any
    storage_schema: str

    def __post_init__(self) -> None:
        check_representation(self.representation)
        if self.residency.split(":", 1)[0] not in RESIDENCIES:
            raise ParameterError(
                f"unknown residency {self.residency!r}; expected host, cuda:<n>, mps or "
                "external:<worker>"
            )

    @property
    def n_frames(self) -> int:
        """Scan positions in the chunk."""
        (r0, r1), (c0, c1) = self.scan_slice
        return (r1 - r0) * (c1 - c0)

    @property
    def nbytes(self) -> int:
        """Physical bytes of the payload."""
        payload = self.payload
        if isinstance(payload, np.ndarray):
            return int(payload.nbytes)
        return int(getattr(payload, "nbytes", 0))


def _register_sizeof() -> None:
    """Tell Dask a chunk's size is its payload's, so memory accounting is honest.

    Device payloads are kept out of the spill buffer by the worker's data
    mapping (:mod:`quantem_flow.graphs.worker_data`), not by under-reporting
    their size.
    """
    try:
        from dask.sizeof import sizeof
    except ImportError:  # pragma: no cover - dask is a dependency
        return

    @sizeof.register(Chunk)  # type: ignore[untyped-decorator]
    def _sizeof_chunk(chunk: Chunk) -> int:
        return chunk.nbytes + 256


_register_sizeof()
