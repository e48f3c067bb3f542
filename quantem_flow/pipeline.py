"""YAML pipelines: one input, optional transforms, named outputs, saved files.

A pipeline file describes a whole analysis so it can be rerun and shared::

    version: 1
    input:
      path: data.h5                  # required; relative to this file's folder
      format: hdf5                   # optional (guessed from the name)
      options: {dataset_path: /data} # reader options (scan_shape, frame_offset...)
      calibration: {scan_sampling: [0.5, 0.5], scan_units: Å,
                    detector_sampling: [0.8, 0.8], detector_units: mrad,
                    accelerating_voltage_kV: 300}
      chunk_mib: 64                  # optional
    transforms:                      # optional, applied in order
      - crop_scan: [0, 40, 0, 60]
      - crop_detector: [0, 64, 0, 64]
      - bin_detector: 2
    outputs:                         # name -> {op: ..., parameters}
      bf: {op: virtual_bf}
      adf: {op: virtual_adf, inner: 20, outer: 60, units: mrad}
      com: {op: center_of_mass}
      phase: {op: idpc, input: com}
    save:                            # optional
      results: results.h5            # .h5 or .zarr (save_results)
      png: images/                   # one PNG per output (display.save_png)
      json: provenance.json          # metadata and provenance of every output
      overwrite: false               # replace existing files

Every output is computed by ONE call to :func:`quantem_flow.compute`, so
the dataset is read once.  Validation is strict: an unknown key, a missing
required key or a value of the wrong type raises
:class:`~quantem_flow.errors.ParameterError` naming the key and the allowed
keys.  Relative paths are relative to the folder of the YAML file (of the
current directory for a mapping), except that ``save`` paths are relative to
``output_dir`` when :func:`run_pipeline` is given one.

Operations and their parameters (see the operator of the same name):

=================  ===============================================================
``op``             parameters
=================  ===============================================================
virtual_bf         radius, units, center
virtual_abf        inner, outer, units, center
virtual_adf        inner, outer, units, center
virtual_annular    inner (required), outer (required), units, center
virtual_mask       mask (required: a ``.npy`` file shaped like the detector as loaded)
ssb                voltage_kV, semiangle_mrad (required), scan_step_A, defocus_A, ...
center_of_mass     center, mask_radius, mask_units, units
dpc                input, rotation_deg, transpose, subtract
idpc               input, rotation_deg, transpose, subtract, highpass
mean_diffraction   (none)
max_diffraction    (none)
sum_diffraction    (none)
=================  ===============================================================

``input`` of ``dpc``/``idpc`` names another output (a ``center_of_mass``,
or for ``idpc`` also a ``dpc``); without it the dataset's default centre of
mass is used.  Every output may also hold ``display:`` options for its PNG
(``low_percentile``, ``high_percentile``, ``gamma``, ``log``,
``subtract_mean``).
"""

from __future__ import annotations

import dataclasses
import importlib.resources
import json
import os
import re
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .calibration import Calibration
from .dataset import Dataset4D
from .dataset import open as open_dataset
from .errors import (
    CalibrationError,
    FormatError,
    OverwriteError,
    ParameterError,
    QuantemFlowError,
)
from .io import READERS
from .io.base import check_exists
from .operators.base import LazyResult
from .provenance import jsonable
from .results import Result

__all__ = [
    "OPERATIONS",
    "OPERATION_SUMMARIES",
    "PARAMETER_HELP",
    "READER_OPTIONS",
    "READER_OPTION_HELP",
    "InputSpec",
    "OutputSpec",
    "Pipeline",
    "PreparedRun",
    "SaveSpec",
    "SaveTargets",
    "check_outputs",
    "example_pipeline",
    "load_pipeline",
    "operations_reference",
    "prepare_pipeline",
    "reader_options_reference",
    "run_pipeline",
    "yaml_terms",
]

PIPELINE_VERSION = 1
"""The schema version this module reads."""

_TOP_KEYS = ("version", "description", "input", "transforms", "outputs", "save")
_INPUT_KEYS = ("path", "format", "options", "calibration", "chunk_mib", "chunk_rows")
_SAVE_KEYS = ("results", "png", "json", "overwrite")
_TRANSFORMS = ("crop_scan", "crop_detector", "bin_detector")
_DISPLAY_KEYS = ("low_percentile", "high_percentile", "gamma", "log", "subtract_mean")
_COMMON_OUTPUT_KEYS = ("op", "display")

#: Every operation a pipeline output may name, with its allowed parameters.
OPERATIONS: dict[str, tuple[str, ...]] = {
    "virtual_bf": ("radius", "units", "center", "allow_implausible"),
    "virtual_abf": ("inner", "outer", "units", "center", "allow_implausible"),
    "virtual_adf": ("inner", "outer", "units", "center", "allow_implausible"),
    "virtual_annular": ("inner", "outer", "units", "center", "allow_implausible"),
    "virtual_mask": ("mask",),
    "center_of_mass": ("center", "mask_radius", "mask_units", "units", "allow_implausible"),
    "dpc": ("input", "rotation_deg", "transpose", "subtract"),
    "idpc": ("input", "rotation_deg", "transpose", "subtract", "highpass"),
    "mean_diffraction": (),
    "max_diffraction": (),
    "sum_diffraction": (),
    "ssb": (
        "voltage_kV",
        "semiangle_mrad",
        "scan_step_A",
        "detector_sampling_mrad",
        "rotation_deg",
        "transpose",
        "defocus_A",
        "astigmatism_A",
        "astigmatism_angle_deg",
        "aberrations",
        "bf_threshold",
        "bf_radius_factor",
        "center",
        "pad_to",
        "fit_aberrations",
        "fit_max_pixels",
        "fit_max_evaluations",
        "pixel_block",
        "backend",
        "allow_complex64",
        "allow_implausible",
    ),
}


_REQUIRED: dict[str, tuple[str, ...]] = {
    "virtual_annular": ("inner", "outer"),
    "virtual_mask": ("mask",),
    "ssb": ("voltage_kV", "semiangle_mrad"),
}
_FIELD_INPUTS = {"dpc": ("center_of_mass",), "idpc": ("center_of_mass", "dpc")}


