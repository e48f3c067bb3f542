"""What a pipeline file may hold: its keys, the operations, their required keys, the specs."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from ..calibration import Calibration
from ..errors import (
    ParameterError,
)
from ..plugins import Registry

PIPELINE_VERSION = 1


_TOP_KEYS = ("version", "description", "input", "transforms", "outputs", "save")


_INPUT_KEYS = ("path", "format", "options", "calibration", "chunk_mib", "chunk_rows")


_SAVE_KEYS = ("results", "png", "json", "overwrite")


_TRANSFORMS = ("crop_scan", "crop_detector", "bin_detector")


_DISPLAY_KEYS = ("low_percentile", "high_percentile", "gamma", "log", "subtract_mean")


_COMMON_OUTPUT_KEYS = ("op", "display")


#: Operator keywords a pipeline never takes (Python objects or the pipeline's own business).
PYTHON_ONLY: tuple[str, ...] = ("name", "probe")


@dataclasses.dataclass(frozen=True)
class PipelineOperation:
    """How a pipeline output calls one operator of :mod:`quantem_flow.operators`.

    Its keys are derived from the operator's signature: its keyword-only
    parameters (less :data:`PYTHON_ONLY`), required when they have no
    default; ``input`` first when it takes the output of another operation;
    then its positional parameters read from files.

    Attributes
    ----------
    name
        The ``op:`` value: the operator function's name in
        :mod:`quantem_flow.operators`, unless ``target`` names another.
    field_inputs
        Operations whose output may be this one's ``input`` (the dataset's
        default when omitted); empty: the operator takes the dataset.
    file_params
        Positional parameters after the dataset that a pipeline gives as a path
        to a ``.npy`` file (``virtual_mask``'s ``mask``), in order.
    target
        ``"module:function"`` of the operator (a third-party operation);
        ``None``: ``quantem_flow.operators.<name>``.
    summary, result
        What it computes and its result type with units, for the reference
        (empty: the first line of the operator's docstring and its
        ``Returns``).
    """

    name: str
    field_inputs: tuple[str, ...] = ()
    file_params: tuple[str, ...] = ()
    target: str | None = None
    summary: str = ""
    result: str = ""

    def function(self) -> Callable[..., Any]:
        """The operator function."""
        if self.target is not None:
            from ..plugins import load_attribute

            found: Callable[..., Any] = load_attribute(self.target)
            return found
        from .. import operators

        fn: Callable[..., Any] = getattr(operators, self.name)
        return fn

    def _keywords(self) -> list[inspect.Parameter]:
        return [
            p
            for p in inspect.signature(self.function()).parameters.values()
            if p.kind is inspect.Parameter.KEYWORD_ONLY and p.name not in PYTHON_ONLY
        ]

    def keys(self) -> tuple[str, ...]:
        """The keys an output of this operation may hold besides ``op`` and ``display``."""
        head = ("input",) if self.field_inputs else ()
        return (*head, *self.file_params, *(p.name for p in self._keywords()))

    def required(self) -> tuple[str, ...]:
        """The keys an output of this operation must hold."""
        keywords = [p.name for p in self._keywords() if p.default is inspect.Parameter.empty]
        return (*self.file_params, *keywords)

    def call(
        self,
        source: Any,
        params: Mapping[str, Any],
        *,
        name: str,
        load_file: Callable[[Path], Any],
    ) -> Any:
        """Make the lazy result: ``source`` is the dataset or the ``input`` output's result."""
        rest = {k: v for k, v in params.items() if k not in self.file_params}
        files = [load_file(Path(params[k])) for k in self.file_params]
        return self.function()(source, *files, name=name, **rest)


#: The operations a pipeline output may name, in the reference's order.
PIPELINE_OPERATIONS: tuple[PipelineOperation, ...] = (
    PipelineOperation(
        "virtual_bf",
        summary="Bright-field image: the counts within `radius` of the centre.",
        result="ScanImage (counts)",
    ),
    PipelineOperation(
        "virtual_abf",
        summary=(
            "Annular bright-field image; `auto` radii: half the probe radius to the probe radius."
        ),
        result="ScanImage (counts)",
    ),
    PipelineOperation(
        "virtual_adf",
        summary="Annular dark-field image; `auto` radii: 1.5 probe radii to the detector edge.",
        result="ScanImage (counts)",
    ),
    PipelineOperation(
        "virtual_annular",
        summary="The counts in the annulus `inner <= d < outer` around the centre.",
        result="ScanImage (counts)",
    ),
    PipelineOperation(
        "virtual_mask",
        file_params=("mask",),
        summary="The sum of each frame times a mask or weight map read from a `.npy` file.",
        result="ScanImage (counts, times the weights)",
    ),
    PipelineOperation(
        "center_of_mass",
        summary="Centre of mass of every pattern, relative to the centre, as a vector field.",
        result="VectorField (px, or mrad / 1/Å on a calibrated detector)",
    ),
    PipelineOperation(
        "dpc",
        field_inputs=("center_of_mass",),
        summary="DPC field: the centre of mass rotated (and transposed) into scan axes.",
        result="VectorField (the centre of mass's units)",
    ),
    PipelineOperation(
        "idpc",
        field_inputs=("center_of_mass", "dpc"),
        summary="Integrated DPC phase (Fourier integration of the DPC field).",
        result="PhaseImage (rad when scan, detector and voltage are calibrated, else arb.)",
    ),
    PipelineOperation(
        "mean_diffraction",
        summary="The mean diffraction pattern.",
        result="DiffractionImage (counts per frame)",
    ),
    PipelineOperation(
        "max_diffraction",
        summary="The pixel-wise maximum pattern.",
        result="DiffractionImage (counts)",
    ),
    PipelineOperation(
        "sum_diffraction",
        summary="The summed pattern (integer sums widened).",
        result="DiffractionImage (counts)",
    ),
    PipelineOperation(
        "ssb",
        summary="Single-sideband ptychography: the complex transmission function over the scan.",
        result="ComplexObject (amplitude, phase in rad)",
    ),
)

#: The entry-point group third-party pipeline operations register in.
ENTRY_POINT_GROUP = "quantem_flow.operations"


def _make_operation(name: str, row: Any) -> PipelineOperation:
    """A declaration as it is (its name checked); an operator function as one taking a dataset."""
    if isinstance(row, PipelineOperation):
        if row.name != name:
            raise TypeError(f"it declares the operation {row.name!r}, not {name!r}")
        return row
    if callable(row) and hasattr(row, "__module__") and hasattr(row, "__qualname__"):
        return PipelineOperation(name, target=f"{row.__module__}:{row.__qualname__}")
    raise TypeError(f"it is neither a PipelineOperation nor an operator function: {row!r}")


#: Every operation a pipeline may name: the built-in rows of :data:`PIPELINE_OPERATIONS`,
#: then installed distributions' (group ``quantem_flow.operations``: an entry point named
#: after the ``op:`` value, loading to a :class:`PipelineOperation` or an operator function
#: ``f(dataset, *, keyword options..., name=None) -> LazyResult``), in one
#: :class:`~quantem_flow.plugins.Registry`, the mechanism every kind of extension shares.
OPERATION_REGISTRY: Registry[PipelineOperation] = Registry(
    "pipeline operation",
    ENTRY_POINT_GROUP,
    {op.name: op for op in PIPELINE_OPERATIONS},
    _make_operation,
)


def pipeline_operations() -> dict[str, PipelineOperation]:
    """``{op: declaration}`` of every registered operation (a broken plug-in left out, reported)."""
    out: dict[str, PipelineOperation] = {}
    for name in OPERATION_REGISTRY.names():
        try:
            out[name] = OPERATION_REGISTRY.get(name)
        except ParameterError:  # a broken plug-in: warned about and in OPERATION_REGISTRY.errors()
            continue
    return out


V = TypeVar("V")


class _Derived(Mapping[str, V]):
    """A read-only table derived from every registered operation, read when used."""

    def __init__(self, column: Callable[[PipelineOperation], V | None]) -> None:
        self._column = column

    def _table(self) -> dict[str, V]:
        rows = {name: self._column(op) for name, op in pipeline_operations().items()}
        return {name: v for name, v in rows.items() if v is not None}

    def __getitem__(self, key: str) -> V:
        return self._table()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._table())

    def __len__(self) -> int:
        return len(self._table())

    def __repr__(self) -> str:
        return repr(self._table())


