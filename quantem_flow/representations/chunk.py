"""The value a worker holds for one chunk of a dataset."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator, Sequence
from typing import Any, overload

import numpy as np

from ..errors import ParameterError
from .base import representation_names

__all__ = [
    "REPRESENTATIONS",
    "RESIDENCIES",
    "Chunk",
    "check_representation",
    "chunk_of",
    "register_residency",
]


class _Names(Sequence[str]):
    """A live, read-only view of names kept elsewhere (a registry's keys)."""

    def __init__(self, source: Any) -> None:
        self._source = source

    def _names(self) -> tuple[str, ...]:
        return tuple(self._source())

    @overload
    def __getitem__(self, index: int) -> str: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[str]: ...

    def __getitem__(self, index: int | slice) -> str | Sequence[str]:
        return self._names()[index]

    def __len__(self) -> int:
        return len(self._names())

    def __iter__(self) -> Iterator[str]:
        return iter(self._names())

    def __contains__(self, value: object) -> bool:
        return value in self._names()

    def __repr__(self) -> str:
        return repr(self._names())


#: The names of every representation (a live view: built-ins, installed plug-ins and those
#: registered in process, :data:`~quantem_flow.representations.base.REPRESENTATION_REGISTRY`).
REPRESENTATIONS: Sequence[str] = _Names(representation_names)

_RESIDENCIES: list[str] = ["host", "cuda", "mps", "external"]
#: Residency prefixes: ``host``, ``cuda:<n>``, ``mps``, ``external:<worker>``,
#: and those a registered runtime declares (a live view).
RESIDENCIES: Sequence[str] = _Names(lambda: _RESIDENCIES)
_PREFIX = re.compile(r"^[a-z][a-z0-9_-]*$")


def register_residency(prefix: str) -> None:
    """Admit residency ``prefix`` (``"<prefix>"`` or ``"<prefix>:<id>"``) for chunks.

    The runtime registry calls it for every runtime it registers.

    Raises
    ------
    ParameterError
        ``prefix`` is not lower case letters, digits, ``-`` or ``_``.
    """
    if not isinstance(prefix, str) or not _PREFIX.match(prefix):
        raise ParameterError(
            f"a residency prefix is lower case letters, digits, '-' or '_' (such as 'cuda'), "
            f"got {prefix!r}"
        )
    if prefix not in _RESIDENCIES:
        _RESIDENCIES.append(prefix)


def check_representation(name: str) -> str:
    """Return ``name`` if it is a known representation, else raise."""
    if name not in representation_names():
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
    runtime
        Name of the runtime that holds the payload (its ``put`` made the
        chunk; its ``release`` frees it).  ``"cpu"`` for host chunks.
    """

    representation: str
    residency: str
    scan_slice: tuple[tuple[int, int], tuple[int, int]]
    payload: Any
    storage_schema: str
    runtime: str = "cpu"

    def __post_init__(self) -> None:
        check_representation(self.representation)
        if not isinstance(self.residency, str) or self.residency.split(":", 1)[0] not in (
            RESIDENCIES
        ):
            raise ParameterError(
                f"unknown residency {self.residency!r}; expected host, cuda:<n>, mps, "
                f"external:<worker> or a prefix a registered runtime declares "
                f"({list(RESIDENCIES)})"
            )
        if not isinstance(self.runtime, str) or not self.runtime:
            raise ParameterError(
                f"Chunk.runtime must name the runtime holding the payload, got {self.runtime!r}"
            )

    @property
    def n_frames(self) -> int:
        """Scan positions in the chunk."""
        (r0, r1), (c0, c1) = self.scan_slice
        return (r1 - r0) * (c1 - c0)

    @property
    def nbytes(self) -> int:
        """Physical bytes of the payload where it is resident (what placement budgets count)."""
        payload = self.payload
        if isinstance(payload, np.ndarray):
            return int(payload.nbytes)
        return int(getattr(payload, "nbytes", 0))

    def __sizeof__(self) -> int:
        """The payload's bytes, so Dask's memory accounting is honest.

        ``dask.sizeof`` falls back to ``sys.getsizeof``, which calls this: no
        registration (and no import of Dask) is needed.  Device payloads are kept
        out of the spill buffer by the worker's data mapping
        (:mod:`quantem_flow.graphs.worker_data`), not by under-reporting their size.
        """
        return self.nbytes + 256


def chunk_of(
    representation: str,
    payload: Any,
    *,
    storage_schema: str | None = None,
    scan_slice: tuple[tuple[int, int], tuple[int, int]] | None = None,
) -> Chunk:
    """Wrap a host payload as a host :class:`Chunk` (for kernels run outside a dataset).

    Parameters
    ----------
    representation
        The payload's representation.
    payload
        A dense ``(rows, cols, k_r, k_c)`` array or a payload object with a
        ``scan_shape``.
    storage_schema
        Default: the representation's schema.
    scan_slice
        Default: ``((0, rows), (0, cols))``.

    Returns
    -------
    Chunk
        ``residency="host"``, ``runtime="cpu"``.
    """
    from .base import get_representation

    check_representation(representation)
    if scan_slice is None:
        if representation == "dense":
            shape = np.shape(payload)
            if len(shape) != 4:
                raise ParameterError(
                    f"a dense payload is (rows, cols, k_r, k_c), got shape {shape}"
                )
            rows, cols = int(shape[0]), int(shape[1])
        else:
            rows, cols = (int(v) for v in payload.scan_shape)
        scan_slice = ((0, rows), (0, cols))
    return Chunk(
        representation=representation,
        residency="host",
        scan_slice=scan_slice,
        payload=payload,
        storage_schema=storage_schema or get_representation(representation).schema,
    )