#: What each operation computes: (summary, result and its units).
OPERATION_SUMMARIES: dict[str, tuple[str, str]] = {
    "virtual_bf": (
        "Bright-field image: the counts within `radius` of the centre.",
        "ScanImage (counts)",
    ),
    "virtual_abf": (
        "Annular bright-field image; `auto` radii: half the probe radius to the probe radius.",
        "ScanImage (counts)",
    ),
    "virtual_adf": (
        "Annular dark-field image; `auto` radii: 1.5 probe radii to the detector edge.",
        "ScanImage (counts)",
    ),
    "virtual_annular": (
        "The counts in the annulus `inner <= d < outer` around the centre.",
        "ScanImage (counts)",
    ),
    "virtual_mask": (
        "The sum of each frame times a mask or weight map read from a `.npy` file.",
        "ScanImage (counts, times the weights)",
    ),
    "center_of_mass": (
        "Centre of mass of every pattern, relative to the centre, as a vector field.",
        "VectorField (px, or mrad / 1/Å on a calibrated detector)",
    ),
    "dpc": (
        "DPC field: the centre of mass rotated (and transposed) into scan axes.",
        "VectorField (the centre of mass's units)",
    ),
    "idpc": (
        "Integrated DPC phase (Fourier integration of the DPC field).",
        "PhaseImage (rad when scan, detector and voltage are calibrated, else arb.)",
    ),
    "mean_diffraction": ("The mean diffraction pattern.", "DiffractionImage (counts per frame)"),
    "max_diffraction": ("The pixel-wise maximum pattern.", "DiffractionImage (counts)"),
    "sum_diffraction": (
        "The summed pattern (integer sums widened).",
        "DiffractionImage (counts)",
    ),
    "ssb": (
        "Single-sideband ptychography: the complex transmission function over the scan.",
        "ComplexObject (amplitude, phase in rad)",
    ),
}

_RADIUS = "number or `auto`"
_CENTER = (
    "`auto`, `probe`, `calibration` or `[row, col]`",
    "px",
    "Centre of the detector region: `auto` (the calibration's origin when it has one, "
    "else the probe found from the mean pattern), `probe` (found from the data), "
    "`calibration` (`input.calibration.detector_origin`, required), or pixels.",
)
_IMPLAUSIBLE = (
    "true / false",
    "",
    "Compute a parameter refused as implausible anyway (for example a region mostly off "
    "the detector); recorded in the provenance, with a warning.",
)
_DPC_ROTATION = (
    "number or `auto`",
    "deg",
    "Rotation from detector to scan axes; `auto` minimises the curl of the field "
    "(the rotation found is recorded).",
)
_DPC_TRANSPOSE = ("true, false or `auto`", "", "Transpose detector axes before rotating.")
_DPC_SUBTRACT = ("`mean` or `none`", "", "Remove the field's mean first, or not.")
_DPC_INPUT = (
    "output name",
    "",
    "The output whose field is used: a `center_of_mass` output (or for `idpc` also a "
    "`dpc` one). Without it, the dataset's default centre of mass.",
)

#: YAML type, units and meaning of every operation parameter; ``(op, key)`` overrides ``key``.
PARAMETER_HELP: dict[str | tuple[str, str], tuple[str, str, str]] = {
    "radius": (_RADIUS, "`units`", "Disk radius; `auto`: the probe radius found from the data."),
    "inner": (_RADIUS, "`units`", "Inner radius of the annulus (included)."),
    "outer": (
        "number, `.inf` or `auto`",
        "`units`",
        "Outer radius of the annulus (excluded); `.inf` takes every pixel beyond `inner`.",
    ),
    ("virtual_annular", "inner"): ("number", "`units`", "Inner radius (included)."),
    ("virtual_annular", "outer"): (
        "number or `.inf`",
        "`units`",
        "Outer radius (excluded); `.inf` takes every pixel beyond `inner`.",
    ),
    "units": (
        "`px`, `mrad` or `1/Å`",
        "",
        "Units of the radii; `mrad` and `1/Å` need a calibrated detector "
        "(`input.calibration`), checked before anything is computed.",
    ),
    "center": _CENTER,
    "allow_implausible": _IMPLAUSIBLE,
    "mask": (
        "path",
        "",
        "A `.npy` file (relative to the pipeline's folder) holding a boolean mask or real "
        "weights shaped like the detector after the transforms.",
    ),
    "mask_radius": (
        "number or null",
        "`mask_units`",
        "Only pixels within this radius of the centre count; null: every pixel.",
    ),
    "mask_units": ("`px`, `mrad` or `1/Å`", "", "Units of `mask_radius`."),
    ("center_of_mass", "units"): (
        "`auto`, `px`, `mrad` or `1/Å`",
        "",
        "Units of the vectors; `auto`: the detector's.",
    ),
    "input": _DPC_INPUT,
    "rotation_deg": _DPC_ROTATION,
    "transpose": _DPC_TRANSPOSE,
    "subtract": _DPC_SUBTRACT,
    "highpass": ("number", "1/(scan unit)", "Regularising frequency of the integration."),
    "voltage_kV": (
        "number > 0",
        "kV",
        "Accelerating voltage; must agree with `input.calibration.accelerating_voltage_kV` "
        "when given there.",
    ),
    "semiangle_mrad": ("number > 0", "mrad", "Probe-forming aperture semiangle."),
    "scan_step_A": (
        "number, `[row, col]` or null",
        "Å",
        "Scan step; null: from the scan calibration, which must then be a length.",
    ),
    "detector_sampling_mrad": (
        "number, `[row, col]`, null, `auto`, `calibration` or `bf_disk`",
        "mrad",
        "Detector pixel size; null/`auto`: from a calibrated detector, else derived from "
        "the bright-field disk (recorded); `calibration`: require it; `bf_disk`: always "
        "derive.",
    ),
    ("ssb", "rotation_deg"): ("number", "deg", "Detector-to-scan rotation (after transpose)."),
    ("ssb", "transpose"): ("true / false", "", "Transpose detector axes first."),
    "defocus_A": ("number", "Å", "Defocus C10."),
    "astigmatism_A": ("number >= 0", "Å", "Two-fold astigmatism C12 (magnitude)."),
    "astigmatism_angle_deg": ("number", "deg", "Angle of C12, from the scan column axis."),
    "aberrations": (
        "mapping",
        "Å, deg",
        "More axial aberrations, e.g. `{C30: 1.0e4, C23: 50, phi23_deg: 10}`.",
    ),
    "bf_threshold": ("number in (0, 1)", "", "Segmentation threshold of the probe estimate."),
    "bf_radius_factor": (
        "number > 0",
        "",
        "Bright-field pixels: within this factor times the probe radius, inside the aperture.",
    ),
    "pad_to": ("`[rows, cols]` or null", "px", "FFT size over the scan (>= the scan shape)."),
    "fit_aberrations": (
        "true, false or a list of names",
        "",
        "Fit C10, C12, phi12 (true) or the names given, by minimising the double-overlap loss.",
    ),
    "fit_max_pixels": ("integer >= 1", "", "Pixels the aberration fit uses."),
    "fit_max_evaluations": ("integer >= 1", "", "Most loss evaluations of the fit."),
    "pixel_block": ("integer >= 1", "", "Detector pixels transformed together (memory)."),
    "backend": (
        "`auto`, `cpu`, `cuda` or `mps`",
        "",
        "Runtime of the FFT stage; no silent fallback.",
    ),
    ("ssb", "allow_implausible"): (
        "true / false",
        "",
        "Reconstruct even when `semiangle_mrad` disagrees with the bright-field disk "
        "measured from the data; recorded in the provenance, with a warning.",
    ),
    ("center_of_mass", "allow_implausible"): (
        "true / false",
        "",
        "Compute with a `mask_radius` disk mostly off the detector anyway; recorded in the "
        "provenance, with a warning.",
    ),
    "allow_complex64": ("true / false", "", "Allow a complex64-only FFT runtime (MLX)."),
}


