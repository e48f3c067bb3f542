"""Operators, lazy results and the one-pass contract.

An operator is a small declarative object.  A :class:`ChunkOperator` runs
over a dataset's chunks: at compute time it resolves its geometry (for
example the probe found from the mean pattern) and returns a
:class:`ChunkPlan` naming the detector weight maps and pattern reductions it
needs; the engine merges the plans of every operator over one dataset into
ONE pass, where each chunk is read and decoded once and one fused kernel
produces every weight's per-frame value and the patterns.  A
:class:`DerivedOperator` computes a result from other results (DPC, iDPC).

Operators know nothing of Dask or devices: the graph layer
(:mod:`quantem_flow.graphs`) registers the executor that
:meth:`LazyResult.compute` calls.
"""

from __future__ import annotations

import abc
import dataclasses
import os
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import numpy as np

from ..dataset import Dataset4D
from ..errors import ParameterError, QuantemFlowError
from ..provenance import Provenance
from ..results import Result

__all__ = [
    "ChunkOperator",
    "ChunkPlan",
    "DerivedOperator",
    "LazyResult",
    "Operator",
    "PassOutputs",
    "PlanContext",
    "dataset_provenance",
    "register_executor",
    "weight_key",
]


def weight_key(weights: np.ndarray) -> str:
    """Return a content key for a detector weight map (identical maps share a row)."""
    import xxhash  # XXH3: 40x SHA-256's speed on the 0.6 MB of a BF + ADF + CoM pass's maps

    a = np.ascontiguousarray(weights, dtype=np.float64)
    h = xxhash.xxh3_128(repr(a.shape).encode())
    h.update(a.reshape(-1).view(np.uint8).data)
    return str(h.hexdigest())[:24]


@dataclasses.dataclass
class ChunkPlan:
    """What one chunk operator needs from the pass, and how it finishes.

    Attributes
    ----------
    weights
        ``{key: (k_r, k_c) float64 map}``; the pass returns, per scan
        position, the sum of the frame times each map.
    want_sum, want_max
        Also accumulate the sum / maximum diffraction pattern.
    parameters
        Resolved parameters (units, geometry, mask identities, probe
        estimate) for provenance.
    finalize
        Turns the pass outputs into the typed result.
    radial
        Geometry hints of disk and annulus maps (see the attribute).
    gather
        Flat detector pixel indices whose values the pass should extract
        for every scan position (for example the bright-field pixels SSB
        needs), or ``None``.
    """

    weights: dict[str, np.ndarray]
    want_sum: bool
    want_max: bool
    parameters: dict[str, Any]
    finalize: Callable[[PassOutputs], Result]
    gather: np.ndarray | None = None
    #: ``{weight key: (centre row, centre col, pixel scale row, pixel scale col)}`` for maps
    #: that are ``inner <= distance < outer`` around that centre (disks, annuli): a hint that
    #: lets a persisted query answer them from a radial index (graphs/radial_query.py, which
    #: checks every map against it before use)
    radial: dict[str, tuple[float, float, float, float]] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class PassOutputs:
    """Everything one pass over a dataset produced.

    Attributes
    ----------
    per_frame
        ``{weight key: (R_r, R_c) float64}``.
    pattern_sum
        ``(k_r, k_c)`` sum over all frames, or ``None``.
    pattern_max
        ``(k_r, k_c)`` maximum over all frames, or ``None``.
    n_frames
        Frames the pass covered.
    execution
        Backend choice, scheduler, per-chunk records, bytes read.
    timings
        Wall-clock seconds of the stages.
    """

    per_frame: dict[str, np.ndarray]
    pattern_sum: np.ndarray | None
    pattern_max: np.ndarray | None
    n_frames: int
    execution: dict[str, Any]
    timings: dict[str, float]
    #: ``(n_pixels, R_r, R_c)`` extracted pixel values in the data's dtype
    #: (a disk-backed memory map when large), for :attr:`ChunkPlan.gather`.
    gathered: Any = None
    #: the sorted unique flat pixel indices of ``gathered``'s first axis
    gather_indices: np.ndarray | None = None
    #: :func:`dataset_provenance` of each dataset the pass's results finished on, made
    #: once per pass (the source's identity asks the filesystem) and copied per result
    dataset_records: list[tuple[Dataset4D, dict[str, Any]]] = dataclasses.field(
        default_factory=list, repr=False
    )

    def dataset_record(self, ds: Dataset4D) -> dict[str, Any]:
        """A copy of :func:`dataset_provenance` of ``ds``, made once per pass.

        Results of one pass describe the same source as it was when the pass
        ended; each result gets its own dicts and lists, so changing one
        result's provenance leaves the others as they were.
        """
        record = next((r for seen, r in self.dataset_records if seen is ds), None)
        if record is None:
            record = dataset_provenance(ds)
            self.dataset_records.append((ds, record))
        copied: dict[str, Any] = _containers_copied(record)
        return copied


