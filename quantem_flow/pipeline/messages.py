"""Errors in a pipeline's own terms: Python advice rewritten as YAML keys."""

from __future__ import annotations

import dataclasses
import re
from typing import TYPE_CHECKING

from ..calibration import Calibration
from ..errors import (
    CalibrationError,
    ParameterError,
    QuantemFlowError,
)
from .schema import OPERATIONS, reader_options

if TYPE_CHECKING:
    from .model import Pipeline


def _same_class(exc: QuantemFlowError, message: str) -> QuantemFlowError:
    """Return an error of the class of ``exc`` with ``message`` (``exc`` if it cannot be)."""
    try:
        new = type(exc)(message)
    except TypeError:  # pragma: no cover - every quantem_flow error takes one message
        return exc
    new.__cause__ = exc.__cause__
    return new


def _prefixed(exc: QuantemFlowError, prefix: str) -> QuantemFlowError:
    """Return an error of the same class whose message starts with ``prefix``."""
    message = str(exc)
    if message.startswith("pipeline "):
        return exc
    return _same_class(exc, prefix + yaml_terms(message))


_PY_VALUE = r"""(\([^()]*\)|\[[^\[\]]*\]|'[^']*'|"[^"]*"|\.\.\.|[A-Za-z0-9_+\-]+(?:\.[0-9]+)?)?"""


def _yaml_value(text: str | None) -> str:
    """A Python literal of an error message as YAML (``(a, b)`` -> ``[a, b]``)."""
    v = (text or "").strip()
    if v in ("", "..."):
        return v
    words = {"None": "null", "True": "true", "False": "false"}
    if v in words:
        return words[v]
    if len(v) >= 2 and v[0] == v[-1] and v[0] in "'\"":
        return v[1:-1]
    if v.startswith("(") and v.endswith(")"):
        return "[" + v[1:-1] + "]"
    return v


def _key(path: str, value: str | None) -> str:
    shown = _yaml_value(value)
    return f"{path}: {shown}" if shown and shown != "..." else path


def _calibration_terms(match: re.Match[str]) -> str:
    args = [a.strip() for a in match.group(1).split(",") if a.strip()]
    pairs = [a.split("=", 1) if "=" in a else [a, ""] for a in args]
    if not pairs:
        return "input.calibration"
    if len(pairs) == 1:
        return _key(f"input.calibration.{pairs[0][0].strip()}", pairs[0][1])
    inner = ", ".join(f"{k.strip()}: {_yaml_value(v) or '...'}" for k, v in pairs)
    return f"input.calibration: {{{inner}}}"


def yaml_terms(message: str, pipeline: Pipeline | None = None, *, output: str | None = None) -> str:
    """Rewrite Python advice in an error message as pipeline YAML keys.

    ``Calibration(detector_sampling=..., detector_units='mrad')`` becomes
    ``input.calibration: {detector_sampling: ..., detector_units: mrad}``,
    ``scan_shape=(rows, cols)`` becomes ``input.options.scan_shape: [rows,
    cols]``, ``inner=`` of the output being built becomes
    ``outputs.<name>.inner``, ``overwrite=True`` becomes ``save.overwrite:
    true (or --overwrite)``; the rest of the message is kept.

    Parameters
    ----------
    message
        The error message, as raised by the layer below.
    pipeline
        The pipeline (its outputs name the parameter keys); ``None``
        rewrites input and calibration advice only.
    output
        The output being built, when known; otherwise a parameter is given
        the path of the one output whose operation takes it.

    Returns
    -------
    str
        The message in the pipeline's terms.
    """
    text = re.sub(
        r"\s+(?:to|in)\s+open\(\)(?:\s+or\s+(?:ds\.)?with_calibration\([^()]*\))?",
        " in the pipeline",
        message,
    )
    text = re.sub(r"\b(?:ds\.)?with_calibration\(([^()]*)\)", _calibration_terms, text)
    text = re.sub(r"(?<![\w.])Calibration\(([^()]*)\)", _calibration_terms, text)
    text = re.sub(
        r"\bds\.(crop_scan|crop_detector|bin_detector)\(([^()]*)\)",
        lambda m: f"transforms: [{{{m.group(1)}: {_yaml_value('(' + m.group(2) + ')')}}}]",
        text,
    )
    text = re.sub(r"\boverwrite=True\b", "save.overwrite: true (or --overwrite)", text)
    cal_fields = {f.name for f in dataclasses.fields(Calibration)}
    options = reader_options()

    def param_path(name: str) -> str | None:
        if pipeline is None:
            return None
        if output is not None and output in pipeline.outputs:
            if name in OPERATIONS[pipeline.outputs[output].op]:
                return f"outputs.{output}.{name}"
            return None
        owners = [n for n, o in pipeline.outputs.items() if name in OPERATIONS[o.op]]
        if len(owners) == 1:
            return f"outputs.{owners[0]}.{name}"
        return f"outputs.<name>.{name}" if owners else None

    def keyword(match: re.Match[str]) -> str:
        name, value = match.group(1), match.group(2)
        path: str | None
        if name in options:
            path = f"input.options.{name}"
        elif name in cal_fields:
            path = f"input.calibration.{name}"
        else:
            path = param_path(name)
        return match.group(0) if path is None else _key(path, value)

    text = re.sub(r"(?<![\w.\-])([A-Za-z_][A-Za-z0-9_]*)=" + _PY_VALUE, keyword, text)
    if pipeline is not None and output is not None and output in pipeline.outputs:
        # "inner must be >= 0": a message that starts with the parameter's name
        op = pipeline.outputs[output].op
        first = re.match(r"'?([A-Za-z_][A-Za-z0-9_]*)'?(?=[\s:,])", text)
        if first is not None and first.group(1) in OPERATIONS[op]:
            text = f"outputs.{output}.{first.group(1)}" + text[first.end() :]
    return re.sub(
        r"\b([Pp])ass ((?:input|outputs|save)\.)",
        lambda m: f"{'S' if m.group(1) == 'P' else 's'}et {m.group(2)}",
        text,
    )


def _input_key(exc: QuantemFlowError) -> str:
    """The ``input`` key an error of opening concerns."""
    from ..errors import DatasetPathError, ScanShapeError, SourceNotFoundError

    if isinstance(exc, SourceNotFoundError):
        return "input.path"
    if isinstance(exc, ScanShapeError):
        return "input.options.scan_shape"
    if isinstance(exc, DatasetPathError):
        return "input.options.dataset_path"
    if isinstance(exc, CalibrationError):
        return "input.calibration"
    if isinstance(exc, ParameterError) and "reader " in str(exc):
        return "input.options"
    return "input"
