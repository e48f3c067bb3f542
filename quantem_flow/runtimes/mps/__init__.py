"""The ``mps`` runtime: MLX arrays, on the Metal GPU of Apple silicon or on MLX's CPU backend.

MLX also runs on Linux with its CPU backend (``pip install "mlx[cpu]"``).
There the runtime is *available* (``backend="mps"`` works and is what the
conformance suite tests on Linux) but it is not an accelerator, so
``backend="auto"`` does not choose it: :meth:`MpsRuntime.auto_eligible`
is true only when MLX's default device is a Metal GPU.

Precision: ``per_frame`` is always accumulated in float64.  The Metal GPU
has no float64, so float64 work runs on MLX's CPU stream, never silently in
float32; :meth:`MpsRuntime.describe` records the accumulation dtypes and
devices for provenance.

Payloads: ``put`` keeps every representation resident in MLX: a dense
block as one MLX array; paired, packed and encoded payloads as an
:class:`~quantem_flow.runtimes.mps.payloads.MlxPayload` whose large arrays
are MLX arrays (kernels in :mod:`quantem_flow.runtimes.mps.payloads`:
paired O(events) with MLX scatters, packed unpacked with MLX integer ops a
group of frames at a time, encoded decoded on the host by the codec library,
which MLX lacks, into a reusable MLX buffer; :meth:`MpsRuntime.describe`
records each path).

MLX evaluation is serialised per process by a lock: MLX's thread safety
across concurrently evaluating threads is recent (0.31.2 / 0.32) and not
guaranteed on every backend, and Dask runs tasks in threads.
"""

from __future__ import annotations

import functools
import sys
import threading
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Literal

import numpy as np

from ...errors import ParameterError, RuntimeUnavailableError, UnsupportedOperationError
from ..base import FramePassKernel, FramePassResult, GatherKernel, Runtime

__all__ = ["MpsRuntime"]

_LOCK = threading.Lock()


@functools.lru_cache(maxsize=1)
def _probe() -> tuple[bool, bool, str]:
    """Return ``(runs, on_metal_gpu, reason)``; never raises (cached per process)."""
    try:
        import mlx.core as mx
    except Exception as exc:  # ImportError, or OSError from a missing shared library
        return False, False, f"mlx.core does not import ({type(exc).__name__}: {exc})"
    try:
        version = str(getattr(mx, "__version__", "unknown"))
        device = mx.default_device()
        probe = mx.arange(4, dtype=mx.int32) + 1
        mx.eval(probe)
        if mx.sum(probe).tolist() != 10:
            return False, False, f"MLX {version} on {device} computed a wrong probe sum"
        metal = bool(mx.metal.is_available())
    except Exception as exc:
        return False, False, f"MLX does not allocate on its default device ({exc})"
    on_gpu = device.type == mx.DeviceType.gpu
    if on_gpu and metal:
        return True, True, f"MLX {version} on the Metal GPU ({device})"
    if on_gpu:
        return (
            True,
            False,
            f"MLX {version} on a non-Metal GPU backend ({device}); not the Apple GPU this "
            "runtime targets",
        )
    return (
        True,
        False,
        f"MLX {version} on its CPU backend ({device}; Metal unavailable): runs, "
        "but is not an accelerator",
    )


