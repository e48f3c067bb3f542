"""The CUDA runtime: CuPy arrays, raw kernels compiled by NVRTC, cuBLAS for many masks.

Kernels (``kernels/*.cu``; CI compiles each with ``nvcc -arch=sm_90 -cubin``):

``frame_pass.cu``
    The fused dense pass: one read of every frame gives the per-frame dot
    products with up to 16 weight rows (BF, ADF, CoM...), and the sum and
    maximum patterns.  More than 16 rows (stacked masks) go to cuBLAS
    (``cupy.matmul`` in float64 on tiles of frames) and the patterns to the
    raw kernel with no weights.
``paired.cu``
    The same outputs on electron-counted pairs, O(events), one warp per frame.
``packed.cu``
    Unpacks per-block bit widths on the device, one thread per value, a
    group of frames at a time into a reusable buffer the fused pass reads.
``bslz4.cu``
    Decodes bitshuffle+LZ4 pieces (Dectris chunks) on the device: LZ4 blocks
    one thread each, then bit-unshuffling one thread per byte.

``put`` keeps a chunk on the device: a dense block as one CuPy array, a
paired, packed or encoded payload as a
:class:`~quantem_flow.runtimes.cuda.resident.DevicePayload` whose large
arrays are CuPy arrays (the kernels take them without a second upload);
``release`` drops them.  Host data reach the device through a pinned
staging buffer and a non-blocking stream per thread, so a worker thread can upload and compute
one chunk while another decodes the next.  Every sum is float64 or 64-bit
integer; nothing is computed in lower precision.  On real data a zero
weight skips its pixel (``qf_term`` in ``common.cuh``; after cuBLAS, the
non-finite outputs are recomputed on the host over nonzero weights), so a
NaN or infinite pixel outside a weight row's support leaves it finite.
Without a GPU that
answers, :meth:`CudaRuntime.available` says why and nothing else runs.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from ...errors import DtypeError, UnsupportedOperationError
from ..base import FramePassKernel, FramePassResult, GatherKernel, Runtime, host_gather
from ..nonfinite import repair_per_frame

__all__ = ["KERNEL_DIR", "MAX_RAW_WEIGHTS", "CudaRuntime", "kernel_sources"]

KERNEL_DIR = Path(__file__).parent / "kernels"
#: Weight rows the raw fused kernel takes; more go through cuBLAS.
MAX_RAW_WEIGHTS = 16
FRAMES_PER_BLOCK = 32
THREADS = 256
PIX_PER_THREAD = 4

_DENSE_ENTRY = {
    np.dtype(np.uint8): "qf_frame_pass_u8",
    np.dtype(np.uint16): "qf_frame_pass_u16",
    np.dtype(np.uint32): "qf_frame_pass_u32",
    np.dtype(np.int16): "qf_frame_pass_i16",
    np.dtype(np.int32): "qf_frame_pass_i32",
    np.dtype(np.float32): "qf_frame_pass_f32",
    np.dtype(np.float64): "qf_frame_pass_f64",
}
#: exact host-side widening for dtypes the kernels do not take
_WIDEN = {np.dtype(np.int8): np.dtype(np.int16), np.dtype(np.float16): np.dtype(np.float32)}


def kernel_sources() -> dict[str, str]:
    """Return ``{file name: CUDA source}`` with ``common.cuh`` inlined (for NVRTC)."""
    common = (KERNEL_DIR / "common.cuh").read_text()
    out = {}
    for path in sorted(KERNEL_DIR.glob("*.cu")):
        out[path.name] = path.read_text().replace('#include "common.cuh"', common)
    return out


@cache
def _module(name: str) -> Any:
    import cupy

    return cupy.RawModule(code=kernel_sources()[name], options=("-std=c++17",))


#: Why CuPy is not importable, once an import failed in this process.
_NO_CUPY: list[str] = []


class CudaRuntime(Runtime):
    """CUDA devices through CuPy; one worker process per GPU (``CUDA_VISIBLE_DEVICES``)."""

    name: ClassVar[str] = "cuda"

    def __init__(self) -> None:
        self._local = threading.local()

    # -- availability ------------------------------------------------------------------
    @classmethod
    def available(cls) -> tuple[bool, str]:
        """A device must answer: CuPy imports, counts a device and allocates on it.

        A failed import of CuPy is remembered for the process (asked twice per
        pass by ``backend="auto"``, each failed import searched the whole path
        again: ~0.4 ms); a module put in ``sys.modules`` later is still seen.
        """
        if _NO_CUPY and "cupy" not in sys.modules:
            return False, _NO_CUPY[0]
        try:
            import cupy
        except ImportError as exc:
            _NO_CUPY[:] = [f"CuPy is not installed ({exc})"]
            return False, _NO_CUPY[0]
        try:
            n = int(cupy.cuda.runtime.getDeviceCount())
            if n < 1:
                return False, "CuPy sees no CUDA device"
            probe = cupy.zeros(1, dtype=cupy.float64)
            probe += 1
            cupy.cuda.Device().synchronize()
            props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
            name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
        except Exception as exc:  # any CUDA failure means: not available here
            return False, f"no CUDA device answers ({type(exc).__name__}: {exc})"
        return True, f"{name} (compute capability {props['major']}.{props['minor']}), {n} visible"

    @property
    def residency(self) -> str:
        """``cuda:<device id>`` of the current device."""
        import cupy

        return f"cuda:{cupy.cuda.Device().id}"

    # -- transfers ---------------------------------------------------------------------
    def _stream(self) -> Any:
        import cupy

        stream = getattr(self._local, "stream", None)
        if stream is None:
            stream = cupy.cuda.Stream(non_blocking=True)
            self._local.stream = stream
        return stream

    def _pinned(self, nbytes: int) -> np.ndarray:
        import cupy

        buf = getattr(self._local, "pinned", None)
        if buf is None or buf.nbytes < nbytes:
            mem = cupy.cuda.alloc_pinned_memory(nbytes)
            buf = np.frombuffer(mem, dtype=np.uint8, count=nbytes)
            self._local.pinned = buf
        return buf[:nbytes]

    def to_device(self, array: Any) -> Any:
        """Upload a host array through pinned staging on this thread's stream."""
        import cupy

        if isinstance(array, cupy.ndarray):
            return array
        host = np.ascontiguousarray(array)
        if not host.dtype.isnative:  # CuPy holds native byte order only; the values are kept
            host = host.astype(host.dtype.newbyteorder("="))
        if host.size == 0:
            return cupy.empty(host.shape, dtype=host.dtype)
        staging = self._pinned(host.nbytes).view(host.dtype).reshape(host.shape)
        np.copyto(staging, host)
        stream = self._stream()
        out = cupy.empty(host.shape, dtype=host.dtype)
        out.set(staging, stream=stream)
        stream.synchronize()  # the staging buffer is reused by the next upload
        return out

    def to_host(self, array: Any) -> np.ndarray:
        """Copy a device array back to host memory."""
        import cupy

        if isinstance(array, cupy.ndarray):
            return np.asarray(cupy.asnumpy(array))
        return np.asarray(array)

    # -- the payload contract ---------------------------------------------------------------
    def _put_payload(self, representation: str, payload: Any) -> Any:
        """Upload a host payload: dense blocks through pinned staging, the others' arrays.

        Paired, packed and encoded payloads become a
        :class:`~quantem_flow.runtimes.cuda.resident.DevicePayload` whose
        large arrays are on the device (see that module); the kernels read
        them there, so a persisted chunk is uploaded once.
        """
        import cupy

        if representation == "dense":
            return self.to_device(payload)
        from .resident import DevicePayload

        if representation == "encoded" and payload.codec != "bitshuffle-lz4":
            raise UnsupportedOperationError(
                f"the CUDA runtime decodes bitshuffle-lz4 pieces on the device; this payload is "
                f"{payload.codec!r}. Use backend='cpu' or convert with codec='bitshuffle-lz4'"
            )
        return DevicePayload.upload(
            representation, payload, self.to_device, device=int(cupy.cuda.Device().id)
        )

    def _release_payload(self, representation: str, payload: Any) -> None:
        """Drop the device arrays; their memory returns to CuPy's pool for the next chunk."""
        free = getattr(payload, "free", None)
        if callable(free):
            free()

    def frame_pass_kernels(self) -> Mapping[str, FramePassKernel]:
        """Dense (fused raw kernel), paired (``paired.cu``), packed, encoded (group decoding)."""
        from .bslz4 import frame_pass_encoded_cuda
        from .grouped import frame_pass_packed_cuda
        from .paired import frame_pass_paired_cuda

        return {
            "dense": self._dense_frame_pass,
            "paired": frame_pass_paired_cuda,
            "packed": frame_pass_packed_cuda,
            "encoded": frame_pass_encoded_cuda,
        }

    def gather_kernels(self) -> Mapping[str, GatherKernel]:
        """Dense: pixels taken on the device.  Others: the payload copied back, then gathered."""

        def dense(payload: Any, indices: np.ndarray) -> np.ndarray:
            import cupy

            rows, cols, kr, kc = (int(v) for v in payload.shape)
            flat = payload.reshape(rows * cols, kr * kc)
            return np.ascontiguousarray(self.to_host(flat[:, cupy.asarray(indices)]))

        def other(rep: str) -> GatherKernel:
            def gather(payload: Any, indices: np.ndarray) -> np.ndarray:
                host = payload.to_host(self.to_host) if hasattr(payload, "to_host") else payload
                return host_gather(rep, host, indices)

            return gather

        return {"dense": dense, **{rep: other(rep) for rep in ("paired", "packed", "encoded")}}

    # -- kernels -------------------------------------------------------------------------
    def frame_pass(
        self, frames: Any, weights: np.ndarray, *, want_sum: bool, want_max: bool
    ) -> FramePassResult:
        """Fused dense pass on the device; see the module docstring."""
        import cupy

        d_frames = self.to_device(frames)
        dtype = np.dtype(d_frames.dtype)
        if dtype in _WIDEN:
            d_frames = d_frames.astype(_WIDEN[dtype])
            dtype = _WIDEN[dtype]
        entry = _DENSE_ENTRY.get(dtype)
        if entry is None:
            raise DtypeError(
                f"the CUDA frame pass takes u8/u16/u32/i8/i16/i32/f16/f32/f64 frames, got "
                f"{dtype}; 64-bit integer counts would lose exactness in float64 sums"
            )
        n, k = (int(s) for s in d_frames.shape)
        w = np.ascontiguousarray(weights, dtype=np.float64).reshape(-1, k)
        m = int(w.shape[0])
        integer = dtype.kind in "ui"
        raw_m = m if m <= MAX_RAW_WEIGHTS else 0
        per_frame = cupy.zeros((n, m), dtype=cupy.float64)
        psum = cupy.zeros(k, dtype=cupy.uint64 if integer else cupy.float64)
        pmax = cupy.full(k, -np.inf, dtype=cupy.float64)
        d_w = cupy.asarray(w if raw_m else np.zeros((1, 1)), dtype=cupy.float64)
        stream = self._stream()
        if n and k and (raw_m or want_sum or want_max):
            grid = (
                (n + FRAMES_PER_BLOCK - 1) // FRAMES_PER_BLOCK,
                (k + THREADS * PIX_PER_THREAD - 1) // (THREADS * PIX_PER_THREAD),
            )
            kernel = _module("frame_pass.cu").get_function(entry)
            kernel(
                grid,
                (THREADS,),
                (
                    d_frames,
                    np.int64(n),
                    np.int64(k),
                    d_w,
                    np.int32(raw_m),
                    per_frame,
                    psum,
                    pmax,
                    np.int32(want_sum),
                    np.int32(want_max),
                ),
                stream=stream,
            )
        if n and m > MAX_RAW_WEIGHTS:  # stacked masks: cuBLAS DGEMM on tiles of frames
            d_all = cupy.asarray(w, dtype=cupy.float64)
            tile = max(1, (256 * 2**20) // max(k * 8, 1))
            with stream:
                for i in range(0, n, tile):
                    block = d_frames[i : i + tile].astype(cupy.float64)
                    per_frame[i : i + tile] = block @ d_all.T
        stream.synchronize()
        host_per_frame = self.to_host(per_frame)
        if n and m > MAX_RAW_WEIGHTS and not integer:  # cuBLAS: 0 * NaN, repaired on the host
            host_per_frame = repair_per_frame(
                host_per_frame, w, lambda rows: self.to_host(d_frames[cupy.asarray(rows)])
            )
        out_sum = None
        if want_sum:
            host_sum = self.to_host(psum)
            out_sum = host_sum.view(np.int64) if integer else host_sum
        out_max = None
        if want_max:
            if n == 0:
                low = np.iinfo(dtype).min if integer else -np.inf
                out_max = np.full(k, low, dtype=dtype)
            else:
                out_max = self.to_host(pmax).astype(dtype)
        return FramePassResult(host_per_frame, out_sum, out_max)

    def describe(self) -> dict[str, Any]:
        """Device, libraries and precision, for provenance."""
        import cupy

        props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
        name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
        return {
            "runtime": self.name,
            "device": f"{name} (cuda:{cupy.cuda.Device().id})",
            "compute_capability": f"{props['major']}.{props['minor']}",
            "cupy": cupy.__version__,
            "kernel": "raw fused frame pass (<= 16 weight rows), cuBLAS float64 beyond",
            "per_frame_accumulation": "float64 (atomic adds in any order)",
            "sum_accumulation": "uint64 two's complement for integer data, float64 otherwise",
        }


def unsupported(representation: str) -> UnsupportedOperationError:
    """The error for a representation the CUDA runtime has no kernel for yet."""
    return UnsupportedOperationError(
        f"the CUDA runtime has no kernel for the {representation!r} representation yet; "
        "use backend='cpu' for it or convert to 'dense' or 'paired'"
    )
