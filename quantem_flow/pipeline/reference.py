"""The pipeline reference generated from the code: operations, parameters, reader options."""

from __future__ import annotations

import inspect
import os
import re
from pathlib import Path
from typing import Any

from ..errors import (
    FormatError,
)
from .schema import (
    _REQUIRED,
    OPERATION_DECLARATIONS,
    OPERATION_REGISTRY,
    OPERATIONS,
    PIPELINE_OPERATIONS,
    _reader_options,
    reader_options,
)

#: What each built-in operation computes: ``(summary, result and its units)`` (a view of
#: the rows of :data:`~quantem_flow.pipeline.schema.PIPELINE_OPERATIONS`).
OPERATION_SUMMARIES: dict[str, tuple[str, str]] = {
    op.name: (op.summary, op.result) for op in PIPELINE_OPERATIONS
}


_RADIUS = "number or `auto`"


#: The meaning of the keys a pipeline gives in its own terms (a Python argument that is an
#: object, a file in YAML); every other key's meaning is its operator's numpydoc.
PIPELINE_MEANINGS: dict[str, str] = {
    "input": "The output whose field is used: a `center_of_mass` output (or for `idpc` also a "
    "`dpc` one). Without it, the dataset's default centre of mass.",
    "mask": "A `.npy` file (relative to the pipeline's folder) holding a boolean mask or real "
    "weights shaped like the detector after the transforms.",
}


#: The YAML value and the units of every operation parameter; ``(op, key)`` overrides
#: ``key``.  The meaning comes from the operator's numpydoc (:func:`parameter_meaning`).
PARAMETER_HELP: dict[str | tuple[str, str], tuple[str, str]] = {
    "radius": (_RADIUS, "`units`"),
    "inner": (_RADIUS, "`units`"),
    "outer": ("number, `.inf` or `auto`", "`units`"),
    ("virtual_annular", "inner"): ("number", "`units`"),
    ("virtual_annular", "outer"): ("number or `.inf`", "`units`"),
    "units": ("`px`, `mrad` or `1/Å`", ""),
    "center": ("`auto`, `probe`, `calibration` or `[row, col]`", "px"),
    "allow_implausible": ("true / false", ""),
    "mask": ("path", ""),
    "mask_radius": ("number or null", "`mask_units`"),
    "mask_units": ("`px`, `mrad` or `1/Å`", ""),
    ("center_of_mass", "units"): ("`auto`, `px`, `mrad` or `1/Å`", ""),
    "input": ("output name", ""),
    "rotation_deg": ("number or `auto`", "deg"),
    "transpose": ("true, false or `auto`", ""),
    "subtract": ("`mean` or `none`", ""),
    "highpass": ("number", "1/(scan unit)"),
    "voltage_kV": ("number > 0", "kV"),
    "semiangle_mrad": ("number > 0", "mrad"),
    "scan_step_A": ("number, `[row, col]` or null", "Å"),
    "detector_sampling_mrad": (
        "number, `[row, col]`, null, `auto`, `calibration` or `bf_disk`",
        "mrad",
    ),
    ("ssb", "rotation_deg"): ("number", "deg"),
    ("ssb", "transpose"): ("true / false", ""),
    "defocus_A": ("number", "Å"),
    "astigmatism_A": ("number >= 0", "Å"),
    "astigmatism_angle_deg": ("number", "deg"),
    "aberrations": ("mapping", "Å, deg"),
    "bf_threshold": ("number in (0, 1)", ""),
    "bf_radius_factor": ("number > 0", ""),
    "pad_to": ("`[rows, cols]` or null", "px"),
    "fit_aberrations": ("true, false or a list of names", ""),
    "fit_max_pixels": ("integer >= 1", ""),
    "fit_max_evaluations": ("integer >= 1", ""),
    "pixel_block": ("integer >= 1", ""),
    "backend": ("`auto`, `cpu`, `cuda` or `mps`", ""),
    "allow_complex64": ("true / false", ""),
}


def numpydoc_parameters(fn: Any) -> dict[str, str]:
    """``{name: description}`` of the ``Parameters`` section of ``fn``'s numpydoc docstring.

    Entries naming several parameters (``a, b``) give each the same text;
    descriptions are joined into one line, reStructuredText kept.
    """
    doc = inspect.getdoc(fn) or ""
    match = re.search(r"^Parameters\n-+\n(.*?)(?=^\S[^\n]*\n-{3,}\n|\Z)", doc, re.S | re.M)
    out: dict[str, list[str]] = {}
    names: list[str] = []
    for line in (match.group(1) if match else "").splitlines():
        if line and not line[0].isspace():
            names = [n.strip() for n in line.split(" : ")[0].split(",")]
            for n in names:
                out[n] = []
        elif names and line.strip():
            for n in names:
                out[n].append(line.strip())
    return {k: " ".join(v) for k, v in out.items()}