class MpsRuntime(Runtime):
    """MLX memory and kernels (Metal GPU on Apple silicon; MLX's CPU backend elsewhere).

    Parameters
    ----------
    path
        ``"mlx"`` (default): plain MLX operations, runs wherever MLX runs.
        ``"metal"``: additionally small ``mx.fast.metal_kernel`` s for the
        pattern sum/max of integer data and for unpacking ``packed``
        payloads; only on a machine with Metal, and never run in this
        project's own tests (no Metal device there).

    Raises
    ------
    ParameterError
        ``path`` is neither ``"mlx"`` nor ``"metal"``.
    UnsupportedOperationError
        ``path="metal"`` where MLX has no Metal device.
    """

    name: ClassVar[str] = "mps"

    def __init__(self, path: Literal["mlx", "metal"] = "mlx") -> None:
        if path not in ("mlx", "metal"):
            raise ParameterError(f"path must be 'mlx' or 'metal', got {path!r}")
        ok, on_metal, why = _probe()
        if not ok:
            raise RuntimeUnavailableError(f"runtime 'mps' is not available here ({why})")
        if path == "metal" and not on_metal:
            raise UnsupportedOperationError(
                f"MpsRuntime(path='metal') needs MLX on a Metal GPU; here: {why}. "
                "Use path='mlx' (the default)"
            )
        self.path: Literal["mlx", "metal"] = path

    @classmethod
    def available(cls) -> tuple[bool, str]:
        """Whether MLX imports and allocates on its default device (which one is in the reason)."""
        ok, _, why = _probe()
        return ok, why

    @classmethod
    def auto_excluded(cls) -> str | None:
        """Off macOS there is no Metal GPU: ``auto`` skips MLX without starting it.

        Starting MLX to find that out cost 0.21 s of a first compute on this
        project's Linux VM (its CPU backend initialising).
        """
        if sys.platform == "darwin":
            return None
        return (
            f"no Metal GPU off macOS ({sys.platform}): MLX here is at most its CPU backend or "
            "a non-Metal GPU, not an accelerator this runtime targets (not probed); request "
            "backend='mps' explicitly to use it"
        )

    @classmethod
    def auto_eligible(cls) -> tuple[bool, str]:
        """Only MLX on a Metal GPU is an accelerator worth choosing by ``backend="auto"``."""
        excluded = cls.auto_excluded()
        if excluded:
            return False, excluded
        ok, on_metal, why = _probe()
        if not ok:
            return False, why
        if not on_metal:
            return False, f"{why}; request backend='mps' explicitly to use it"
        return True, why

    @property
    def device(self) -> str:
        """MLX's default device type here: ``"gpu"`` or ``"cpu"``."""
        import mlx.core as mx

        return "gpu" if mx.default_device().type == mx.DeviceType.gpu else "cpu"

    def frame_pass(
        self,
        frames: np.ndarray | Any,
        weights: np.ndarray,
        *,
        want_sum: bool,
        want_max: bool,
    ) -> FramePassResult:
        """Run the fused pass with MLX (float64 accumulation on every device).

        Parameters
        ----------
        frames
            ``(n_frames, k_r * k_c)`` host array of integers or reals, or an
            MLX array already resident (see :meth:`to_device`).
        weights
            ``(n_weights, k_r * k_c)`` weight rows (float64).
        want_sum, want_max
            Also accumulate the sum / maximum pattern.

        Returns
        -------
        FramePassResult
            NumPy host arrays.
        """
        from .kernels import frame_pass_mlx

        with _LOCK:
            per_frame, s, m = frame_pass_mlx(
                frames, weights, want_sum=want_sum, want_max=want_max, path=self.path
            )
        return FramePassResult(per_frame=per_frame, pattern_sum=s, pattern_max=m)

    # -- the payload contract ------------------------------------------------------------
    def frame_pass_kernels(self) -> Mapping[str, FramePassKernel]:
        """Every representation, on payloads resident in MLX (see :mod:`.payloads`)."""
        from . import payloads as pl

        def packed(
            payload: Any, weights: np.ndarray, *, want_sum: bool, want_max: bool
        ) -> FramePassResult:
            return pl.frame_pass_packed_mlx(
                payload, weights, want_sum=want_sum, want_max=want_max, path=self._packed_path()
            )

        return {
            "dense": self._dense_pass,
            "paired": self._locked(pl.frame_pass_paired_mlx),
            "packed": self._locked(packed),
            "encoded": self._locked(pl.frame_pass_encoded_mlx),
        }

    def gather_kernels(self) -> Mapping[str, GatherKernel]:
        """Every representation: pixels taken in MLX, copied to the host."""
        from . import payloads as pl

        def packed(payload: Any, indices: np.ndarray) -> np.ndarray:
            return pl.gather_packed_mlx(payload, indices, path=self._packed_path())

        return {
            "dense": self._dense_gather,
            "paired": self._locked(pl.gather_paired_mlx),
            "packed": self._locked(packed),
            "encoded": self._locked(pl.gather_encoded_mlx),
        }

    def _packed_path(self) -> Literal["mlx", "metal"]:
        """The Metal unpacking kernel only where Metal answers and ``path="metal"`` asked."""
        from .kernels import metal_available

        return "metal" if self.path == "metal" and metal_available() else "mlx"

    @staticmethod
    def _locked(kernel: Callable[..., Any]) -> Callable[..., Any]:
        """``kernel`` run under the process's MLX lock (see the module docstring)."""

        @functools.wraps(kernel)
        def run(*args: Any, **kwargs: Any) -> Any:
            with _LOCK:
                return kernel(*args, **kwargs)

        return run

    def payload_dtype(self, representation: str, payload: Any) -> np.dtype[Any]:
        """The NumPy dtype equal to the MLX array's (a host payload's, byte order native)."""
        if not (type(payload).__module__ or "").startswith("mlx"):
            return super().payload_dtype(representation, payload)  # a host or MlxPayload
        from .kernels import numpy_dtype

        return np.dtype(numpy_dtype(payload.dtype))

    def _put_payload(self, representation: str, payload: Any) -> Any:
        """Copy a host payload into MLX memory, dtypes kept exactly.

        A dense block becomes one MLX array; a paired, packed or encoded
        payload an :class:`~quantem_flow.runtimes.mps.payloads.MlxPayload`
        whose large arrays are MLX arrays (a persisted chunk is copied once).
        """
        if representation == "dense":
            return self.to_device(payload)
        from .payloads import MlxPayload

        with _LOCK:
            return MlxPayload.upload(representation, payload)

    def _release_payload(self, representation: str, payload: Any) -> None:
        """Drop the MLX arrays; MLX returns their memory to its buffer cache."""
        free = getattr(payload, "free", None)
        if callable(free):
            free()

    def _dense_pass(
        self, payload: Any, weights: np.ndarray, *, want_sum: bool, want_max: bool
    ) -> FramePassResult:
        from .kernels import frame_pass_mlx

        shape = tuple(int(v) for v in payload.shape)
        with _LOCK:
            frames = payload.reshape(shape[0] * shape[1], shape[2] * shape[3])
            per_frame, s, m = frame_pass_mlx(
                frames, weights, want_sum=want_sum, want_max=want_max, path=self.path
            )
        return FramePassResult(per_frame=per_frame, pattern_sum=s, pattern_max=m)

    def _dense_gather(self, payload: Any, indices: np.ndarray) -> np.ndarray:
        import mlx.core as mx

        from .kernels import to_host

        shape = tuple(int(v) for v in payload.shape)
        idx = np.asarray(indices, dtype=np.int64)
        if idx.size and (idx.min() < 0 or idx.max() >= shape[2] * shape[3]):
            raise ParameterError(
                f"gather indices must lie in [0, {shape[2] * shape[3]}) (flat detector pixels), "
                f"got {int(idx.min())} .. {int(idx.max())}"
            )
        with _LOCK:
            flat = payload.reshape(shape[0] * shape[1], shape[2] * shape[3])
            taken = mx.take(flat, mx.array(idx.astype(np.int32)), axis=1)
            return np.ascontiguousarray(to_host(taken))

    def to_device(self, array: np.ndarray | Any) -> Any:
        """Copy a host array into MLX memory (residency ``"mps"``), dtype kept exactly."""
        from .kernels import to_device

        with _LOCK:
            return to_device(array)

    def to_host(self, array: Any) -> np.ndarray:
        """Copy an MLX array into a new NumPy array of the equal dtype."""
        from .kernels import to_host

        with _LOCK:
            return to_host(array)

    def describe(self) -> dict[str, Any]:
        """Runtime, MLX version, device, kernel path and the precision actually used."""
        import mlx.core as mx

        from .kernels import precision_record
        from .payloads import payload_paths

        _, on_metal, why = _probe()
        device = self.device
        out: dict[str, Any] = {
            "runtime": self.name,
            "mlx_version": str(getattr(mx, "__version__", "unknown")),
            "device": device,
            "backend": "metal" if on_metal else ("cpu" if device == "cpu" else "other gpu"),
            "available": why,
            "path": self.path,
            **precision_record(device),
            "payload_paths": payload_paths(self._packed_path()),
            "host_decode": {
                "encoded": "pieces are decoded on the host by the codec library (MLX has no "
                "LZ4/Zstandard/Blosc codec) into a reusable MLX buffer; the compressed bytes "
                "stay resident in MLX"
            },
        }
        if self.path == "metal":
            out["metal_kernel"] = (
                "pattern sum/max of integer data (<= 32 bits) and packed bit unpacking on the "
                "GPU; per_frame and float data on the plain-MLX path"
                if self._packed_path() == "metal"
                else "asked for, but Metal does not answer: the plain-MLX path ran"
            )
        return out
