"""Export the explorer's detectors as a YAML pipeline and a Python snippet.

Both reproduce the explorer's images exactly: the same reader, calibration,
transforms and detector geometry in pixels (``units: px``, explicit centres),
so ``quantem-flow run`` of the YAML, the snippet and the explorer call the
same operators with the same numbers.  Rectangles and polygons go out as
``virtual_mask`` outputs over a ``.npy`` mask written beside the YAML.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..dataset import Dataset4D
from ..errors import ParameterError
from .detectors import Detector

__all__ = ["InputSpec", "export_files", "input_spec_of", "pipeline_mapping", "python_snippet"]


@dataclasses.dataclass(frozen=True)
class InputSpec:
    """How the explored dataset was opened: enough to open it again.

    Attributes
    ----------
    path
        The data file or store.
    format
        The reader's name.
    options
        Reader options (``scan_shape``, ``dataset_path``...).
    """

    path: str
    format: str
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)


def input_spec_of(ds: Dataset4D) -> InputSpec | None:
    """The input of a dataset opened from a file, as far as it records it; ``None`` in memory.

    The reader's name and path, the HDF5 dataset path, and the scan shape of
    a file of flat frames; other reader options are not recorded by a dataset
    (give :class:`InputSpec` yourself when the file needs them).
    """
    from ..io.base import FrameSource

    src = ds.source
    paths = src.identity.paths
    if not paths:
        return None
    options: dict[str, Any] = {}
    dataset_path = getattr(src, "dataset_path", None)
    if isinstance(dataset_path, str):
        options["dataset_path"] = dataset_path
    if isinstance(src, FrameSource):
        options["scan_shape"] = [int(src.shape[0]), int(src.shape[1])]
    return InputSpec(path=str(src.opened_as or paths[0]), format=src.format, options=options)


def _transforms(ds: Dataset4D) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for t in ds.transforms:
        kind = t["transform"]
        if kind == "scan_region":
            out.append({"crop_scan": [int(v) for v in t["region"]]})
        elif kind == "detector_region":
            out.append({"crop_detector": [int(v) for v in t["region"]]})
        elif kind == "bin_detector":
            out.append({"bin_detector": [int(v) for v in t["factor"]]})
        else:
            raise ParameterError(
                f"the explored dataset has a {kind!r} transform, which a pipeline cannot "
                "express; export the Python snippet instead"
            )
    return out


def _calibration(ds: Dataset4D) -> dict[str, Any]:
    cal = ds.describe()["calibration"]
    out: dict[str, Any] = {
        "scan_sampling": list(cal["scan_sampling"]),
        "scan_units": cal["scan_units"],
        "detector_sampling": list(cal["detector_sampling"]),
        "detector_units": cal["detector_units"],
    }
    if cal.get("detector_origin") is not None:
        out["detector_origin"] = list(cal["detector_origin"])
    if cal.get("accelerating_voltage_kV") is not None:
        out["accelerating_voltage_kV"] = cal["accelerating_voltage_kV"]
    if list(cal.get("scan_step_signs") or [1, 1]) != [1, 1]:
        out["scan_step_signs"] = list(cal["scan_step_signs"])
    return out


def _mask_name(det: Detector) -> str:
    return f"{det.name}_mask.npy"


def _output(det: Detector) -> dict[str, Any]:
    if det.kind in ("disk", "annulus"):
        return {
            "op": "virtual_annular",
            "inner": float(det.inner) if det.kind == "annulus" else 0.0,
            "outer": float(det.outer),
            "units": "px",
            "center": [float(det.center[0]), float(det.center[1])],
            "allow_implausible": True,
        }
    return {"op": "virtual_mask", "mask": _mask_name(det)}


def pipeline_mapping(
    ds: Dataset4D, detectors: Sequence[Detector], spec: InputSpec
) -> dict[str, Any]:
    """The YAML pipeline (as a mapping) computing every detector's image on ``ds``."""
    names = [d.name for d in detectors]
    if len(set(names)) != len(names):
        raise ParameterError(f"detector names must differ to become pipeline outputs, got {names}")
    mapping: dict[str, Any] = {
        "version": 1,
        "description": "virtual detectors placed in the quantem-flow explorer",
        "input": {
            "path": spec.path,
            "format": spec.format,
            **({"options": dict(spec.options)} if spec.options else {}),
            "calibration": _calibration(ds),
            "chunk_rows": ds.chunk_rows,
        },
        "outputs": {d.name: _output(d) for d in detectors},
    }
    transforms = _transforms(ds)
    if transforms:
        mapping["transforms"] = transforms
    return mapping