def _containers_copied(value: Any) -> Any:
    """``value`` with its dicts and lists new, nested ones too (not those inside tuples).

    Other values are shared, as the source gives them.

    A third of ``copy.deepcopy``'s time on a ``.npy`` dataset's record (19 against 62 us
    in a quiet loop, several times that in a pass beside a cluster; fifteenth stop).
    """
    if isinstance(value, dict):
        return {k: _containers_copied(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_containers_copied(v) for v in value]
    return value


class PlanContext:
    """What an operator may ask for while planning at compute time.

    Parameters
    ----------
    dataset
        The dataset the pass runs over.
    probe_provider
        Callable returning a probe estimate for the dataset; the executor
        computes it at most once per dataset and computation.
    """

    def __init__(self, dataset: Dataset4D, probe_provider: Callable[[], Any]):
        self.dataset = dataset
        self._probe_provider = probe_provider
        self._probe: Any = None

    def probe(self) -> Any:
        """Return the :class:`~quantem_flow.operators.probe.ProbeEstimate` of the dataset."""
        if self._probe is None:
            self._probe = self._probe_provider()
        return self._probe


class Operator(abc.ABC):
    """Base of every operator."""

    name: ClassVar[str] = "operator"

    @abc.abstractmethod
    def parameters(self) -> dict[str, Any]:
        """Return the parameters as given (JSON-ready) for provenance."""


class ChunkOperator(Operator):
    """An operator that runs over the chunks of one dataset."""

    #: Each scan position's value depends only on that position's frame once the plan
    #: is fixed, and the plan needs nothing but the parameters and the calibration
    #: unless it asks the context for a probe estimate.  A live scan then computes it
    #: over new scan rows alone and joins the blocks (streams/live_results.py); the
    #: joined result equals one pass over all rows bit for bit.
    scan_local: ClassVar[bool] = False

    def validate(self, ds: Dataset4D) -> None:
        """Raise at build time if the operator cannot run on ``ds`` (reads nothing)."""

    @abc.abstractmethod
    def plan(self, ctx: PlanContext) -> ChunkPlan:
        """Resolve geometry and return what the pass must compute."""


class DerivedOperator(Operator):
    """An operator computed from other results, after their passes."""

    @abc.abstractmethod
    def finalize(self, inputs: Sequence[Result]) -> Result:
        """Compute the result from the results of :attr:`LazyResult.dependencies`."""


Executor = Callable[..., Any]
_EXECUTOR: list[Executor] = []


def register_executor(executor: Executor) -> None:
    """Register the function :meth:`LazyResult.compute` delegates to.

    The graph layer registers :func:`quantem_flow.graphs.execute.compute` on
    import, so that operators never import the layer above them.
    """
    _EXECUTOR[:] = [executor]


class LazyResult:
    """A result that has not been computed yet.

    Parameters
    ----------
    operator
        What to compute.
    dataset
        The dataset a :class:`ChunkOperator` runs over (``None`` for derived
        operators).
    dependencies
        Lazy results a :class:`DerivedOperator` needs.
    name
        A short label (``"bf"``...), used in saved files.
    """

    def __init__(
        self,
        operator: Operator,
        *,
        dataset: Dataset4D | None = None,
        dependencies: Sequence[LazyResult] = (),
        name: str = "",
    ):
        if isinstance(operator, ChunkOperator) and dataset is None:
            raise ParameterError(f"{operator.name} runs over a dataset; none was given")
        if isinstance(operator, DerivedOperator) and not dependencies:
            raise ParameterError(f"{operator.name} needs input results; none were given")
        if isinstance(operator, ChunkOperator) and dataset is not None:
            operator.validate(dataset)
        self.operator = operator
        self.dataset = dataset
        self.dependencies = tuple(dependencies)
        self.name = name or operator.name

    def compute(self, **options: Any) -> Result:
        """Compute this result; options as for :func:`quantem_flow.compute`."""
        if not _EXECUTOR:
            raise QuantemFlowError(
                "no executor is registered; import quantem_flow (not only its submodules)"
            )
        result: Result = _EXECUTOR[0](self, **options)
        return result

    def __repr__(self) -> str:
        where = (
            f"over {self.dataset!r}"
            if self.dataset is not None
            else (f"from {[d.name for d in self.dependencies]}")
        )
        return f"LazyResult({self.operator.name!r}, name={self.name!r}, {where})"


def _resolved(path: str) -> str:
    """``path`` absolute with every symlink resolved (as it is now)."""
    return os.path.realpath(os.path.expanduser(path))


def dataset_provenance(ds: Dataset4D) -> dict[str, Any]:
    """Return the dataset-dependent fields of :class:`Provenance` as keyword arguments.

    The source's paths are recorded three ways: ``paths`` as the reader
    found them, ``paths_given`` (the path passed to ``open``, exactly as
    given) and ``paths_resolved`` (absolute, every symlink resolved).
    """
    identity = ds.source.identity.to_dict()
    given = getattr(ds.source, "opened_as", None)
    return {
        "source": {
            **identity,
            "paths_given": [] if given is None else [str(given)],
            "paths_resolved": [_resolved(str(p)) for p in identity.get("paths", [])],
            "shape": list(ds.source.shape),
            "dtype": str(ds.source.dtype),
            "metadata": ds.source.metadata,
        },
        "dataset": ds.describe(),
        "transforms": ds.transforms,
        "flags": ds.flags,
        "notes": ds.notes,
    }


def make_provenance(
    ds: Dataset4D,
    *,
    operator: str,
    parameters: dict[str, Any],
    outputs: PassOutputs,
    accumulation_dtype: str | None,
    notes: Sequence[str] = (),
) -> Provenance:
    """Build the provenance of a chunk operator's result."""
    parts = outputs.dataset_record(ds)
    parts["notes"] = [*parts["notes"], *notes]
    digest = outputs.execution.get("content_digest")
    if digest is not None:  # the bytes this result was computed from (docs/data-integrity.md)
        parts["source"]["content_digest"] = digest
    return Provenance(
        operator=operator,
        parameters=parameters,
        accumulation_dtype=accumulation_dtype,
        execution=outputs.execution,
        timings=dict(outputs.timings),
        **parts,
    )