def _yaml_default(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value == float("inf"):
        return ".inf"
    if isinstance(value, float) and value.is_integer():
        return str(int(value)) if abs(value) < 1e15 else str(value)
    return str(value)


def operations_reference() -> str:
    """Return the Markdown reference of every operation and parameter (for docs/pipelines.md).

    Defaults are read from the operators' signatures, the keys from
    :data:`OPERATIONS`, and the meaning of each from :data:`PARAMETER_HELP`,
    so the documentation cannot drift from what a pipeline accepts.

    Returns
    -------
    str
        One section per operation, each with a table of its keys.
    """
    import inspect

    from . import operators as ops

    lines: list[str] = []
    for op, params in OPERATIONS.items():
        summary, result = OPERATION_SUMMARIES[op]
        lines += [f"### `{op}`", "", f"{summary} Result: {result}.", ""]
        if not params:
            lines += ["No parameters.", ""]
            continue
        signature = inspect.signature(getattr(ops, op)).parameters
        lines += [
            "| key | value | units | default | meaning |",
            "|-----|-------|-------|---------|---------|",
        ]
        for key in params:
            kind, units, meaning = PARAMETER_HELP.get((op, key)) or PARAMETER_HELP[key]
            if key in _REQUIRED.get(op, ()):
                default = "**required**"
            elif key == "input":
                default = "(dataset)"
            else:
                default = f"`{_yaml_default(signature[key].default)}`"
            lines.append(f"| `{key}` | {kind} | {units} | {default} | {meaning} |")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


#: Meaning of every reader option (``input.options``).
READER_OPTION_HELP: dict[str, str] = {
    "dataset_path": "Dataset inside the HDF5 file, e.g. `/data` (needed when the file holds "
    "more than one 3-D/4-D dataset).",
    "array_path": "Array inside the Zarr group (default: the root array).",
    "scan_shape": "`[rows, cols]` of the scan for files of flat frames (3-D), or `square` to "
    "assume a square scan (recorded); a 4-D array's own shape is used, and a different one "
    "is refused. Without it, a JSON sidecar `<file>.json` with `scan_shape` is read.",
    "frame_offset": "Leading frames to skip (e.g. flyback frames), integer >= 0.",
    "dtype": "Value type as stored, e.g. `<u2`, `>u2`, `float32` (raw: required); counted: "
    "the type of the counts.",
    "frame_shape": "`[k_r, k_c]` of one frame.",
    "shape": "The full 4-D shape `[R_r, R_c, k_r, k_c]`, instead of `frame_shape` and "
    "`scan_shape`.",
    "offset": "Bytes before the first frame record.",
    "frame_header_bytes": "Bytes before each frame's values.",
    "frame_footer_bytes": "Bytes after each frame's values.",
    "verify": "`checksums`: refuse a source whose chunks carry no checksum verified on read "
    "(HDF5 Fletcher32, Zarr crc32c); `none`: read unchecked (the default).",
}


def reader_options_reference() -> str:
    """Return the Markdown table of the reader options of every format (docs/pipelines.md).

    The options of each format are read from its reader's signature.

    Returns
    -------
    str
        A table: format, its options.  Then one line per option.
    """
    from .io import READERS

    lines = ["| `format` | `input.options` it takes |", "|----------|-----------|"]
    for fmt in READERS:
        if fmt == "memory":
            continue
        names = ", ".join(f"`{n}`" for n in _reader_options(fmt))
        lines.append(f"| `{fmt}` | {names} |")
    lines.append("")
    for name in READER_OPTIONS:
        lines.append(f"- `{name}`: {READER_OPTION_HELP[name]}")
    return "\n".join(lines) + "\n"


# -- validation helpers ---------------------------------------------------------------------
class _Checker:
    """Raises errors that name the pipeline and the key."""

    def __init__(self, origin: str):
        self.origin = origin

    def fail(self, where: str, message: str) -> ParameterError:
        return ParameterError(f"pipeline {self.origin}: {where}: {message}")

    def mapping(self, value: Any, where: str) -> Mapping[str, Any]:
        if not isinstance(value, Mapping):
            raise self.fail(where, f"expected a mapping (key: value), got {_describe(value)}")
        for key in value:
            if not isinstance(key, str):
                raise self.fail(where, f"keys must be text, got {key!r} ({type(key).__name__})")
        return value

    def keys(
        self,
        value: Mapping[str, Any],
        where: str,
        allowed: Sequence[str],
        required: Sequence[str] = (),
    ) -> None:
        unknown = [k for k in value if k not in allowed]
        if unknown:
            raise self.fail(
                where,
                f"unknown key {unknown[0]!r}"
                + (f" (also {unknown[1:]})" if len(unknown) > 1 else "")
                + f"; allowed keys: {list(allowed)}",
            )
        missing = [k for k in required if k not in value]
        if missing:
            raise self.fail(
                where, f"missing required key {missing[0]!r}; allowed keys: {list(allowed)}"
            )

    def number(self, value: Any, where: str, *, allow: Sequence[str] = ()) -> float | str:
        if isinstance(value, str) and value in allow:
            return value
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            extra = f" or one of {list(allow)}" if allow else ""
            raise self.fail(where, f"expected a number{extra}, got {_describe(value)}")
        return float(value)

    def integers(self, value: Any, where: str, n: int) -> list[int]:
        if (
            not isinstance(value, list)
            or len(value) != n
            or any(isinstance(v, bool) or not isinstance(v, int) for v in value)
        ):
            raise self.fail(where, f"expected a list of {n} integers, got {_describe(value)}")
        return [int(v) for v in value]

    def text(self, value: Any, where: str) -> str:
        if not isinstance(value, str) or not value:
            raise self.fail(where, f"expected non-empty text, got {_describe(value)}")
        return value

    def boolean(self, value: Any, where: str) -> bool:
        if not isinstance(value, bool):
            raise self.fail(where, f"expected true or false, got {_describe(value)}")
        return value


def _describe(value: Any) -> str:
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{text} ({type(value).__name__})"


# -- the pipeline -----------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class InputSpec:
    """The ``input`` section, with ``path`` made absolute.

    Attributes
    ----------
    path
        The data file or store.
    format
        Reader name, or ``None`` to guess it.
    options
        Reader options (``dataset_path``, ``scan_shape``...).
    calibration
        The calibration given, or ``None`` (then the file's, a sidecar's, or
        none).
    chunk_mib, chunk_rows
        Chunking, or ``None`` for the default.
    """

    path: Path
    format: str | None = None
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    calibration: Calibration | None = None
    chunk_mib: float | None = None
    chunk_rows: int | None = None


@dataclasses.dataclass(frozen=True)
class OutputSpec:
    """One entry of ``outputs``.

    Attributes
    ----------
    name
        The output's name (its group in the results file, its PNG name).
    op
        A key of :data:`OPERATIONS`.
    params
        Operator parameters (paths made absolute), without ``op``, ``input``
        and ``display``.
    input
        For ``dpc``/``idpc``: the output it takes, or ``None``.
    display
        Options for :func:`~quantem_flow.operators.display.save_png`.
    """

    name: str
    op: str
    params: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    input: str | None = None
    display: Mapping[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class SaveSpec:
    """The ``save`` section, paths as written in the file."""

    results: str | None = None
    png: str | None = None
    json: str | None = None
    overwrite: bool = False


@dataclasses.dataclass(frozen=True)
class SaveTargets:
    """Absolute paths a run writes (``None`` where nothing is written)."""

    results: Path | None
    png_dir: Path | None
    json: Path | None
    png_files: Mapping[str, Path]

    def existing(self) -> list[Path]:
        """Return the targets that already exist."""
        paths = [self.results, self.json, *self.png_files.values()]
        return [p for p in paths if p is not None and (p.exists() or p.is_symlink())]


@dataclasses.dataclass(frozen=True)
class Pipeline:
    """A validated pipeline; build one with :func:`load_pipeline`.

    Attributes
    ----------
    input
        What to open.
    transforms
        ``(name, argument)`` pairs applied in order.
    outputs
        ``{name: OutputSpec}`` in file order.
    save
        The ``save`` section, or ``None`` when absent.
    base_dir
        Folder relative paths are resolved against.
    origin
        The YAML file, or ``"<mapping>"``.
    spec
        The pipeline as written (JSON-ready), recorded with the results.
    description
        Free text from the file.
    """

    input: InputSpec
    transforms: tuple[tuple[str, Any], ...]
    outputs: Mapping[str, OutputSpec]
    save: SaveSpec | None
    base_dir: Path
    origin: str
    spec: Mapping[str, Any]
    description: str = ""

    def error(
        self, exc: QuantemFlowError, where: str, *, output: str | None = None
    ) -> QuantemFlowError:
        """Return ``exc`` restated for this pipeline's author.

        The message is prefixed with the pipeline and the YAML key path
        ``where`` (``outputs.adf``, ``input.options``...), and advice written
        for Python callers (``Calibration(detector_sampling=...)``,
        ``scan_shape=(rows, cols)``, ``inner=``) is rewritten as the YAML
        keys that set the same thing (``input.calibration``,
        ``input.options.scan_shape``, ``outputs.adf.inner``).  The class is
        kept, so callers may catch the same error as before.

        Parameters
        ----------
        exc
            The error raised while opening, building or computing.
        where
            The key path the error concerns (empty: none in particular).
        output
            The output being built, when known.
        """
        message = str(exc)
        if message.startswith("pipeline "):
            return exc
        if output is None and not where:
            # "virtual_bf: ..." raised while computing: name the output when only one has that op
            head = re.match(r"([a-z_]+): ", message)
            owners = [n for n, o in self.outputs.items() if head and o.op == head.group(1)]
            if len(owners) == 1:
                output, where = owners[0], f"outputs.{owners[0]}"
                message = message[len(head.group(0)) if head else 0 :]
        text = yaml_terms(message, self, output=output)
        if where and not text.startswith(where + "."):
            text = f"{where}: {text}"
        return _same_class(exc, f"pipeline {self.origin}: {text}")

    def open(self) -> Dataset4D:
        """Open the input lazily and apply the transforms."""
        inp = self.input
        try:
            ds = open_dataset(
                inp.path,
                format=inp.format,
                calibration=inp.calibration,
                chunk_rows=inp.chunk_rows,
                chunk_mib=inp.chunk_mib,
                **dict(inp.options),
            )
        except QuantemFlowError as exc:
            raise self.error(exc, _input_key(exc)) from exc
        for i, (kind, arg) in enumerate(self.transforms):
            try:
                if kind == "crop_scan":
                    ds = ds.crop_scan(arg)
                elif kind == "crop_detector":
                    ds = ds.crop_detector(arg)
                else:
                    ds = ds.bin_detector(arg)
            except QuantemFlowError as exc:
                raise self.error(exc, f"transforms[{i}].{kind}") from exc
        return ds

    def build(self, dataset: Dataset4D | None = None) -> dict[str, LazyResult]:
        """Return the lazy result of every output (nothing is computed).

        Parameters
        ----------
        dataset
            The opened dataset; ``None`` opens it with :meth:`open`.
        """
        ds = dataset if dataset is not None else self.open()
        lazy: dict[str, LazyResult] = {}
        for name in self.outputs:
            self._build_one(name, ds, lazy)
        return {name: lazy[name] for name in self.outputs}

    def _build_one(self, name: str, ds: Dataset4D, lazy: dict[str, LazyResult]) -> LazyResult:
        if name in lazy:
            return lazy[name]
        from . import operators as ops

        out = self.outputs[name]
        p = dict(out.params)
        try:
            _check_units(out, ds)
            result: LazyResult
            if out.op in ("dpc", "idpc"):
                src: Dataset4D | LazyResult = (
                    self._build_one(out.input, ds, lazy) if out.input is not None else ds
                )
                fn: Callable[..., LazyResult] = ops.dpc if out.op == "dpc" else ops.idpc
                result = fn(src, name=name, **p)
            elif out.op == "virtual_mask":
                mask = _load_mask(Path(p["mask"]))
                result = ops.virtual_mask(ds, mask, name=name)
            else:
                result = getattr(ops, out.op)(ds, name=name, **p)
        except QuantemFlowError as exc:
            raise self.error(exc, f"outputs.{name}", output=name) from exc
        lazy[name] = result
        return result

    def save_targets(self, output_dir: str | os.PathLike[str] | None = None) -> SaveTargets:
        """Return where a run writes.

        Parameters
        ----------
        output_dir
            Folder ``save`` paths are relative to (default: the YAML file's
            folder).  Without a ``save`` section, giving ``output_dir`` writes
            ``results.h5``, ``images/`` and ``provenance.json`` there.
        """
        save = self.save
        if save is None:
            if output_dir is None:
                return SaveTargets(None, None, None, {})
            save = SaveSpec(results="results.h5", png="images", json="provenance.json")
        base = Path(output_dir).expanduser().absolute() if output_dir is not None else self.base_dir

        def resolve(value: str | None) -> Path | None:
            if value is None:
                return None
            p = Path(value).expanduser()
            return p if p.is_absolute() else base / p

        png_dir = resolve(save.png)
        pngs = {n: png_dir / f"{n}.png" for n in self.outputs} if png_dir is not None else {}
        return SaveTargets(resolve(save.results), png_dir, resolve(save.json), pngs)

    def to_dict(self) -> dict[str, Any]:
        """Return the pipeline as written plus where it came from (JSON-ready)."""
        return {
            "origin": self.origin,
            "base_dir": str(self.base_dir),
            "spec": jsonable(self.spec),
        }


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


#: Reader options a pipeline may give under ``input.options`` (any reader).
READER_OPTIONS: tuple[str, ...] = (
    "dataset_path",
    "array_path",
    "scan_shape",
    "frame_offset",
    "dtype",
    "frame_shape",
    "shape",
    "offset",
    "frame_header_bytes",
    "frame_footer_bytes",
    "verify",
)

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
        if name in READER_OPTIONS:
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
    from .errors import DatasetPathError, ScanShapeError, SourceNotFoundError

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


def _check_units(out: OutputSpec, ds: Dataset4D) -> None:
    """Fail before computing when calibrated units meet an uncalibrated detector."""
    for key in ("units", "mask_units"):
        units = out.params.get(key)
        if isinstance(units, str) and units != "auto":
            ds.calibration.detector_scale(units)
    if out.params.get("center") == "calibration":
        ds.calibration.require_origin()


def _load_mask(path: Path) -> np.ndarray:
    p = check_exists(path, what="mask file")
    try:
        mask = np.load(p, allow_pickle=False)
    except (ValueError, OSError) as exc:
        raise FormatError(
            f"mask {str(p)!r} is not a readable .npy array ({exc}); save the mask with numpy.save"
        ) from exc
    if not isinstance(mask, np.ndarray):
        raise FormatError(f"mask {str(p)!r} holds several arrays; give a .npy with one 2-D array")
    return mask


# -- loading ------------------------------------------------------------------------------
def example_pipeline(name: str = "demo") -> Path:
    """Return the path of a pipeline shipped in ``quantem_flow/examples``.

    Parameters
    ----------
    name
        File name without ``.yaml`` (``"demo"``, ``"calibrated"``).
    """
    root = importlib.resources.files("quantem_flow") / "examples"
    candidate = root / f"{name}.yaml"
    if not candidate.is_file():
        known = sorted(
            p.name.removesuffix(".yaml") for p in root.iterdir() if p.name.endswith(".yaml")
        )
        raise ParameterError(f"no example pipeline {name!r}; shipped examples: {known}")
    return Path(str(candidate))


def _read_yaml(path: Path) -> tuple[Any, str]:
    import yaml

    p = check_exists(path, what="pipeline file")
    if p.is_dir():
        raise ParameterError(f"pipeline file {str(p)!r} is a directory; give a .yaml file")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise FormatError(f"pipeline file {str(p)!r} is not UTF-8 text: {exc}") from exc
    try:
        return strict_yaml_load(text, str(p)), str(p)
    except yaml.YAMLError as exc:
        detail = " ".join(str(exc).split())
        raise FormatError(f"pipeline file {str(p)!r} is not valid YAML: {detail}") from exc


#: Most YAML nodes a pipeline may expand to once its aliases are followed.  A real
#: pipeline has a few hundred; an "alias bomb" (nested anchors, each level repeating
#: the one below) has billions, which would hang loading and provenance.
MAX_YAML_NODES = 10_000


def strict_yaml_load(text: str, origin: str = "<string>") -> Any:
    """Load YAML safely, refusing duplicate keys and alias expansion beyond a bound.

    Parameters
    ----------
    text
        The YAML document.
    origin
        Where it came from, for messages.

    Raises
    ------
    FormatError
        For a key given twice in one mapping (PyYAML would keep the last
        silently) or for aliases that expand to more than
        :data:`MAX_YAML_NODES` nodes; the message names the key or the
        count and the line.
    yaml.YAMLError
        For YAML that does not parse.
    """
    import yaml

    class _StrictLoader(yaml.SafeLoader):
        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            if isinstance(node, yaml.MappingNode):
                seen: dict[Any, Any] = {}
                for key_node, _ in node.value:
                    if key_node.tag == "tag:yaml.org,2002:merge":
                        continue
                    key = self.construct_object(key_node, deep=True)
                    try:
                        hash(key)
                    except TypeError:
                        continue  # the base class reports unhashable keys
                    if key in seen:
                        first = seen[key].start_mark.line + 1
                        raise FormatError(
                            f"pipeline {origin}: key {key!r} appears twice in one mapping "
                            f"(lines {first} and {key_node.start_mark.line + 1}); YAML would "
                            "keep the last silently -- remove one of them"
                        )
                    seen[key] = key_node
            return super().construct_mapping(node, deep=deep)

    loader = _StrictLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        sizes: dict[int, int] = {}

        def expanded(n: Any) -> int:
            known = sizes.get(id(n))
            if known is not None:
                return known
            sizes[id(n)] = 1  # a cycle (recursive alias) counts once here, and is refused below
            total = 1
            if isinstance(n, yaml.SequenceNode):
                total += sum(expanded(c) for c in n.value)
            elif isinstance(n, yaml.MappingNode):
                total += sum(expanded(k) + expanded(v) for k, v in n.value)
            total = min(total, MAX_YAML_NODES + 1)
            sizes[id(n)] = total
            return total

        count = expanded(node)
        if count > MAX_YAML_NODES:
            raise FormatError(
                f"pipeline {origin}: its aliases (*name) expand to more than {MAX_YAML_NODES} "
                "YAML nodes (nested anchors repeating each other, an 'alias bomb'); write the "
                "values out, or use fewer nested aliases"
            )
        return loader.construct_document(node)
    finally:
        loader.dispose()


def load_pipeline(
    path_or_mapping: str | os.PathLike[str] | Mapping[str, Any],
    *,
    base_dir: str | os.PathLike[str] | None = None,
) -> Pipeline:
    """Read and validate a pipeline.

    Parameters
    ----------
    path_or_mapping
        A YAML file, or the same content as a mapping.
    base_dir
        Folder relative paths are resolved against; default: the YAML
        file's folder, or the current directory for a mapping.

    Returns
    -------
    Pipeline
        The validated pipeline; nothing is opened or read yet.

    Raises
    ------
    ParameterError
        For an unknown or missing key or a value of the wrong type; the
        message names the key and the allowed keys.
    SourceNotFoundError
        If the YAML file does not exist.
    FormatError
        If the file is not valid YAML.
    """
    if isinstance(path_or_mapping, Mapping):
        raw: Any = path_or_mapping
        origin = "<mapping>"
        default_base = Path.cwd()
    elif isinstance(path_or_mapping, (str, os.PathLike)):
        raw, origin = _read_yaml(Path(path_or_mapping).expanduser())
        default_base = Path(origin).parent
    else:
        raise ParameterError(
            "load_pipeline takes a YAML file path or a mapping, got "
            f"{type(path_or_mapping).__name__}"
        )
    base = Path(base_dir).expanduser().absolute() if base_dir is not None else default_base
    chk = _Checker(origin)
    top = chk.mapping(raw, "top level")
    chk.keys(top, "top level", _TOP_KEYS, required=("version", "input", "outputs"))
    version = top["version"]
    if isinstance(version, bool) or version != PIPELINE_VERSION:
        raise chk.fail(
            "version",
            f"this quantem-flow reads pipeline version {PIPELINE_VERSION}, got "
            f"{_describe(version)}",
        )
    description = top.get("description", "")
    if not isinstance(description, str):
        raise chk.fail("description", f"expected text, got {_describe(description)}")
    inp = _parse_input(chk, top["input"], base)
    transforms = _parse_transforms(chk, top.get("transforms"))
    outputs = _parse_outputs(chk, top["outputs"], base)
    save = _parse_save(chk, top["save"]) if top.get("save") is not None else None
    return Pipeline(
        input=inp,
        transforms=transforms,
        outputs=outputs,
        save=save,
        base_dir=base,
        origin=origin,
        spec=jsonable(top),
        description=description,
    )


def _parse_input(chk: _Checker, raw: Any, base: Path) -> InputSpec:
    m = chk.mapping(raw, "input")
    chk.keys(m, "input", _INPUT_KEYS, required=("path",))
    path = Path(chk.text(m["path"], "input.path")).expanduser()
    fmt = m.get("format")
    if fmt is not None:
        fmt = chk.text(fmt, "input.format")
        if fmt not in READERS:
            raise chk.fail(
                "input.format", f"unknown format {fmt!r}; known formats: {sorted(READERS)}"
            )
    options = _parse_options(chk, m.get("options"), fmt)
    cal = None
    if m.get("calibration") is not None:
        cal_map = chk.mapping(m["calibration"], "input.calibration")
        try:
            cal = Calibration.from_dict(cal_map)
        except (QuantemFlowError, TypeError) as exc:
            if isinstance(exc, QuantemFlowError):
                raise _prefixed(exc, f"pipeline {chk.origin}: input.calibration: ") from exc
            raise chk.fail("input.calibration", str(exc)) from exc
    chunk_mib = m.get("chunk_mib")
    if chunk_mib is not None:
        value = chk.number(chunk_mib, "input.chunk_mib")
        if not float(value) > 0:
            raise chk.fail("input.chunk_mib", f"must be > 0, got {chunk_mib!r}")
        chunk_mib = float(value)
    chunk_rows = m.get("chunk_rows")
    if chunk_rows is not None and (
        isinstance(chunk_rows, bool) or not isinstance(chunk_rows, int) or chunk_rows < 1
    ):
        raise chk.fail("input.chunk_rows", f"expected an integer >= 1, got {_describe(chunk_rows)}")
    return InputSpec(
        path=path if path.is_absolute() else base / path,
        format=fmt,
        options=options,
        calibration=cal,
        chunk_mib=chunk_mib,
        chunk_rows=chunk_rows,
    )


def _reader_options(fmt: str) -> tuple[str, ...]:
    """The keyword options of the reader ``fmt`` (from its signature), plus ``verify``."""
    import inspect

    from .io import reader_class

    params = inspect.signature(reader_class(fmt).__init__).parameters.values()  # type: ignore[misc]
    names = [p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY]
    return (*names, "verify")


def _parse_options(chk: _Checker, raw: Any, fmt: str | None) -> dict[str, Any]:
    options = dict(chk.mapping(raw or {}, "input.options"))
    allowed = READER_OPTIONS if fmt is None else _reader_options(fmt)
    chk.keys(options, "input.options" + ("" if fmt is None else f" (format {fmt})"), allowed)
    for key, value in options.items():
        where = f"input.options.{key}"
        if key == "scan_shape":
            if value == "square":
                continue
            rows_cols = chk.integers(value, where + " (or 'square')", 2)
            if min(rows_cols) < 1:
                raise chk.fail(where, f"expected two integers >= 1, got {value!r}")
        elif key in ("frame_shape", "shape"):
            chk.integers(value, where, 2 if key == "frame_shape" else 4)
        elif key in ("frame_offset", "offset", "frame_header_bytes", "frame_footer_bytes"):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise chk.fail(where, f"expected an integer >= 0, got {_describe(value)}")
        elif key in ("dataset_path", "array_path", "dtype"):
            chk.text(value, where)
        elif key == "verify" and value not in ("none", "checksums"):
            raise chk.fail(where, f"expected 'none' or 'checksums', got {_describe(value)}")
    return options


def _parse_transforms(chk: _Checker, raw: Any) -> tuple[tuple[str, Any], ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise chk.fail(
            "transforms",
            f"expected a list such as [{{crop_scan: [0, 40, 0, 60]}}], got {_describe(raw)}",
        )
    out: list[tuple[str, Any]] = []
    for i, item in enumerate(raw):
        where = f"transforms[{i}]"
        m = chk.mapping(item, where)
        chk.keys(m, where, _TRANSFORMS)
        if len(m) != 1:
            raise chk.fail(
                where, f"each transform is one key, one of {list(_TRANSFORMS)}; got {sorted(m)}"
            )
        ((kind, arg),) = m.items()
        if kind in ("crop_scan", "crop_detector"):
            out.append((kind, tuple(chk.integers(arg, f"{where}.{kind}", 4))))
        elif isinstance(arg, int) and not isinstance(arg, bool):
            out.append((kind, int(arg)))
        else:
            out.append((kind, tuple(chk.integers(arg, f"{where}.{kind}", 2))))
    return tuple(out)


def _parse_center(chk: _Checker, value: Any, where: str) -> str | list[float]:
    if isinstance(value, str):
        return value
    if (
        isinstance(value, list)
        and len(value) == 2
        and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)
    ):
        return [float(v) for v in value]
    raise chk.fail(
        where,
        f"expected 'auto', 'probe', 'calibration' or [row, col] pixels, got {_describe(value)}",
    )


def _parse_param(chk: _Checker, op: str, key: str, value: Any, where: str, base: Path) -> Any:
    if key in ("radius", "inner", "outer"):
        return chk.number(value, where, allow=("auto",))
    if key in ("units", "mask_units", "subtract"):
        return chk.text(value, where)
    if key == "center":
        return _parse_center(chk, value, where)
    if key == "mask_radius":
        return None if value is None else chk.number(value, where)
    if key == "rotation_deg":
        return chk.number(value, where, allow=("auto",))
    if key == "transpose":
        if value == "auto" or isinstance(value, bool):
            return value
        raise chk.fail(where, f"expected 'auto', true or false, got {_describe(value)}")
    if key == "highpass":
        return chk.number(value, where)
    if key == "allow_implausible":
        return chk.boolean(value, where)
    if key == "mask":
        p = Path(chk.text(value, where)).expanduser()
        return str(p if p.is_absolute() else base / p)
    if op == "ssb":
        return _parse_ssb_param(chk, key, value, where)
    raise chk.fail(where, f"unknown parameter of {op}")  # pragma: no cover - keys checked


_SSB_NUMBERS = (
    "voltage_kV",
    "semiangle_mrad",
    "defocus_A",
    "astigmatism_A",
    "astigmatism_angle_deg",
    "bf_threshold",
    "bf_radius_factor",
)


def _parse_ssb_param(chk: _Checker, key: str, value: Any, where: str) -> Any:
    if key in _SSB_NUMBERS:
        return chk.number(value, where)
    if key == "scan_step_A":
        if value is None:
            return None
        if isinstance(value, list):
            return [chk.number(v, where) for v in value]
        return chk.number(value, where)
    if key == "detector_sampling_mrad":
        if value is None or value in ("auto", "calibration", "bf_disk"):
            return value
        if isinstance(value, list):
            return [chk.number(v, where) for v in value]
        return chk.number(value, where)
    if key in ("pad_to",):
        return None if value is None else list(chk.integers(value, where, 2))
    if key in ("pixel_block", "fit_max_pixels", "fit_max_evaluations"):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise chk.fail(where, f"expected an integer >= 1, got {_describe(value)}")
        return value
    if key in ("backend",):
        return chk.text(value, where)
    if key == "allow_complex64":
        return chk.boolean(value, where)
    if key == "fit_aberrations":
        if isinstance(value, bool):
            return value
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return list(value)
        raise chk.fail(where, f"expected true, false or a list of names, got {_describe(value)}")
    if key == "aberrations":
        m = chk.mapping(value, where)
        return {str(k): chk.number(v, f"{where}.{k}") for k, v in m.items()}
    raise chk.fail(where, "unknown parameter of ssb")  # pragma: no cover - keys checked


def _parse_display(chk: _Checker, raw: Any, where: str) -> dict[str, Any]:
    m = chk.mapping(raw, where)
    chk.keys(m, where, _DISPLAY_KEYS)
    out: dict[str, Any] = {}
    for key, value in m.items():
        if key in ("log", "subtract_mean"):
            out[key] = chk.boolean(value, f"{where}.{key}")
        else:
            out[key] = chk.number(value, f"{where}.{key}")
    return out


def _parse_outputs(chk: _Checker, raw: Any, base: Path) -> dict[str, OutputSpec]:
    m = chk.mapping(raw, "outputs")
    if not m:
        raise chk.fail("outputs", "no output is named; add at least one, e.g. bf: {op: virtual_bf}")
    outputs: dict[str, OutputSpec] = {}
    for name, item in m.items():
        where = f"outputs.{name}"
        if "/" in name or name.startswith("__") or name in (".", ".."):
            raise chk.fail(
                where,
                "output names become group and file names: use letters, digits, '_', "
                "'-' or '.', without '/' and not starting with '__'",
            )
        spec = chk.mapping(item, where)
        if "op" not in spec:
            raise chk.fail(where, f"missing required key 'op'; one of {list(OPERATIONS)}")
        op = spec["op"]
        if not isinstance(op, str) or op not in OPERATIONS:
            raise chk.fail(f"{where}.op", f"unknown op {op!r}; allowed ops: {list(OPERATIONS)}")
        allowed = (*_COMMON_OUTPUT_KEYS, *OPERATIONS[op])
        chk.keys(spec, where, allowed, required=_REQUIRED.get(op, ()))
        params: dict[str, Any] = {}
        source: str | None = None
        display: dict[str, Any] = {}
        for key, value in spec.items():
            if key == "op":
                continue
            if key == "display":
                display = _parse_display(chk, value, f"{where}.display")
            elif key == "input":
                source = chk.text(value, f"{where}.input")
            else:
                params[key] = _parse_param(chk, op, key, value, f"{where}.{key}", base)
        outputs[name] = OutputSpec(name=name, op=op, params=params, input=source, display=display)
    for out in outputs.values():
        if out.input is None:
            continue
        target = outputs.get(out.input)
        allowed_ops = _FIELD_INPUTS[out.op]
        if target is None:
            raise chk.fail(
                f"outputs.{out.name}.input",
                f"names {out.input!r}, which is not an output; outputs: {list(outputs)}",
            )
        if target.op not in allowed_ops:
            raise chk.fail(
                f"outputs.{out.name}.input",
                f"{out.op} takes an output made by {' or '.join(allowed_ops)}, but "
                f"{out.input!r} is {target.op}",
            )
    return outputs


def _parse_save(chk: _Checker, raw: Any) -> SaveSpec:
    m = chk.mapping(raw, "save")
    chk.keys(m, "save", _SAVE_KEYS)
    values: dict[str, Any] = {}
    for key in ("results", "png", "json"):
        if m.get(key) is not None:
            values[key] = chk.text(m[key], f"save.{key}")
    results = values.get("results")
    if results is not None and not results.rstrip("/").lower().endswith((".h5", ".hdf5", ".zarr")):
        raise chk.fail(
            "save.results", f"name it .h5/.hdf5 (HDF5) or .zarr (Zarr v3), got {results!r}"
        )
    overwrite = chk.boolean(m.get("overwrite", False), "save.overwrite")
    return SaveSpec(overwrite=overwrite, **values)


# -- running ------------------------------------------------------------------------------
def _connect(client: Any) -> tuple[Any, bool]:
    """Return a client for ``compute`` and whether this module must close it."""
    if isinstance(client, str) and client != "synchronous":
        if not client.startswith(("tcp://", "tls://", "inproc://", "ucx://", "ws://", "wss://")):
            raise ParameterError(
                f"client must be None (embedded local cluster), 'synchronous', a "
                f"distributed.Client or a scheduler address such as tcp://127.0.0.1:8786; got "
                f"{client!r}"
            )
        from distributed import Client

        return Client(client, set_as_default=False), True
    return client, False


def check_outputs(pipe: Pipeline, targets: SaveTargets, ds: Any) -> None:
    """Refuse outputs that are the input (or hold it) or existing files not ours."""
    from .io.results_store import check_replaceable

    inputs = [str(p) for p in ds.source.identity.paths]
    outputs = [targets.results, targets.json, *targets.png_files.values()]
    for target in outputs:
        if target is None:
            continue
        try:
            check_replaceable(target, protected=inputs)
        except OverwriteError as exc:
            raise OverwriteError(f"pipeline {pipe.origin}: {exc}") from None
    seen: dict[Path, str] = {}
    for label, target in [("save.results", targets.results), ("save.json", targets.json)] + [
        (f"png of {n!r}", p) for n, p in targets.png_files.items()
    ]:
        if target is None:
            continue
        if target in seen:
            raise ParameterError(
                f"pipeline {pipe.origin}: {label} and {seen[target]} both write {str(target)!r}; "
                "give each output its own path"
            )
        seen[target] = label


def _write_json(path: Path, doc: Mapping[str, Any]) -> None:
    text = json.dumps(jsonable(doc), indent=2, ensure_ascii=False, allow_nan=False)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:12]}.tmp")
    try:
        tmp.write_text(text + "\n", encoding="utf-8")
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