#: Each operation by name (derived from the registry).
OPERATION_DECLARATIONS: Mapping[str, PipelineOperation] = _Derived(lambda op: op)

#: Every operation a pipeline output may name, with its allowed parameters (derived).
OPERATIONS: Mapping[str, tuple[str, ...]] = _Derived(lambda op: op.keys())

_REQUIRED: Mapping[str, tuple[str, ...]] = _Derived(lambda op: op.required() or None)

_FIELD_INPUTS: Mapping[str, tuple[str, ...]] = _Derived(lambda op: op.field_inputs or None)


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


def reader_path_options(fmt: str | None = None) -> frozenset[str]:
    """Options naming a file (annotated ``os.PathLike``), of ``fmt`` or of any reader.

    A pipeline resolves these, like ``input.path``, against its folder.
    """
    import inspect

    from ..io import reader_class, reader_names

    found: set[str] = set()
    for name in [fmt] if fmt is not None else [n for n in reader_names() if n != "memory"]:
        for p in inspect.signature(reader_class(name).__init__).parameters.values():
            if p.kind is inspect.Parameter.KEYWORD_ONLY and "PathLike" in str(p.annotation):
                found.add(p.name)
    return frozenset(found)


def _reader_options(fmt: str) -> tuple[str, ...]:
    """The keyword options of the reader ``fmt`` (from its signature), plus ``verify``."""
    import inspect

    from ..io import reader_class

    params = inspect.signature(reader_class(fmt).__init__).parameters.values()
    names = [p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY]
    return (*names, "verify")
