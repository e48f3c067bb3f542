"""The representation protocol: payload layouts, conversions and their registry.

A *payload* is what one chunk holds: for ``dense`` a NumPy array
``(rows, cols, k_r, k_c)``; for the others a small object of the
representation's own (CSR-like pairs, bit-packed blocks, compressed
bytes).  Every payload object implements :class:`Payload`.  A
:class:`Representation` knows how to make its payload from a dense block
(exactly), how to give the dense block back (for exactness checks and for
explicit conversions only; kernels never densify a whole chunk), and how to
apply detector regions and binning when it can do so natively.

The built-in representations are rows of :data:`REGISTRY` ("module:Class",
imported on first use); installed distributions add theirs through the
entry-point group :data:`ENTRY_POINT_GROUP`, the same form
(:data:`REPRESENTATION_REGISTRY`, a :class:`~quantem_flow.plugins.Registry`).
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from typing import Any, ClassVar, Protocol, runtime_checkable

import numpy as np

from ..errors import ConversionError, ParameterError
from ..plugins import Registry

__all__ = [
    "ENTRY_POINT_GROUP",
    "REGISTRY",
    "REPRESENTATION_REGISTRY",
    "Payload",
    "Representation",
    "get_representation",
    "payload_nbytes",
    "representation_names",
]


@runtime_checkable
class Payload(Protocol):
    """What every non-dense payload provides.

    Attributes
    ----------
    scan_shape
        ``(rows, cols)`` of scan positions in the payload.
    frame_shape
        ``(k_r, k_c)`` of one (decoded) frame.
    dtype
        Dtype of the decoded values.
    nbytes
        Physical bytes held (what residency costs).
    """

    scan_shape: tuple[int, int]
    frame_shape: tuple[int, int]

    @property
    def dtype(self) -> np.dtype[Any]:
        """Dtype of the decoded values."""
        ...

    @property
    def nbytes(self) -> int:
        """Physical bytes held."""
        ...


class Representation(abc.ABC):
    """A payload layout with exact conversions from and to dense."""

    #: ``"dense"``, ``"encoded"``, ``"paired"`` or ``"packed"``.
    name: ClassVar[str] = "abstract"
    #: Versioned layout name recorded in provenance, e.g. ``"paired-csr-v1"``.
    schema: ClassVar[str] = "abstract-v0"
    #: Whether :meth:`apply_detector_ops` works without decoding.
    native_detector_ops: ClassVar[bool] = False

    @abc.abstractmethod
    def from_dense(self, block: np.ndarray, **options: Any) -> Any:
        """Make the payload of a dense ``(rows, cols, k_r, k_c)`` block, exactly.

        Raises
        ------
        ParameterError
            If the data cannot be held exactly (admission); the message says
            what does not fit.
        """

    @abc.abstractmethod
    def to_dense(self, payload: Any) -> np.ndarray:
        """Return the dense ``(rows, cols, k_r, k_c)`` block (explicit conversion only)."""

    def apply_detector_ops(self, payload: Any, ops: tuple[Any, ...]) -> Any:
        """Apply detector crops and binning natively; representations that cannot raise."""
        if ops:
            raise ParameterError(
                f"the {self.name} representation cannot crop or bin without decoding; "
                "apply the transforms before converting"
            )
        return payload

    def gather(self, payload: Any, indices: np.ndarray) -> np.ndarray:
        """Pixels ``indices`` (flat detector indices) of every frame: ``(frames, len(indices))``.

        The default decodes the payload (one chunk; the gathered pixels are
        the operator's output, not a dense copy kept); a representation that
        can pick pixels without decoding overrides it.
        """
        dense = np.asarray(self.to_dense(payload))
        n, k = dense_frames(dense)
        return np.ascontiguousarray(dense.reshape(n, k)[:, np.asarray(indices, dtype=np.int64)])

    def check(self, dense: np.ndarray, payload: Any, *, full: bool = True) -> dict[str, Any]:
        """Check a conversion is exact and return what was checked (for provenance).

        ``full=True`` compares every value; ``full=False`` compares the total
        and the number of non-zero values only.
        """
        back = self.to_dense(payload)
        if full:
            if back.shape != dense.shape or not np.array_equal(back, dense, equal_nan=True):
                diff = int(np.count_nonzero(back != dense)) if back.shape == dense.shape else -1
                raise ConversionError(
                    f"{self.name} conversion is not exact: {diff} of {dense.size} values differ "
                    f"(shape {back.shape} vs {dense.shape})"
                )
            return {"check": "full", "values": int(dense.size)}
        total_a = dense.sum(dtype=np.float64)
        total_b = back.sum(dtype=np.float64)
        nz_a, nz_b = int(np.count_nonzero(dense)), int(np.count_nonzero(back))
        if total_a != total_b or nz_a != nz_b:
            raise ConversionError(
                f"{self.name} conversion is not exact: totals {total_a} vs {total_b}, non-zero "
                f"values {nz_a} vs {nz_b}"
            )
        return {"check": "totals", "total": total_a, "nonzero": nz_a}


#: The built-in representations: name -> "module:Class", imported on first use.
REGISTRY: dict[str, str] = {
    "dense": "quantem_flow.representations.dense:Dense",
    "paired": "quantem_flow.representations.paired:Paired",
    "packed": "quantem_flow.representations.packed:Packed",
    "encoded": "quantem_flow.representations.encoded:Encoded",
}

#: The entry-point group third-party representations join.
ENTRY_POINT_GROUP = "quantem_flow.representations"


def _instance(name: str, obj: Any) -> Representation:
    """A representation from a loaded row: a :class:`Representation` subclass named ``name``."""
    if not (isinstance(obj, type) and issubclass(obj, Representation)):
        raise TypeError(f"{obj!r} is not a Representation subclass")
    if obj.name != name:
        raise TypeError(
            f"its class declares name={obj.name!r}, not the row's name {name!r}; the two must "
            "agree (the name is what chunks and provenance record)"
        )
    return obj()


#: Every representation: the built-ins, the installed distributions' (entry points of
#: :data:`ENTRY_POINT_GROUP`) and those registered in process (:mod:`quantem_flow.plugins`).
REPRESENTATION_REGISTRY: Registry[Representation] = Registry(
    "representation", ENTRY_POINT_GROUP, REGISTRY, _instance
)


def get_representation(name: str) -> Representation:
    """Return the representation called ``name``."""
    return REPRESENTATION_REGISTRY.get(name)


def representation_names() -> list[str]:
    """The names of every representation: built-ins first, then plug-ins and registered ones."""
    return REPRESENTATION_REGISTRY.names()


def payload_nbytes(payload: Any) -> int:
    """Physical bytes of a payload (dense array or payload object)."""
    return int(getattr(payload, "nbytes", 0))


def describe_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """JSON-ready copy of representation options, for provenance."""
    return {
        str(k): (v if isinstance(v, (str, int, float, bool, type(None))) else repr(v))
        for k, v in options.items()
    }


def dense_frames(payload: Any) -> tuple[int, int]:
    """``(n_frames, n_pixels)`` of a dense ``(rows, cols, k_r, k_c)`` payload."""
    shape = tuple(int(v) for v in payload.shape)
    if len(shape) != 4:
        raise ParameterError(
            f"a dense payload is (rows, cols, k_r, k_c), got an array of shape {shape}"
        )
    return shape[0] * shape[1], shape[2] * shape[3]


def gather_columns(frames: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """``frames[:, idx]`` (a new C-contiguous array), copying runs of consecutive indices.

    A bright-field disk is a few dozen runs of consecutive detector pixels;
    copying each run as a slice is 20x faster than fancy indexing on a
    128 MiB chunk (benchmarks/RESULTS.md, "SSB end to end (issue 14)").
    Indices in any other order go through ``np.take``.  Same values either way.
    """
    if idx.size == 0 or np.any(np.diff(idx) <= 0):
        return np.take(frames, idx, axis=1)
    breaks = np.flatnonzero(np.diff(idx) != 1) + 1
    starts = np.concatenate(([0], breaks))
    stops = np.concatenate((breaks, [idx.size]))
    if starts.size * 4 > idx.size:  # short runs: one take is cheaper than many slices
        return np.take(frames, idx, axis=1)
    out = np.empty((frames.shape[0], idx.size), dtype=frames.dtype)
    for s, e in zip(starts.tolist(), stops.tolist(), strict=True):
        out[:, s:e] = frames[:, int(idx[s]) : int(idx[e - 1]) + 1]
    return out
