"""What a pipeline file may hold: its keys, the operations, their required keys, the specs."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..calibration import Calibration
from ..errors import (
    ParameterError,
)

PIPELINE_VERSION = 1


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


def reader_options() -> tuple[str, ...]:
    """Return every option a pipeline may give under ``input.options`` (any reader).

    The union of the keyword options of every registered reader (built-in
    and installed), read from their signatures, plus ``verify``.
    """
    from ..io import reader_names

    seen: dict[str, None] = {}
    for fmt in reader_names():
        if fmt != "memory":
            seen.update(dict.fromkeys(_reader_options(fmt)))
    return (*sorted(k for k in seen if k != "verify"), "verify")


def _reader_options(fmt: str) -> tuple[str, ...]:
    """The keyword options of the reader ``fmt`` (from its signature), plus ``verify``."""
    import inspect

    from ..io import reader_class

    params = inspect.signature(reader_class(fmt).__init__).parameters.values()
    names = [p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY]
    return (*names, "verify")