def python_snippet(ds: Dataset4D, detectors: Sequence[Detector], spec: InputSpec | None) -> str:
    """A Python script computing every detector's image (masks loaded from ``.npy`` files)."""
    lines = ["import numpy as np", "", "import quantem_flow as qf", ""]
    if spec is None:
        lines.append("ds = ...  # the in-memory dataset that was explored: qf.open(array)")
    else:
        options = "".join(f", {k}={v!r}" for k, v in spec.options.items())
        cal = _calibration(ds)
        lines.append(f"ds = qf.open({spec.path!r}, format={spec.format!r}{options})")
        lines.append(
            "ds = ds.with_calibration("
            + ", ".join(f"{k}={tuple(v) if isinstance(v, list) else v!r}" for k, v in cal.items())
            + ")"
        )
        for t in _transforms(ds):
            ((kind, value),) = t.items()
            lines.append(f"ds = ds.{kind}({tuple(value)!r})")
        lines.append(f"ds = ds.rechunk(rows={ds.chunk_rows})")
    lines.append("")
    outs = []
    for d in detectors:
        if d.kind in ("disk", "annulus"):
            inner = float(d.inner) if d.kind == "annulus" else 0.0
            lines.append(
                f"{d.name} = qf.virtual_annular(ds, inner={inner!r}, outer={float(d.outer)!r}, "
                f"units='px', center=({float(d.center[0])!r}, {float(d.center[1])!r}), "
                f"allow_implausible=True, name={d.name!r})"
            )
        else:
            lines.append(
                f"{d.name} = qf.virtual_mask(ds, np.load({_mask_name(d)!r}), name={d.name!r})"
            )
        outs.append(d.name)
    lines.append(f"images = qf.compute({', '.join(outs)})")
    lines.append("for image in images:")
    lines.append("    print(image)")
    return "\n".join(lines) + "\n"


def export_files(
    ds: Dataset4D,
    detectors: Sequence[Detector],
    spec: InputSpec | None,
    folder: str | Path,
    *,
    figures: bool = True,
    client: Any = None,
) -> dict[str, Path]:
    """Write the export: ``pipeline.yaml`` (input from a file), ``explore.py``, masks, JSON.

    With ``figures``, each detector's image (computed on ``ds`` through
    ``client``, as :func:`quantem_flow.compute` takes it) and the mean
    pattern are written as PNGs too (:func:`~quantem_flow.save_png`, their
    display recorded in the file; an earlier export's PNGs are replaced).

    Returns
    -------
    dict
        ``{"pipeline": path, "python": path, "detectors": path, <mask name>: path,
        <name>.png: path}``.
    """
    import yaml

    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    written: dict[str, Path] = {}
    for d in detectors:
        if d.kind in ("rectangle", "polygon"):
            path = out / _mask_name(d)
            np.save(path, d.mask(ds.detector_shape))
            written[_mask_name(d)] = path
    if spec is not None:
        path = out / "pipeline.yaml"
        path.write_text(yaml.safe_dump(pipeline_mapping(ds, detectors, spec), sort_keys=False))
        written["pipeline"] = path
    path = out / "explore.py"
    path.write_text(python_snippet(ds, detectors, spec))
    written["python"] = path
    path = out / "detectors.json"
    path.write_text(json.dumps([d.to_dict() for d in detectors], indent=1))
    written["detectors"] = path
    if figures:
        from ..graphs import compute
        from ..operators import mean_diffraction
        from ..operators.display import save_png

        results = compute(*(d.lazy(ds) for d in detectors), mean_diffraction(ds), client=client)
        names = [f"{d.name}.png" for d in detectors] + ["mean_pattern.png"]
        for name, res in zip(names, results, strict=True):
            written[name] = save_png(res, out / name, overwrite=True)
    return written
