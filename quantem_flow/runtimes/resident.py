"""A non-dense payload resident in a runtime's memory: what CUDA and MLX payloads share.

A paired, packed or encoded payload moved to a device keeps its large arrays
in the runtime's memory (:attr:`ResidentPayload.arrays`) and its small
fields (shapes, dtypes, codec, runs) on the host (:attr:`ResidentPayload.fields`).
It reads like the host payload it came from (``payload.indices``,
``payload.value_dtype``...), so a runtime's kernels take either.  Each
runtime subclasses it with the fields it moves (:attr:`ResidentPayload.RESIDENT_FIELDS`)
and where they are (:meth:`ResidentPayload.where`):
:class:`~quantem_flow.runtimes.cuda.resident.DevicePayload` and
:class:`~quantem_flow.runtimes.mps.payloads.MlxPayload`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import numpy as np

from ..errors import ParameterError, UnsupportedOperationError

__all__ = ["ResidentPayload", "split_host_payload"]


@dataclasses.dataclass(eq=False)
class ResidentPayload:
    """A payload whose large arrays live in a runtime's memory.

    Attributes
    ----------
    representation
        ``"paired"``, ``"packed"`` or ``"encoded"``.
    host_type
        The host payload class (to rebuild it).
    arrays
        ``{field: runtime array}`` (:attr:`RESIDENT_FIELDS`); empty once freed.
    fields
        The payload's other fields, on the host.
    dtype
        Logical dtype of the decoded values (the host payload's ``dtype``).
    nbytes
        Bytes of the payload as resident, equal to the host payload's ``nbytes``.
    freed
        Whether :meth:`free` dropped the arrays.
    """

    #: Per representation, the fields a runtime keeps in its memory (set by subclasses).
    RESIDENT_FIELDS: ClassVar[dict[str, tuple[str, ...]]] = {}

    representation: str
    host_type: type
    arrays: dict[str, Any]
    fields: dict[str, Any]
    dtype: np.dtype[Any]
    nbytes: int
    freed: bool = dataclasses.field(default=False, kw_only=True)

    def where(self) -> str:
        """Where the arrays are, for messages (``"on cuda:0"``, ``"resident in MLX"``)."""
        return "resident"

    def released(self) -> ParameterError:
        """The error of a use after :meth:`free`."""
        return ParameterError(
            f"the {self.representation} payload {self.where()} was released; load and put the "
            "chunk again"
        )

    def __getattr__(self, name: str) -> Any:
        # only called when normal lookup fails: the payload's own fields
        state = self.__dict__
        if "arrays" in state and name in state["arrays"]:
            return state["arrays"][name]
        if "fields" in state and name in state["fields"]:
            return state["fields"][name]
        if state.get("freed") and name in type(self).RESIDENT_FIELDS.get(
            state.get("representation", ""), ()
        ):
            raise self.released()
        raise AttributeError(name)

    def check_live(self) -> None:
        """Raise :meth:`released` once freed."""
        if self.freed:
            raise self.released()

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
    def n_frames(self) -> int:
        """Frames (scan positions) held."""
        rows, cols = self.scan_shape
        return rows * cols

    @property
    def resident_nbytes(self) -> int:
        """Bytes held in the runtime's memory."""
        return int(sum(int(a.nbytes) for a in self.arrays.values()))

    def rebuild(self, arrays: dict[str, np.ndarray]) -> Any:
        """The host payload from its host fields and ``arrays`` (host copies or views)."""
        self.check_live()
        return self.host_type(**self.fields, **arrays)

    def free(self) -> None:
        """Drop the arrays (the runtime's allocator takes their memory back); idempotent."""
        self.arrays.clear()
        self.freed = True


def split_host_payload(
    representation: str, payload: Any, names: tuple[str, ...] | None, *, keeps: str
) -> tuple[Any, dict[str, Any]]:
    """Check a host payload before an upload and return it with its host-side fields.

    Parameters
    ----------
    representation
        The payload's representation.
    payload
        A host payload dataclass (``PairedPayload``, ``PackedPayload``, ``EncodedPayload``).
    names
        The fields the runtime keeps in its memory (``None``: the representation has no
        layout in this runtime).
    keeps
        How the runtime's error says what it keeps (``"the CUDA runtime keeps dense, paired,
        packed and encoded payloads on the device"``).

    Raises
    ------
    UnsupportedOperationError
        The representation has no layout here, or ``payload`` is not a payload dataclass.
    ParameterError
        A paired payload has a threshold still pending.
    """
    if names is None or not dataclasses.is_dataclass(payload) or isinstance(payload, type):
        raise UnsupportedOperationError(
            f"{keeps}; got a {representation!r} payload of type {type(payload).__name__}"
        )
    host: Any = payload
    require = getattr(host, "require_applied", None)
    if callable(require):
        require()
    fields = {
        f.name: getattr(host, f.name) for f in dataclasses.fields(host) if f.name not in names
    }
    return host, fields