@dataclasses.dataclass(frozen=True)
class PreparedRun:
    """A pipeline checked against its input, ready to compute.

    Build one with :func:`prepare_pipeline`; :func:`run_pipeline` computes it.

    Attributes
    ----------
    pipeline
        The validated pipeline.
    dataset
        The opened input (metadata only), transforms applied.
    lazy
        ``{output name: lazy result}`` in the pipeline's order.
    targets
        Where the run writes.
    overwrite
        Whether existing files (quantem-flow's own) may be replaced.
    """

    pipeline: Pipeline
    dataset: Dataset4D
    lazy: Mapping[str, LazyResult]
    targets: SaveTargets
    overwrite: bool


class _NeedsPixelsError(Exception):
    """Raised by the dry plan's probe provider: the rest of that plan needs the data."""


def _dry_plan(pipe: Pipeline, lazy: Mapping[str, LazyResult]) -> None:
    """Plan every output whose plan needs no pixel data, to raise its errors now.

    Operators check some parameters only while planning (the geometry of a
    region against the detector, for example); when that needs no probe
    measured from the data, planning here raises the same error before any
    cluster starts.  A plan that asks for the probe stops quietly: it runs,
    with the data, at compute time.
    """
    import warnings

    from .operators.base import ChunkOperator, PlanContext

    def needs_pixels() -> Any:
        raise _NeedsPixelsError

    for name, result in lazy.items():
        operator = result.operator
        if not isinstance(operator, ChunkOperator) or result.dataset is None:
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # warned once, at compute time
                operator.plan(PlanContext(result.dataset, needs_pixels))
        except QuantemFlowError as exc:
            raise pipe.error(exc, f"outputs.{name}", output=name) from exc
        except Exception:  # _NeedsPixelsError, or anything the real plan will report itself
            continue


