"""One error hierarchy for quantem-flow.

Every error subclasses both :class:`QuantemFlowError` and the builtin that
best describes it, so callers may catch either.  Messages follow one rule:
say what was expected, what was given, and what to do about it.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "AnnotationError",
    "CalibrationError",
    "ConversionError",
    "CorruptChunkError",
    "DatasetPathError",
    "DtypeError",
    "ExternalWorkerError",
    "ExternalWorkerLostError",
    "ExternalWorkerTimeoutError",
    "FormatError",
    "ImplausibleParameterError",
    "ImplausibleParameterWarning",
    "NonFiniteWarning",
    "OverwriteError",
    "ParameterError",
    "PlacementError",
    "ProtocolError",
    "QuantemFlowError",
    "RuntimeUnavailableError",
    "ScanShapeError",
    "ShapeError",
    "SourceNotFoundError",
    "StaleHandleError",
    "StorageError",
    "StreamProtocolError",
    "StreamReceiverLostError",
    "StreamTimeoutError",
    "UnitsError",
    "UnsupportedOperationError",
]


class QuantemFlowError(Exception):
    """Base class of every error raised by quantem-flow.

    Every error survives pickling (a cluster sends it from a worker to the
    client) with its type, message and fields: it is rebuilt by calling the
    class with its arguments, then its attributes are restored.  (Unpickling
    through ``__new__`` alone fails for classes that mix two builtins with
    different constructors, such as ``RuntimeError`` and ``TimeoutError``.)
    """

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return (_rebuild, (type(self), self.args, dict(self.__dict__)))


def _rebuild(
    cls: type[QuantemFlowError], args: tuple[Any, ...], state: dict[str, Any]
) -> QuantemFlowError:
    """Rebuild a pickled error: ``cls(*args)`` with its attributes restored."""
    error = cls(*args)
    error.__dict__.update(state)
    return error


class ParameterError(QuantemFlowError, ValueError):
    """An operator or function parameter has a bad value."""


class ShapeError(QuantemFlowError, ValueError):
    """An array or file has a shape other than the one expected."""


class ScanShapeError(ShapeError):
    """The scan shape is missing, ambiguous or inconsistent with the frames."""


class DtypeError(QuantemFlowError, TypeError):
    """An array or file has a dtype other than the one expected."""


class UnitsError(QuantemFlowError, ValueError):
    """A unit string is unknown or incompatible with the request."""


class CalibrationError(QuantemFlowError, ValueError):
    """A calibrated quantity was requested from uncalibrated axes."""


class SourceNotFoundError(QuantemFlowError, FileNotFoundError):
    """A file or store named as input does not exist."""


class DatasetPathError(QuantemFlowError, KeyError):
    """A path inside a container file (HDF5, Zarr) does not exist."""

    def __str__(self) -> str:  # KeyError would otherwise repr() the message
        return str(self.args[0]) if self.args else ""


class FormatError(QuantemFlowError, ValueError):
    """A file's content does not follow the format it claims to be."""


class OverwriteError(QuantemFlowError, FileExistsError):
    """An output path exists and may not be replaced (the input, or a file not ours)."""


class CorruptChunkError(QuantemFlowError, OSError):
    """A chunk of a source could not be read or decoded."""


class StorageError(QuantemFlowError, OSError):
    """Results could not be written: a full disk or quota, a read-only file system, no permission.

    Attributes
    ----------
    target
        The file or store being written.
    needed_bytes, free_bytes
        About how many bytes the write needed and how many were free, when known.
    """

    def __init__(
        self,
        message: str,
        *,
        target: str | None = None,
        needed_bytes: int | None = None,
        free_bytes: int | None = None,
    ) -> None:
        super().__init__(message)
        self.target = target
        self.needed_bytes = needed_bytes
        self.free_bytes = free_bytes


class RuntimeUnavailableError(QuantemFlowError, RuntimeError):
    """A requested runtime (cuda, mps, external) is not available here."""


class UnsupportedOperationError(QuantemFlowError, NotImplementedError):
    """A runtime or representation cannot run the requested operation."""


class AnnotationError(QuantemFlowError, ValueError):
    """A graph annotation has a value the scheduler must never see."""


