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
from typing import Any

import numpy as np

from ...errors import ParameterError, UnsupportedOperationError

__all__ = ["DEVICE_FIELDS", "DevicePayload"]

#: Payload fields uploaded to the device, per representation.
DEVICE_FIELDS: dict[str, tuple[str, ...]] = {
    "paired": ("indptr", "indices", "counts"),
    "packed": ("widths", "offsets", "data"),
    "encoded": ("data",),
}


@dataclasses.dataclass(eq=False)
class DevicePayload:
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
    extra
        What the upload prepared for the kernels (the encoded block table).
    dtype
        Logical dtype of the decoded values (the host payload's ``dtype``).
    nbytes
        Bytes of the payload as resident: the device arrays plus the host
        index fields, equal to the host payload's ``nbytes``.
    device
        The CUDA device id.
    """

    representation: str
    host_type: type
    arrays: dict[str, Any]
    fields: dict[str, Any]
    extra: dict[str, Any]
    dtype: np.dtype[Any]
    nbytes: int
    device: int
    freed: bool = False

    def __getattr__(self, name: str) -> Any:
        # only called when normal lookup fails: the payload's own fields
        state = self.__dict__
        if "arrays" in state and name in state["arrays"]:
            return state["arrays"][name]
        if "fields" in state and name in state["fields"]:
            return state["fields"][name]
        if state.get("freed") and name in DEVICE_FIELDS.get(state.get("representation", ""), ()):
            raise ParameterError(
                f"the {state['representation']} payload on cuda:{state.get('device')} was "
                "released; load and put the chunk again"
            )
        raise AttributeError(name)

    @property
    def scan_shape(self) -> tuple[int, int]:
        """``(rows, cols)`` of scan positions."""
        rows, cols = self.fields["scan_shape"]
        return (int(rows), int(cols))

    @property
    def frame_shape(self) -> tuple[int, int]:
        """``(k_r, k_c)`` of one frame."""
        kr, kc = self.fields["frame_shape"]
        return (int(kr), int(kc))

    @property
    def device_nbytes(self) -> int:
        """Bytes held in device memory."""
        return int(sum(int(a.nbytes) for a in self.arrays.values()))

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
        if names is None or not dataclasses.is_dataclass(payload) or isinstance(payload, type):
            raise UnsupportedOperationError(
                f"the CUDA runtime keeps dense, paired, packed and encoded payloads on the "
                f"device; got a {representation!r} payload of type {type(payload).__name__}"
            )
        host: Any = payload
        require = getattr(host, "require_applied", None)
        if callable(require):
            require()
        extra: dict[str, Any] = {}
        if representation == "encoded" and host.codec == "bitshuffle-lz4":
            from .bslz4 import block_table

            # walk the framing once, on the host, while the bytes are here
            extra["block_table"] = block_table(host, np.arange(host.n_pieces))
        fields = {
            f.name: getattr(host, f.name) for f in dataclasses.fields(host) if f.name not in names
        }
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
        if self.freed:
            raise ParameterError(
                f"the {self.representation} payload on cuda:{self.device} was released; load "
                "and put the chunk again"
            )
        arrays = {n: to_host(a) for n, a in self.arrays.items()}
        return self.host_type(**self.fields, **arrays)

    def free(self) -> None:
        """Drop the device arrays (their memory returns to CuPy's pool); idempotent."""
        self.arrays.clear()
        self.extra.clear()
        self.freed = True
