"""A loaded pipeline (:class:`Pipeline`): its input, transforms, outputs and saved files."""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ..dataset import Dataset4D
from ..dataset import open as open_dataset
from ..errors import (
    FormatError,
    QuantemFlowError,
)
from ..io.base import check_exists
from ..operators.base import LazyResult
from ..provenance import jsonable
from .messages import _input_key, _same_class, yaml_terms
from .schema import OPERATION_DECLARATIONS, InputSpec, OutputSpec, SaveSpec, SaveTargets


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
        return self.apply_transforms(ds)

    def apply_transforms(self, ds: Dataset4D) -> Dataset4D:
        """Apply the pipeline's transforms, in order, to an opened dataset.

        Parameters
        ----------
        ds
            The input as opened (by :meth:`open`, or a live acquisition's view).
        """
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
        out = self.outputs[name]
        p = dict(out.params)
        try:
            _check_units(out, ds)
            result: LazyResult
            operation = OPERATION_DECLARATIONS[out.op]
            source: Dataset4D | LazyResult = ds
            if operation.field_inputs and out.input is not None:
                source = self._build_one(out.input, ds, lazy)
            result = operation.call(source, p, name=name, load_file=_load_mask)
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
