"""One error hierarchy for quantem-flow.

Every error subclasses both :class:`QuantemFlowError` and the builtin that
best describes it, so callers may catch either.  Messages follow one rule:
say what was expected, what was given, and what to do about it.
"""

from __future__ import annotations

__all__ = [
    "AnnotationError",
    "CalibrationError",
    "ConversionError",
    "CorruptChunkError",
    "DatasetPathError",
    "DtypeError",
    "FormatError",
    "ParameterError",
    "PlacementError",
    "QuantemFlowError",
    "RuntimeUnavailableError",
    "ScanShapeError",
    "ShapeError",
    "SourceNotFoundError",
    "UnitsError",
    "UnsupportedOperationError",
]


class QuantemFlowError(Exception):
    """Base class of every error raised by quantem-flow."""


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


class CorruptChunkError(QuantemFlowError, OSError):
    """A chunk of a source could not be read or decoded."""


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
