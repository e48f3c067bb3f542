"""``libqfvulkan``'s C ABI called directly from Python with ctypes, as an in-process runtime.

The C ABI (android/include/qfvulkan.h) is usable without the wire protocol: an app on
Android links it directly. This adapter wraps it in the payload contract so the shared
conformance suite (quantem_flow.testing) runs the same cases on it as on every runtime.
"""

from __future__ import annotations

import ctypes
import itertools
import threading
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from quantem_flow.errors import ExternalWorkerError, RuntimeUnavailableError
from quantem_flow.runtimes.base import FramePassResult, Precision, Runtime

LIB = Path(__file__).resolve().parents[2] / "android" / "build" / "libqfvulkan.so"
DTYPES = {"uint8": 0, "uint16": 1, "uint32": 2, "float32": 3}
STATUS = ("ok", "bad_request", "unknown_handle", "budget", "unsupported", "device", "internal")
ACCUMULATION = ("int64", "u32x2", "float64", "float32")

u64, i64, vp = ctypes.c_uint64, ctypes.c_int64, ctypes.c_void_p


class Options(ctypes.Structure):
    _fields_ = (
        ("device_index", ctypes.c_int),
        ("device_name", ctypes.c_char_p),
        ("budget_bytes", u64),
        ("force_u32x2", ctypes.c_int),
        ("force_float32", ctypes.c_int),
        ("validation", ctypes.c_int),
    )


class Info(ctypes.Structure):
    _fields_ = (
        ("device_name", ctypes.c_char * 256),
        ("device_type", ctypes.c_char * 16),
        ("driver", ctypes.c_char * 128),
        ("api_version", ctypes.c_uint32),
        ("vendor_id", ctypes.c_uint32),
        ("device_id", ctypes.c_uint32),
        ("integer_accumulation", ctypes.c_int),
        ("real_accumulation", ctypes.c_int),
        ("memory_budget_bytes", u64),
        ("max_buffer_bytes", u64),
        ("max_message_bytes", u64),
        ("max_weights", u64),
        ("max_frame_pixels", u64),
        ("resident_bytes", u64 * 4),
        ("handles", u64),
        ("validation_messages", u64),
    )


class PassResult(ctypes.Structure):
    _fields_ = (
        ("per_frame", vp),
        ("pattern_sum", vp),
        ("pattern_max", vp),
        ("accumulation", ctypes.c_int),
    )


class CapiPayload:
    """A payload held by the library under ``handle``."""

    def __init__(self, handle: int, dtype: np.dtype[Any], n: int, k: int, nbytes: int) -> None:
        self.handle, self.dtype, self.n, self.k, self.nbytes = handle, dtype, n, k, nbytes


def _ptr(a: np.ndarray) -> Any:
    return a.ctypes.data_as(vp) if a.size else None


