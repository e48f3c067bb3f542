"""Reading a pipeline file strictly: YAML limits, every key checked, values parsed."""

from __future__ import annotations

import importlib.resources
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..calibration import Calibration
from ..errors import (
    FormatError,
    ParameterError,
    QuantemFlowError,
)
from ..io import reader_names
from ..io.base import check_exists
from ..provenance import jsonable
from .messages import _prefixed
from .model import Pipeline
from .schema import (
    _COMMON_OUTPUT_KEYS,
    _DISPLAY_KEYS,
    _FIELD_INPUTS,
    _INPUT_KEYS,
    _REQUIRED,
    _SAVE_KEYS,
    _TOP_KEYS,
    _TRANSFORMS,
    OPERATION_DECLARATIONS,
    OPERATIONS,
    PIPELINE_OPERATIONS,
    PIPELINE_VERSION,
    InputSpec,
    OutputSpec,
    SaveSpec,
    _Checker,
    _describe,
    _reader_options,
    reader_options,
    reader_path_options,
)


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
        if fmt not in reader_names():  # built-in and installed (entry-point) readers
            raise chk.fail(
                "input.format", f"unknown format {fmt!r}; known formats: {reader_names()}"
            )
    options = _parse_options(chk, m.get("options"), fmt, base)
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


def _parse_options(chk: _Checker, raw: Any, fmt: str | None, base: Path) -> dict[str, Any]:
    options = dict(chk.mapping(raw or {}, "input.options"))
    allowed = reader_options() if fmt is None else _reader_options(fmt)
    chk.keys(options, "input.options" + ("" if fmt is None else f" (format {fmt})"), allowed)
    paths = reader_path_options(fmt) if options else frozenset()
    for key, value in options.items():
        where = f"input.options.{key}"
        if key in paths and isinstance(value, str):  # a reference file: beside the pipeline
            named = Path(chk.text(value, where)).expanduser()
            options[key] = str(named if named.is_absolute() else base / named)
        elif key == "scan_shape":
            if value == "square":
                continue
            rows_cols = chk.integers(value, where + " (or 'square')", 2)
            if min(rows_cols) < 1:
                raise chk.fail(where, f"expected two integers >= 1, got {value!r}")
        elif key in ("frame_shape", "shape"):
            chk.integers(value, where, 2 if key == "frame_shape" else 4)
        elif key == "frame_offset" and isinstance(value, str):
            continue  # a reader's named rule (tvips 'rotidx', k2is 'shutter'); the reader checks it
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
    if op not in _BUILTIN_OPERATIONS:  # an installed operation: as its operator annotates it
        return _parse_by_annotation(chk, op, key, value, where)
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


_BUILTIN_OPERATIONS = frozenset(op.name for op in PIPELINE_OPERATIONS)


def _parse_by_annotation(chk: _Checker, op: str, key: str, value: Any, where: str) -> Any:
    """A parameter of an installed operation, checked as its operator annotates it.

    ``float``: a number; ``int``: an integer; ``bool``: true or false;
    ``str``: text; anything else is passed as YAML read it (the operator
    checks it).
    """
    import inspect

    param = inspect.signature(OPERATION_DECLARATIONS[op].function()).parameters.get(key)
    kind = None if param is None else param.annotation
    if kind in ("float", float):
        return chk.number(value, where)
    if kind in ("int", int):
        if isinstance(value, bool) or not isinstance(value, int):
            raise chk.fail(where, f"expected an integer, got {_describe(value)}")
        return value
    if kind in ("bool", bool):
        return chk.boolean(value, where)
    if kind in ("str", str):
        return chk.text(value, where)
    return value


def _ssb_annotated(kind: str) -> frozenset[str]:
    """The parameters of :func:`~quantem_flow.operators.ssb.ssb` annotated ``kind`` alone."""
    import inspect

    from ..operators.ssb import ssb

    return frozenset(
        name
        for name, p in inspect.signature(ssb).parameters.items()
        if p.annotation in (kind, {"float": float, "int": int}[kind])
    )


def _parse_ssb_param(chk: _Checker, key: str, value: Any, where: str) -> Any:
    if key in _ssb_annotated("float"):  # plain numbers: read from ssb()'s signature
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
    if key in _ssb_annotated("int"):
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