class ConversionError(QuantemFlowError, ValueError):
    """A representation conversion was not exact; the message names what differs."""


class PlacementError(QuantemFlowError, RuntimeError):
    """A task could not be placed on any worker (capability, admission, conflict)."""


class _ExternalContext:
    """What an external-worker error names: worker, message type, handle, code."""

    code: str | None
    worker: str | None
    message_type: str | None
    handle: int | None

    def _set_context(
        self,
        code: str | None,
        worker: str | None,
        message_type: str | None,
        handle: int | None,
    ) -> None:
        self.code = code
        self.worker = worker
        self.message_type = message_type
        self.handle = handle


class ProtocolError(_ExternalContext, QuantemFlowError, ValueError):
    """A ``qf-worker/1`` frame or message breaks the protocol (docs/protocol.md).

    Attributes
    ----------
    code
        The protocol error code: ``frame``, ``truncated``, ``too_large``,
        ``version`` or ``bad_request``.
    worker, message_type, handle
        The worker, the message type and the handle concerned, when known.
    """

    def __init__(
        self,
        message: str,
        *,
        code: str = "frame",
        worker: str | None = None,
        message_type: str | None = None,
        handle: int | None = None,
    ) -> None:
        super().__init__(message)
        self._set_context(code, worker, message_type, handle)


class StreamProtocolError(QuantemFlowError, ValueError):
    """A detector stream sent a message that breaks its protocol (DECTRIS stream v2, Merlin TCP).

    The message names what was expected and what came, and where in the stream.
    """


class StreamTimeoutError(QuantemFlowError, TimeoutError):
    """A detector stream sent nothing within its deadline (the detector stopped or is gone)."""


class StreamReceiverLostError(QuantemFlowError, RuntimeError):
    """The process receiving a live stream ended without its report (killed, out of memory)."""


class ExternalWorkerError(_ExternalContext, QuantemFlowError, RuntimeError):
    """An external (native or browser) worker refused or failed a request.

    Attributes
    ----------
    code
        The worker's error code (``unknown_handle``, ``budget``,
        ``unsupported``, ``device``, ``internal``...) or ``None``.
    worker, message_type, handle
        The worker, the request type and the handle concerned, when known.
    """

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        worker: str | None = None,
        message_type: str | None = None,
        handle: int | None = None,
    ) -> None:
        super().__init__(message)
        self._set_context(code, worker, message_type, handle)


class ExternalWorkerLostError(ExternalWorkerError):
    """The external worker's process or page went away (crash, kill, closed socket).

    Attributes
    ----------
    exit_code
        The process's exit status (negative: killed by that signal), or
        ``None`` for a page or a process still being reaped.
    stderr_tail
        The last lines the process wrote to stderr.
    """

    def __init__(
        self,
        message: str,
        *,
        code: str | None = "lost",
        worker: str | None = None,
        message_type: str | None = None,
        handle: int | None = None,
        exit_code: int | None = None,
        stderr_tail: str = "",
    ) -> None:
        super().__init__(
            message, code=code, worker=worker, message_type=message_type, handle=handle
        )
        self.exit_code = exit_code
        self.stderr_tail = stderr_tail


class ExternalWorkerTimeoutError(ExternalWorkerError, TimeoutError):
    """An external worker did not answer a request in time."""


class StaleHandleError(ExternalWorkerError):
    """A handle belongs to an external worker session that has ended (the process restarted).

    The payload must be put again (re-placed) before it can be used.
    """


class ImplausibleParameterError(ParameterError):
    """A parameter is valid but implausible for the data (geometry off the detector...).

    The message gives the measured value, the value to use, and the opt-out
    (``allow_implausible=True``, recorded in the provenance).

    Attributes
    ----------
    parameters
        Names of the parameters at fault (``"inner"``, ``"semiangle_mrad"``...).
    """

    def __init__(self, message: str, *, parameters: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.parameters = parameters


class ImplausibleParameterWarning(UserWarning):
    """An implausible parameter was allowed (``allow_implausible=True``) and recorded."""


class NonFiniteWarning(UserWarning):
    """A result holds NaN or infinite values at some scan positions (non-finite detector pixels).

    Emitted once per result; the provenance (``execution["non_finite"]``)
    names the weight rows, how many scan positions and the first few.
    """