def prepare_pipeline(
    pipeline: Pipeline | str | os.PathLike[str] | Mapping[str, Any],
    *,
    output_dir: str | os.PathLike[str] | None = None,
    overwrite: bool | None = None,
) -> PreparedRun:
    """Check everything about a run that needs no pixel data, and build it lazily.

    Reads the YAML, opens the input (metadata only), applies the
    transforms, checks the output files (existing ones, the input among
    them) and builds every output's lazy result, which validates every
    parameter against the dataset's shape and calibration (``mrad`` radii
    on an uncalibrated detector, a missing mask file, bad SSB
    parameters...).  No frame is read and no cluster is started, so a bad
    pipeline fails at once.

    Parameters
    ----------
    pipeline
        A :class:`Pipeline`, or a YAML file or mapping for :func:`load_pipeline`.
    output_dir
        Folder the ``save`` paths are relative to (see
        :meth:`Pipeline.save_targets`).
    overwrite
        Replace existing output files; ``None`` takes ``save.overwrite``.

    Returns
    -------
    PreparedRun
        The run, to give to :func:`run_pipeline`.

    Raises
    ------
    ParameterError
        For an output file that exists without overwriting asked for, or a
        parameter the operator refuses; the message names the YAML key.
    OverwriteError
        For an output that is the input, or an existing file not written
        by quantem-flow.
    CalibrationError
        If an output asks for calibrated units (``mrad``, ``1/Å``) of an
        uncalibrated detector.
    SourceNotFoundError
        If the input (or a mask file) does not exist.
    """
    pipe = pipeline if isinstance(pipeline, Pipeline) else load_pipeline(pipeline)
    targets = pipe.save_targets(output_dir)
    replace = overwrite if overwrite is not None else bool(pipe.save and pipe.save.overwrite)
    existing = targets.existing()
    if existing and not replace:
        shown = [str(p) for p in existing[:4]] + (["..."] if len(existing) > 4 else [])
        raise ParameterError(
            f"pipeline {pipe.origin}: output file(s) already exist: {shown}; results are never "
            "overwritten silently -- set save.overwrite: true in the pipeline, pass "
            "--overwrite, or write elsewhere with --output-dir DIR"
        )
    ds = pipe.open()
    check_outputs(pipe, targets, ds)
    lazy = pipe.build(ds)
    _dry_plan(pipe, lazy)
    return PreparedRun(pipeline=pipe, dataset=ds, lazy=lazy, targets=targets, overwrite=replace)


