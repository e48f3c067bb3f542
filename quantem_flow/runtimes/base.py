"""What every runtime adapter provides.

A runtime owns allocation, layout, compilation and synchronisation for one
device class.  It knows nothing of Dask: it receives arrays and returns
arrays.  Kernels are registered per (operation, representation).
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Any, ClassVar

import numpy as np

from ..errors import ParameterError

__all__ = ["FramePassResult", "Precision", "Runtime"]

#: Integer accumulations that are exact (``u32x2``: two 32-bit words with carry).
EXACT_INTEGER_ACCUMULATIONS = ("int64", "uint64", "u32x2")
REAL_ACCUMULATIONS = ("float64", "float32")


@dataclasses.dataclass(frozen=True)
class Precision:
    """How a runtime accumulates (the ``accumulation`` of the qf-worker/1 ``hello``).

    Attributes
    ----------
    integer
        Accumulator of integer data with integer weights and of integer
        pattern sums: ``"int64"``, ``"uint64"`` or ``"u32x2"`` (two 32-bit
        words with carry, for devices without 64-bit integers).  All three
        are exact; the conformance suite holds every runtime to exactness
        there.
    real
        Accumulator of real products and sums: ``"float64"`` or
        ``"float32"`` (devices without float64, such as WGSL); the
        conformance suite's tolerances follow it.
    """

    integer: str = "int64"
    real: str = "float64"

    def __post_init__(self) -> None:
        if self.integer not in EXACT_INTEGER_ACCUMULATIONS:
            raise ParameterError(
                f"Precision.integer must be one of {list(EXACT_INTEGER_ACCUMULATIONS)} (exact "
                f"integer sums are required), got {self.integer!r}"
            )
        if self.real not in REAL_ACCUMULATIONS:
            raise ParameterError(
                f"Precision.real must be one of {list(REAL_ACCUMULATIONS)}, got {self.real!r}"
            )

    def to_dict(self) -> dict[str, str]:
        """Return a JSON-ready dict (the protocol's ``accumulation``)."""
        return {"integer": self.integer, "real": self.real}


@dataclasses.dataclass
class FramePassResult:
    """What one fused pass over a block of frames returns (always on the host).

    Attributes
    ----------
    per_frame
        ``(n_frames, n_weights)`` float64: the dot product of every frame with
        every weight row.  Integer data with integer weights give exact
        integer values while partial sums stay below 2**53.
    pattern_sum
        ``(k_r * k_c,)`` sum over the frames (int64 for integer data, float64
        otherwise), or ``None`` when not requested.
    pattern_max
        ``(k_r * k_c,)`` maximum over the frames in the data's dtype, or
        ``None``.
    """

    per_frame: np.ndarray
    pattern_sum: np.ndarray | None
    pattern_max: np.ndarray | None


class Runtime(abc.ABC):
    """A device class that runs kernels on resident payloads."""

    name: ClassVar[str] = "abstract"

    @classmethod
    @abc.abstractmethod
    def available(cls) -> tuple[bool, str]:
        """Return whether the runtime can run here, and why not if it cannot."""

    @classmethod
    def auto_eligible(cls) -> tuple[bool, str]:
        """Return whether ``backend="auto"`` may choose this runtime, and why.

        The default is :meth:`available`.  A runtime that runs here but is
        not worth choosing automatically (MLX on its CPU backend is no
        accelerator) says no, with the reason; it still runs when requested
        explicitly.
        """
        return cls.available()

    @property
    def declaration(self) -> Any:
        """The :class:`~quantem_flow.runtimes.registry.RuntimeSpec` of this runtime (by name)."""
        from .registry import get_spec

        return get_spec(self.name)

    @property
    def kernels(self) -> frozenset[tuple[str, str, str]]:
        """The ``(operation, representation, dtype)`` triples declared for this runtime."""
        kernels: frozenset[tuple[str, str, str]] = self.declaration.kernels
        return kernels

    def supports(self, operation: str, representation: str, dtype: Any = None) -> bool:
        """Whether a kernel is declared for ``operation`` on ``representation`` (and ``dtype``)."""
        return bool(self.declaration.supports(operation, representation, dtype))

    def precision(self) -> Precision:
        """How this runtime accumulates (default: exact 64-bit integers, float64 reals)."""
        return Precision()

    @abc.abstractmethod
    def frame_pass(
        self,
        frames: np.ndarray,
        weights: np.ndarray,
        *,
        want_sum: bool,
        want_max: bool,
    ) -> FramePassResult:
        """Run the fused pass over a dense block of frames.

        Parameters
        ----------
        frames
            ``(n_frames, k_r * k_c)`` C-contiguous host array.
        weights
            ``(n_weights, k_r * k_c)`` float64 weight rows (may be 0 rows).
        want_sum, want_max
            Also accumulate the sum / maximum pattern over the frames.

        Returns
        -------
        FramePassResult
            Host arrays.
        """

    #: representation -> "module:function" of a payload kernel
    #: ``fn(payload, weights, *, want_sum, want_max) -> FramePassResult``.
    payload_kernels: ClassVar[dict[str, str]] = {}

    def run_frame_pass(
        self,
        representation: str,
        payload: Any,
        weights: np.ndarray,
        *,
        want_sum: bool,
        want_max: bool,
    ) -> FramePassResult:
        """Run the fused pass on one chunk's payload in its representation.

        Dense payloads ``(rows, cols, k_r, k_c)`` go to :meth:`frame_pass`;
        the others to the kernel registered in :attr:`payload_kernels`, which
        works on the payload directly (decoding block by block inside the
        pass at most, never the whole chunk).
        """
        if representation == "dense":
            arr = payload
            n = int(arr.shape[0]) * int(arr.shape[1])
            return self.frame_pass(
                arr.reshape(n, -1), weights, want_sum=want_sum, want_max=want_max
            )
        target = self.payload_kernels.get(representation)
        if target is None:
            from ..errors import UnsupportedOperationError

            raise UnsupportedOperationError(
                f"runtime {self.name!r} has no frame_pass kernel for the {representation!r} "
                f"representation; it has {sorted({'dense', *self.payload_kernels})}"
            )
        import importlib

        module, _, fn = target.partition(":")
        kernel = getattr(importlib.import_module(module), fn)
        result: FramePassResult = kernel(payload, weights, want_sum=want_sum, want_max=want_max)
        return result

    def run_gather(self, representation: str, payload: Any, indices: np.ndarray) -> np.ndarray:
        """Extract the values of flat detector pixels ``indices`` for every frame.

        Returns a host array ``(n_frames, len(indices))`` in the data's dtype.
        Dense payloads are indexed directly and paired payloads scatter their
        events; other representations are decoded one chunk at a time (the
        gathered pixels are the operator's output, not a dense copy kept).
        """
        idx = np.asarray(indices, dtype=np.int64)
        if representation == "dense":
            arr = np.asarray(self.to_host_array(payload))
            n = int(arr.shape[0]) * int(arr.shape[1])
            return np.ascontiguousarray(arr.reshape(n, -1)[:, idx])
        if representation == "paired":
            n = int(payload.indptr.shape[0]) - 1
            out = np.zeros((n, idx.size), dtype=payload.dtype)
            column = np.full(int(np.prod(payload.frame_shape)), -1, dtype=np.int64)
            column[idx] = np.arange(idx.size)
            frame_of = np.repeat(np.arange(n), np.diff(np.asarray(payload.indptr)))
            col = column[np.asarray(payload.indices, dtype=np.int64)]
            keep = col >= 0
            out[frame_of[keep], col[keep]] = np.asarray(payload.counts)[keep]
            return out
        from ..representations import get_representation

        dense = get_representation(representation).to_dense(payload)
        n = int(dense.shape[0]) * int(dense.shape[1])
        return np.ascontiguousarray(dense.reshape(n, -1)[:, idx])

    def to_host_array(self, array: Any) -> Any:
        """Return ``array`` as a host array (identity on host runtimes)."""
        to_host = getattr(self, "to_host", None)
        return to_host(array) if to_host is not None else array

    def describe(self) -> dict[str, Any]:
        """Return a JSON-ready description for provenance."""
        return {"runtime": self.name}