class VulkanCapiRuntime(Runtime):
    """The Vulkan kernels through ``libqfvulkan``'s C ABI, in this process."""

    name: ClassVar[str] = "vulkan-capi"
    force_u32x2: ClassVar[bool] = False

    def __init__(self) -> None:
        ok, why = self.available()
        if not ok:
            raise RuntimeUnavailableError(why)
        self.lib = ctypes.CDLL(str(LIB))
        self.lib.qfv_last_error.restype = ctypes.c_char_p
        self.lib.qfv_global_error.restype = ctypes.c_char_p
        opts = Options()
        self.lib.qfv_default_options(ctypes.byref(opts))
        opts.force_u32x2 = int(self.force_u32x2)
        opts.force_float32 = int(self.force_u32x2)
        self.session = vp()
        status = self.lib.qfv_session_create(ctypes.byref(opts), ctypes.byref(self.session))
        if status:
            raise RuntimeUnavailableError(self.lib.qfv_global_error().decode())
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    @classmethod
    def available(cls) -> tuple[bool, str]:
        """The library is built."""
        if not LIB.is_file():
            return False, f"{LIB} is not built (scripts/install-toolchains.sh)"
        return True, str(LIB)

    @property
    def residency(self) -> str:
        """``external:vulkan-capi`` (device buffers of the library)."""
        return f"external:{self.name}"

    def info(self) -> Info:
        out = Info()
        self._check(self.lib.qfv_session_info(self.session, ctypes.byref(out)), "info")
        return out

    def precision(self) -> Precision:
        info = self.info()
        return Precision(
            integer=ACCUMULATION[info.integer_accumulation],
            real=ACCUMULATION[info.real_accumulation],
        )

    def _check(self, status: int, what: str) -> None:
        if status:
            message = self.lib.qfv_last_error(self.session).decode()
            raise ExternalWorkerError(f"libqfvulkan {what}: {STATUS[status]}: {message}")

    # -- payloads ------------------------------------------------------------------------------
    def payload_dtype(self, representation: str, payload: Any) -> np.dtype[Any]:
        if isinstance(payload, CapiPayload):
            return payload.dtype
        return super().payload_dtype(representation, payload)

    def _put_payload(self, representation: str, payload: Any) -> Any:
        handle = next(self._ids)
        resident = u64()
        if representation == "dense":
            a = np.ascontiguousarray(payload)
            n = int(a.shape[0]) * int(a.shape[1])
            k = int(a.size // max(n, 1)) if n else int(np.prod(a.shape[2:]))
            dtype = np.dtype(a.dtype)
            status = self.lib.qfv_put_dense(
                self.session, i64(handle), DTYPES[dtype.name], u64(n), u64(k), _ptr(a),
                u64(a.nbytes), ctypes.byref(resident),
            )  # fmt: skip
        elif representation == "paired":
            p = payload
            n, k, dtype = p.n_frames, p.n_pixels, np.dtype(p.value_dtype)
            indptr = np.ascontiguousarray(p.indptr, dtype=np.int64)
            idx, cnt = np.ascontiguousarray(p.indices), np.ascontiguousarray(p.counts)
            status = self.lib.qfv_put_paired(
                self.session, i64(handle), DTYPES[dtype.name], u64(n), u64(k),
                _ptr(indptr), _ptr(idx), idx.itemsize, _ptr(cnt), cnt.itemsize,
                u64(idx.size), ctypes.byref(resident),
            )  # fmt: skip
        else:  # packed
            p = payload
            n, k, dtype = p.n_frames, p.frame_size, np.dtype(p.value_dtype)
            widths = np.ascontiguousarray(p.widths)
            offsets = np.ascontiguousarray(p.offsets, dtype=np.int64)
            data = np.ascontiguousarray(p.data, dtype=np.uint32)
            status = self.lib.qfv_put_packed(
                self.session, i64(handle), DTYPES[dtype.name], u64(n), u64(k),
                u64(p.block_values), _ptr(widths), _ptr(offsets), u64(widths.size), _ptr(data),
                u64(data.size), ctypes.byref(resident),
            )  # fmt: skip
        self._check(status, f"put {representation}")
        return CapiPayload(handle, dtype, n, k, int(resident.value))

    def _release_payload(self, representation: str, payload: Any) -> None:
        freed = ctypes.c_int()
        self._check(
            self.lib.qfv_release(self.session, i64(payload.handle), ctypes.byref(freed)), "release"
        )

    # -- kernels -------------------------------------------------------------------------------
    def frame_pass_kernels(self) -> dict[str, Any]:
        return dict.fromkeys(("dense", "paired", "packed"), self._pass)

    def gather_kernels(self) -> dict[str, Any]:
        return dict.fromkeys(("dense", "paired", "packed"), self._gather)

    def frame_pass(
        self, frames: np.ndarray, weights: np.ndarray, *, want_sum: bool, want_max: bool
    ) -> FramePassResult:
        payload = self._put_payload("dense", frames.reshape(1, *frames.shape))
        try:
            return self._pass(payload, weights, want_sum=want_sum, want_max=want_max)
        finally:
            self._release_payload("dense", payload)

    def _pass(
        self, payload: CapiPayload, weights: np.ndarray, *, want_sum: bool, want_max: bool
    ) -> FramePassResult:
        w = np.ascontiguousarray(weights, dtype=np.float64).reshape(-1, payload.k)
        m = int(w.shape[0])
        wh, resident, integer = next(self._ids), u64(), ctypes.c_int()
        with self._lock:
            self._check(
                self.lib.qfv_put_weights(
                    self.session, i64(wh), u64(m), u64(payload.k), _ptr(w),
                    ctypes.byref(resident), ctypes.byref(integer),
                ),
                "put_weights",
            )  # fmt: skip
            try:
                per_frame = np.zeros((payload.n, m), dtype=np.float64)
                real = payload.dtype.kind == "f"
                psum = np.zeros(payload.k, dtype=np.float64 if real else np.int64)
                pmax = np.zeros(payload.k, dtype=payload.dtype)
                res = PassResult(
                    _ptr(per_frame) if per_frame.size else None,
                    _ptr(psum) if want_sum else None,
                    _ptr(pmax) if want_max else None,
                    0,
                )
                self._check(
                    self.lib.qfv_frame_pass(
                        self.session, i64(payload.handle), i64(wh), ctypes.byref(res)
                    ),
                    "frame_pass",
                )
            finally:
                self.lib.qfv_release(self.session, i64(wh), ctypes.byref(ctypes.c_int()))
        return FramePassResult(per_frame, psum if want_sum else None, pmax if want_max else None)

    def _gather(self, payload: CapiPayload, indices: np.ndarray) -> np.ndarray:
        idx = np.ascontiguousarray(indices, dtype=np.int64)
        out = np.zeros((payload.n, idx.size), dtype=payload.dtype)
        self._check(
            self.lib.qfv_gather(
                self.session, i64(payload.handle), _ptr(idx), u64(idx.size), _ptr(out)
            ),
            "gather",
        )
        return out


class VulkanCapiTwoWordRuntime(VulkanCapiRuntime):
    """The C ABI with the two-word integer / float32 path forced."""

    name: ClassVar[str] = "vulkan-capi-u32x2"
    force_u32x2: ClassVar[bool] = True
