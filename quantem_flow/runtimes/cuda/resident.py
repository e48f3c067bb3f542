"""Non-dense payloads resident on a CUDA device (what :meth:`CudaRuntime.put` makes of them).

A :class:`DevicePayload` holds the large arrays of a paired, packed or
encoded payload in device memory and its small fields (shapes, dtypes,
codec, runs, detector ops) on the host.  It reads like the host payload it
came from (``payload.indices``, ``payload.value_dtype``...), so the CUDA
kernels take either: ``cupy.asarray`` of an array already on the device is
the array itself, never a second upload.

What moves to the device (:data:`DEVICE_FIELDS`):

- ``paired``: ``indptr``, ``indices``, ``counts``;
- ``packed``: ``widths``, ``offsets``, ``data``;
- ``encoded``: ``data`` (the compressed pieces).  The host walks the pieces'
  framing once, at upload, into a block table (:attr:`DevicePayload.extra`
  ``["block_table"]``), so decoding never reads the bytes back.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np

from ..resident import ResidentPayload, split_host_payload

__all__ = ["DEVICE_FIELDS", "DevicePayload"]

#: Payload fields uploaded to the device, per representation.
DEVICE_FIELDS: dict[str, tuple[str, ...]] = {
    "paired": ("indptr", "indices", "counts"),
    "packed": ("widths", "offsets", "data"),
    "encoded": ("data",),
}


@dataclasses.dataclass(eq=False)
class DevicePayload(ResidentPayload):
    """A payload whose large arrays live on a CUDA device.

    Attributes
    ----------
    representation
        ``"paired"``, ``"packed"`` or ``"encoded"``.
    host_type
        The host payload class (to rebuild it, :meth:`to_host`).
    arrays
        ``{field: device array}`` (:data:`DEVICE_FIELDS`); empty once freed.
    fields
        The payload's other fields, on the host.
    dtype
        Logical dtype of the decoded values (the host payload's ``dtype``).
    nbytes
        Bytes of the payload as resident: the device arrays plus the host
        index fields, equal to the host payload's ``nbytes``.
    extra
        What the upload prepared for the kernels (the encoded block table).
    device
        The CUDA device id.
    """

    RESIDENT_FIELDS: ClassVar[dict[str, tuple[str, ...]]] = DEVICE_FIELDS

    extra: dict[str, Any]
    device: int

    def where(self) -> str:
        """``"on cuda:<id>"``."""
        return f"on cuda:{self.__dict__.get('device')}"

    @property
    def device_nbytes(self) -> int:
        """Bytes held in device memory."""
        return self.resident_nbytes

    @classmethod
    def upload(
        cls,
        representation: str,
        payload: Any,
        to_device: Callable[[np.ndarray], Any],
        *,
        device: int,
    ) -> DevicePayload:
        """Upload ``payload``'s large arrays with ``to_device`` and keep the rest on the host.

        Parameters
        ----------
        representation
            The payload's representation (a key of :data:`DEVICE_FIELDS`).
        payload
            A host payload (a dataclass: ``PairedPayload``, ``PackedPayload``,
            ``EncodedPayload``).
        to_device
            Copies one host array to the device.
        device
            The device id (for messages).

        Raises
        ------
        UnsupportedOperationError
            The representation has no device layout here.
        ParameterError
            A paired payload has a threshold still pending.
        """
        names = DEVICE_FIELDS.get(representation)
        host, fields = split_host_payload(
            representation,
            payload,
            names,
            keeps="the CUDA runtime keeps dense, paired, packed and encoded payloads on the device",
        )
        assert names is not None
        extra: dict[str, Any] = {}
        if representation == "encoded" and host.codec == "bitshuffle-lz4":
            from .bslz4 import block_table

            # walk the framing once, on the host, while the bytes are here
            extra["block_table"] = block_table(host, np.arange(host.n_pieces))
        arrays = {n: to_device(np.ascontiguousarray(getattr(host, n))) for n in names}
        return cls(
            representation=representation,
            host_type=type(host),
            arrays=arrays,
            fields=fields,
            extra=extra,
            dtype=np.dtype(host.dtype),
            nbytes=int(host.nbytes),
            device=int(device),
        )

    def to_host(self, to_host: Callable[[Any], np.ndarray]) -> Any:
        """Rebuild the host payload (copies the device arrays back with ``to_host``)."""
        self.check_live()
        return self.rebuild({n: to_host(a) for n, a in self.arrays.items()})

    def free(self) -> None:
        """Drop the device arrays (their memory returns to CuPy's pool); idempotent."""
        self.extra.clear()
        super().free()