def run_pipeline(
    pipeline: PreparedRun | Pipeline | str | os.PathLike[str] | Mapping[str, Any],
    *,
    client: Any = None,
    output_dir: str | os.PathLike[str] | None = None,
    progress: bool | None = None,
    overwrite: bool | None = None,
) -> dict[str, Result]:
    """Compute every output of a pipeline in one pass and write the files asked for.

    Parameters
    ----------
    pipeline
        A :class:`PreparedRun` from :func:`prepare_pipeline`, a
        :class:`Pipeline`, or a YAML file or mapping for :func:`load_pipeline`.
    client
        ``None`` (the embedded local cluster on 127.0.0.1), ``"synchronous"``,
        a ``distributed.Client``, or a scheduler address ``"tcp://host:port"``
        (connected for this run and closed after).
    output_dir
        Folder the ``save`` paths are relative to (default: the YAML file's
        folder); see :meth:`Pipeline.save_targets`.  Not with a
        :class:`PreparedRun` (it was given to :func:`prepare_pipeline`).
    progress
        Show a progress bar (``None``: on a terminal).
    overwrite
        Replace existing output files; ``None`` takes ``save.overwrite``.
        Not with a :class:`PreparedRun`.

    Returns
    -------
    dict of str to Result
        ``{output name: result}`` in the pipeline's order.  Every result's
        provenance notes name the pipeline and the output.

    Raises
    ------
    ParameterError, OverwriteError, CalibrationError, SourceNotFoundError
        As :func:`prepare_pipeline`, all before anything is computed or a
        scheduler is contacted.  Errors raised while computing name the
        pipeline, and YAML keys instead of Python arguments.
    """
    from .graphs import compute
    from .io.results_store import results_to_json, save_results
    from .operators.display import save_png

    if isinstance(pipeline, PreparedRun):
        if output_dir is not None or overwrite is not None:
            raise ParameterError(
                "output_dir and overwrite were already given to prepare_pipeline; call "
                "run_pipeline(prepared) without them, or prepare the pipeline again"
            )
        prepared = pipeline
    else:
        prepared = prepare_pipeline(pipeline, output_dir=output_dir, overwrite=overwrite)
    pipe, lazy, targets, replace = (
        prepared.pipeline,
        prepared.lazy,
        prepared.targets,
        prepared.overwrite,
    )
    compute_client, close_after = _connect(client)
    try:
        if isinstance(compute_client, str):
            computed = compute(*lazy.values(), client=compute_client, progress=progress)
        else:
            current = compute_client
            if current is None:  # compute() uses (and records) the embedded cluster
                from .graphs import embedded_client

                current = embedded_client()
            # the progress bar's as_completed() looks up the *current* client
            with current.as_current():
                computed = compute(*lazy.values(), client=compute_client, progress=progress)
    except QuantemFlowError as exc:
        raise pipe.error(exc, "") from exc
    finally:
        if close_after:
            compute_client.close()
    results: dict[str, Result] = {}
    for name, result in zip(lazy, computed, strict=True):
        result.provenance.notes.append(f"computed by pipeline {pipe.origin} as output {name!r}")
        results[name] = result
    if targets.results is not None:
        save_results(results, targets.results, overwrite=replace)
    for name, png in targets.png_files.items():
        save_png(results[name], png, overwrite=replace, **dict(pipe.outputs[name].display))
    if targets.json is not None:
        doc = json.loads(results_to_json(results))
        doc["pipeline"] = pipe.to_dict()
        doc["files"] = {
            "results": None if targets.results is None else str(targets.results),
            "png": {n: str(p) for n, p in targets.png_files.items()},
            "json": str(targets.json),
        }
        _write_json(targets.json, doc)
    return results
