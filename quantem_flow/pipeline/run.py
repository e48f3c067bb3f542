"""Running a pipeline: checks before any pixel is read, one compute, the files it saves."""

from __future__ import annotations

import dataclasses
import json
import os
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..dataset import Dataset4D
from ..errors import (
    OverwriteError,
    ParameterError,
    QuantemFlowError,
)
from ..operators.base import LazyResult
from ..provenance import jsonable
from ..results import Result
from .loading import load_pipeline
from .model import Pipeline
from .schema import SaveTargets


def _connect(client: Any) -> tuple[Any, bool]:
    """Return a client for ``compute`` and whether this module must close it."""
    from ..graphs.runner import in_process

    if isinstance(client, str) and not in_process(client):
        if not client.startswith(("tcp://", "tls://", "inproc://", "ucx://", "ws://", "wss://")):
            raise ParameterError(
                f"client must be None (embedded local cluster), 'synchronous', 'threads', a "
                f"distributed.Client or a scheduler address such as tcp://127.0.0.1:8786; got "
                f"{client!r}"
            )
        from distributed import Client

        return Client(client, set_as_default=False), True
    return client, False


def check_outputs(pipe: Pipeline, targets: SaveTargets, ds: Any) -> None:
    """Refuse outputs that are the input (or hold it) or existing files not ours."""
    from ..io.results_store import check_replaceable

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

    from ..operators.base import ChunkOperator, PlanContext

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
    dataset: Dataset4D | None = None,
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
    dataset
        The input already opened (a live acquisition's view), used instead
        of the pipeline's ``input`` (its transforms are applied).

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
    ds = pipe.open() if dataset is None else pipe.apply_transforms(dataset)
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
        ``None`` (the embedded local cluster on 127.0.0.1), ``"synchronous"`` or
        ``"threads"`` (this process, one thread or one per CPU),
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
    from ..graphs import compute

    if isinstance(pipeline, PreparedRun):
        if output_dir is not None or overwrite is not None:
            raise ParameterError(
                "output_dir and overwrite were already given to prepare_pipeline; call "
                "run_pipeline(prepared) without them, or prepare the pipeline again"
            )
        prepared = pipeline
    else:
        prepared = prepare_pipeline(pipeline, output_dir=output_dir, overwrite=overwrite)
    pipe, lazy = prepared.pipeline, prepared.lazy
    compute_client, close_after = _connect(client)
    try:
        if isinstance(compute_client, str):
            computed = compute(*lazy.values(), client=compute_client, progress=progress)
        else:
            current = compute_client
            if current is None:  # compute() uses (and records) the embedded cluster
                from ..graphs import embedded_client

                current = embedded_client()
            # the progress bar's as_completed() looks up the *current* client
            with current.as_current():
                computed = compute(*lazy.values(), client=compute_client, progress=progress)
    except QuantemFlowError as exc:
        raise pipe.error(exc, "") from exc
    finally:
        if close_after:
            compute_client.close()
    return save_pipeline_results(prepared, computed)


def save_pipeline_results(prepared: PreparedRun, computed: Sequence[Result]) -> dict[str, Result]:
    """Name a pipeline's computed results and write the files it asks for.

    Parameters
    ----------
    prepared
        The run (:func:`prepare_pipeline`).
    computed
        One result per output, in the pipeline's order (computed from
        ``prepared.lazy``, or over a live acquisition by the same build).

    Returns
    -------
    dict of str to Result
        ``{output name: result}``; every provenance names the pipeline and output.
    """
    from ..io.results_store import results_to_json, save_results
    from ..operators.display import save_png

    pipe, targets, replace = prepared.pipeline, prepared.targets, prepared.overwrite
    if len(computed) != len(pipe.outputs):
        raise ParameterError(
            f"pipeline {pipe.origin} has {len(pipe.outputs)} outputs; {len(computed)} results "
            "were given"
        )
    results: dict[str, Result] = {}
    for name, result in zip(pipe.outputs, computed, strict=True):
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
