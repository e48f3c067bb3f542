"""The pipeline reference generated from the code: operations, parameters, reader options."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from ..errors import (
    FormatError,
)
from .schema import _REQUIRED, OPERATIONS, _reader_options, reader_options

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

    from .. import operators as ops

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
    "frame_offset": "Leading frames to skip (e.g. flyback frames), integer >= 0 (tvips also "
    "`rotidx`: start at rotator index 1).",
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


def _option_help(name: str) -> str:
    """The meaning of a reader option: :data:`READER_OPTION_HELP`, else its readers' docstrings."""
    import inspect

    from ..io import reader_class, reader_names

    if name in READER_OPTION_HELP:
        return READER_OPTION_HELP[name]
    for fmt in reader_names():
        doc = inspect.getdoc(reader_class(fmt)) or ""
        match = re.search(rf"^{re.escape(name)}(?:,[^\n]*)?\n((?:[ ]{{4}}.*\n?)+)", doc, re.M)
        if match:
            text = " ".join(line.strip() for line in match.group(1).splitlines())
            return f"({fmt}) {text}"
    return "see the reader's documentation (docs/readers.md)."


def reader_options_reference() -> str:
    """Return the Markdown table of the reader options of every format (docs/pipelines.md).

    The options of each format are read from its reader's signature.

    Returns
    -------
    str
        A table: format, its options.  Then one line per option.
    """
    from ..io import reader_names

    lines = ["| `format` | `input.options` it takes |", "|----------|-----------|"]
    for fmt in reader_names():
        if fmt == "memory":
            continue
        names = ", ".join(f"`{n}`" for n in _reader_options(fmt))
        lines.append(f"| `{fmt}` | {names} |")
    lines.append("")
    for name in reader_options():
        lines.append(f"- `{name}`: {_option_help(name)}")
    return "\n".join(lines) + "\n"


def write_reference(path: str | os.PathLike[str]) -> bool:
    """Regenerate the generated sections of ``docs/pipelines.md`` in place.

    Parameters
    ----------
    path
        The Markdown file holding the ``<!-- BEGIN ... -->`` /
        ``<!-- END ... -->`` markers of the operations and reader options.

    Returns
    -------
    bool
        Whether the file changed.
    """
    p = Path(path)
    text = p.read_text(encoding="utf-8")
    new = text
    for label, body in (
        ("operations", operations_reference()),
        ("reader options", reader_options_reference()),
    ):
        pattern = re.compile(
            rf"(<!-- BEGIN {label}: generated by [^>]*-->\n)(.*?)(<!-- END {label} -->)", re.S
        )
        if not pattern.search(new):
            raise FormatError(f"{str(p)!r} has no generated {label!r} section (BEGIN/END markers)")
        match = pattern.search(new)
        assert match is not None
        new = new[: match.start(2)] + body + new[match.end(2) :]
    if new != text:
        p.write_text(new, encoding="utf-8")
    return new != text