def markdown_of_rest(text: str) -> str:
    """A numpydoc description as the YAML reference writes it.

    Roles become code (``:class:`~a.B``` -> `B`), Python literals their YAML
    spelling (``"auto"`` -> `auto`, ``None`` -> `null`, ``True`` -> `true`,
    ``(row, col)`` -> `[row, col]`, ``math.inf`` -> `.inf`).
    """
    text = re.sub(
        r":(?:class|func|data|meth|attr|mod|exc):`(~?)([\w.]+)`",
        lambda m: f"`{m.group(2).split('.')[-1] if m.group(1) else m.group(2)}`",
        text,
    )
    yaml = {"None": "null", "True": "true", "False": "false", "math.inf": ".inf"}
    text = re.sub(r"``([^`]*)``", lambda m: f"`{yaml.get(m.group(1), m.group(1))}`", text)
    text = re.sub(r'`"([^`"]*)"`', r"`\1`", text)
    text = re.sub(r"`\(([^`()]*)\)`", r"`[\1]`", text)
    return re.sub(r"\s+", " ", text).strip()


def _summary_of(op: str) -> tuple[str, str]:
    """An installed operation's summary and result: its docstring's first line and Returns."""
    fn = OPERATION_DECLARATIONS[op].function()
    doc = inspect.getdoc(fn) or ""
    first = doc.split("\n\n", 1)[0].replace("\n", " ").strip() or f"`{op}`."
    returns = re.search(r"^Returns\n-+\n\S[^\n]*\n((?:[ ]+.*\n?)+)", doc, re.M)
    result = markdown_of_rest(returns.group(1)) if returns else "see its documentation"
    origin = OPERATION_REGISTRY.origin(op)
    return f"{markdown_of_rest(first)} ({origin})", result.rstrip(".")


def _value_of_annotation(op: str, key: str) -> tuple[str, str]:
    """The YAML value of an installed operation's parameter, from its annotation."""
    param = inspect.signature(OPERATION_DECLARATIONS[op].function()).parameters[key]
    words = {"float": "number", "int": "integer", "bool": "true / false", "str": "text"}
    kind = param.annotation if isinstance(param.annotation, str) else param.annotation.__name__
    return words.get(kind, f"`{kind}`"), ""


def parameter_meaning(op: str, key: str) -> str:
    """The meaning of ``key`` of operation ``op``: the pipeline's own words, else the numpydoc.

    Raises
    ------
    FormatError
        The operator's docstring does not document ``key`` (an undocumented
        parameter fails the reference, so docs/pipelines.md cannot drift).
    """
    if key in PIPELINE_MEANINGS:
        return PIPELINE_MEANINGS[key]
    fn = OPERATION_DECLARATIONS[op].function()
    described = numpydoc_parameters(fn)
    if key not in described:
        raise FormatError(
            f"{fn.__module__}.{fn.__qualname__} (operation {op!r}) does not document its "
            f"parameter {key!r} in its numpydoc 'Parameters' section; document it there (the "
            "pipeline reference reads it)"
        )
    return markdown_of_rest(described[key])


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

    Keys, required keys and defaults are read from the operators'
    signatures (:data:`OPERATIONS`), the meaning of each from the operator's
    numpydoc (:func:`parameter_meaning`), the YAML value and units from
    :data:`PARAMETER_HELP`, so the documentation cannot drift from what a
    pipeline accepts or what the functions say.

    Returns
    -------
    str
        One section per operation, each with a table of its keys.
    """
    lines: list[str] = []
    for op, params in OPERATIONS.items():
        declared = OPERATION_DECLARATIONS[op]
        summary, result = (
            (declared.summary, declared.result) if declared.summary else _summary_of(op)
        )
        lines += [f"### `{op}`", "", f"{summary} Result: {result}.", ""]
        if not params:
            lines += ["No parameters.", ""]
            continue
        signature = inspect.signature(OPERATION_DECLARATIONS[op].function()).parameters
        lines += [
            "| key | value | units | default | meaning |",
            "|-----|-------|-------|---------|---------|",
        ]
        for key in params:
            kind, units = (
                PARAMETER_HELP.get((op, key))
                or PARAMETER_HELP.get(key)
                or _value_of_annotation(op, key)
                if op in OPERATION_SUMMARIES  # a built-in operation
                else _value_of_annotation(op, key)  # an installed one: its annotations only
            )
            meaning = parameter_meaning(op, key)
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
    "`rotidx`: start at rotator index 1; k2is also `shutter`, its default: start where the "
    "blocks flag the shutter open).",
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
