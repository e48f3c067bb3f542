"""The declaration of the ``cuda`` runtime (imports no CuPy; the probe does, when called)."""

from __future__ import annotations

from typing import Any

from ..dtypes import ALL_NUMERIC, triples
from ..registry import ProbeResult, RuntimeSpec

__all__ = ["KERNELS", "SPEC", "probe"]

#: The dense kernel's entries (u8/u16/u32/i16/i32/f32/f64) plus int8 and
#: float16, widened exactly on the device; no 64-bit integers (their float64
#: sums would not be exact).
DENSE = ("uint8", "uint16", "uint32", "int8", "int16", "int32", "float16", "float32", "float64")
#: ``paired.cu`` sums into uint64 returned as int64 and keeps maxima in uint32:
#: integer values of at most 32 bits.
PAIRED = ("uint8", "uint16", "uint32", "int8", "int16", "int32")
#: ``packed.cu`` writes u8/u16/u32/i16/i32 frames.
PACKED = ("uint8", "uint16", "uint32", "int16", "int32")
#: ``bslz4.cu`` decodes into the dtype, then the dense kernel runs.
ENCODED = DENSE

KERNELS = frozenset(
    triples("frame_pass", "dense", DENSE)
    | triples("frame_pass", "paired", PAIRED)
    | triples("frame_pass", "packed", PACKED)
    | triples("frame_pass", "encoded", ENCODED)
    | triples("gather", "dense", DENSE)
    | triples("gather", "paired", PAIRED)
    | triples("gather", "packed", PACKED)
    | triples("gather", "encoded", ENCODED)
    | triples("ssb", "gathered", ALL_NUMERIC)
)


def probe(*, nthreads: int, memory_limit: int, budget_fraction: float) -> ProbeResult:
    """A device must answer; one slot; a share of the device's free memory as budget."""
    from . import CudaRuntime

    ok, why = CudaRuntime.available()
    if not ok:
        return ProbeResult(False, why)
    import cupy  # pragma: no cover - needs a CUDA machine

    try:  # pragma: no cover - needs a CUDA machine
        device = cupy.cuda.Device()
        free, total = cupy.cuda.runtime.memGetInfo()
        props = cupy.cuda.runtime.getDeviceProperties(device.id)
        name = props.get("name", b"")
        details: dict[str, Any] = {
            "device": name.decode() if isinstance(name, bytes) else str(name),
            "device_id": int(device.id),
            "total_bytes": int(total),
            "free_bytes": int(free),
            "cupy": cupy.__version__,
        }
    except Exception as exc:  # pragma: no cover - needs a CUDA machine
        return ProbeResult(
            False,
            f"CUDA answered ({why}) but querying its memory failed ({type(exc).__name__}: "
            f"{exc}); check CUDA_VISIBLE_DEVICES and the driver",
        )
    return ProbeResult(True, why, 1.0, int(budget_fraction * free), details)  # pragma: no cover


SPEC = RuntimeSpec(
    name="cuda",
    factory="quantem_flow.runtimes.cuda:CudaRuntime",
    dependency="cupy",
    kernels=KERNELS,
    auto_rank=10,
    probe="quantem_flow.runtimes.cuda.spec:probe",
    array_ops="quantem_flow.runtimes.cuda.array_ops:CupyOps",
    array_ops_precision="complex128",
    residency="cuda",
    description="CUDA devices through CuPy: raw kernels (NVRTC), cuBLAS, cuFFT",
)
