"""Dataset4D: a lazy, chunked, calibrated 4D-STEM dataset, and :func:`open`.

Opening reads metadata only.  Regions and binning are lazy views: they are
recorded as transforms and applied to each chunk as it is loaded on a
worker.  Chunks are blocks of whole scan rows, sized by ``chunk_mib``
(logical, decoded MiB read per chunk).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from . import config
from .calibration import Calibration
from .errors import DtypeError, ParameterError, ShapeError
from .io import Source, open_source_explained
from .io.base import sidecar_calibration
from .representations import get_representation
from .representations.base import describe_options
from .representations.detector_ops import DetectorOp, bin_frames, binned_dtype
from .representations.stored import StoredFrames

__all__ = ["Dataset4D", "DetectorOp", "bin_frames", "binned_dtype", "open"]

Region = tuple[int, int, int, int]


def _check_region(region: Sequence[int], shape: tuple[int, int], what: str) -> Region:
    try:
        r0, r1, c0, c1 = (int(v) for v in region)
    except (TypeError, ValueError) as exc:
        raise ParameterError(
            f"{what} must be (row_start, row_stop, col_start, col_stop), got {region!r}"
        ) from exc
    if not (0 <= r0 < r1 <= shape[0] and 0 <= c0 < c1 <= shape[1]):
        raise ShapeError(
            f"{what} {(r0, r1, c0, c1)} is empty or outside the {shape[0]} x {shape[1]} extent; "
            "regions are half-open (row_start, row_stop, col_start, col_stop)"
        )
    return (r0, r1, c0, c1)


def _region_of(
    region: Sequence[int] | None,
    rows: Sequence[int] | None,
    cols: Sequence[int] | None,
    shape: tuple[int, int],
    what: str,
) -> Sequence[int]:
    """A region given as one sequence or as ``rows=``/``cols=`` pairs, as one sequence."""
    if region is not None:
        if rows is not None or cols is not None:
            raise ParameterError(
                f"{what} takes a region (r0, r1, c0, c1) or rows=/cols=, not both; got "
                f"region={region!r}, rows={rows!r}, cols={cols!r}"
            )
        return region
    if rows is None and cols is None:
        raise ParameterError(
            f"{what} needs a region: rows=(start, stop) and/or cols=(start, stop), or "
            "(row_start, row_stop, col_start, col_stop); half-open, in pixels"
        )
    pairs: list[int] = []
    for name, pair, size in (("rows", rows, shape[0]), ("cols", cols, shape[1])):
        if pair is None:
            pairs.extend((0, size))
            continue
        try:
            start, stop = (int(v) for v in pair)
        except (TypeError, ValueError) as exc:
            raise ParameterError(f"{what}: {name} must be (start, stop), got {pair!r}") from exc
        pairs.extend((start, stop))
    return pairs


class Dataset4D:
    """A lazy 4D-STEM dataset ``I[R_r, R_c, k_r, k_c]``.

    Build one with :func:`open`.  Every method returns a new dataset; nothing
    is read until a computation runs.

    Parameters
    ----------
    source
        The opened input.
    calibration
        Axis calibration of the source.
    chunk_rows
        Scan rows per chunk; ``None`` sizes chunks to ``chunk_mib``.
    chunk_mib
        Target logical MiB per chunk (default ``config.get("chunk_mib")``).
    """

    def __init__(
        self,
        source: Source,
        *,
        calibration: Calibration | None = None,
        chunk_rows: int | None = None,
        chunk_mib: float | None = None,
        notes: Sequence[str] = (),
        _scan_block: Region | None = None,
        _detector_ops: tuple[DetectorOp, ...] = (),
        _resident: Any = None,
        _representation: str | None = None,
        _representation_options: dict[str, Any] | None = None,
        _opened: Mapping[str, Any] | None = None,
    ):
        self._source = source
        self._opened = dict(_opened or {})
        R, C, kr, kc = source.shape
        self._scan_block: Region = _scan_block or (0, R, 0, C)
        self._detector_ops = _detector_ops
        self._calibration = calibration or Calibration()
        self._notes = list(notes)
        self._resident = _resident
        self._representation = _representation or source.native_representation
        self._representation_options = dict(_representation_options or {})
        self._chunk_mib = float(chunk_mib if chunk_mib is not None else config.get("chunk_mib"))
        if not self._chunk_mib > 0:
            raise ParameterError(f"chunk_mib must be > 0, got {chunk_mib!r}")
        if chunk_rows is not None and int(chunk_rows) < 1:
            raise ParameterError(f"chunk_rows must be >= 1, got {chunk_rows!r}")
        self._chunk_rows_requested = None if chunk_rows is None else int(chunk_rows)
        # detector shape and dtype after transforms
        shape: tuple[int, int] = (kr, kc)
        dtype = source.dtype
        for op in self._detector_ops:
            if op.kind == "crop":
                shape = (op.params[1] - op.params[0], op.params[3] - op.params[2])
            else:
                shape = (-(-shape[0] // op.params[0]), -(-shape[1] // op.params[1]))
                dtype = binned_dtype(dtype)
        self._detector_shape = shape
        self._dtype = np.dtype(dtype)

    # -- description -------------------------------------------------------------
    @property
    def source(self) -> Source:
        """The input this dataset reads."""
        return self._source

    @property
    def shape(self) -> tuple[int, int, int, int]:
        """``(R_r, R_c, k_r, k_c)`` after regions and binning."""
        r0, r1, c0, c1 = self._scan_block
        return (r1 - r0, c1 - c0, *self._detector_shape)

    @property
    def scan_shape(self) -> tuple[int, int]:
        """``(R_r, R_c)``."""
        return self.shape[0], self.shape[1]

    @property
    def detector_shape(self) -> tuple[int, int]:
        """``(k_r, k_c)``."""
        return self._detector_shape

    @property
    def dtype(self) -> np.dtype[Any]:
        """Dtype of loaded chunks (widened after binning)."""
        return self._dtype

    @property
    def nbytes(self) -> int:
        """Logical bytes of the dataset as loaded."""
        return int(math.prod(self.shape)) * self._dtype.itemsize

    @property
    def read_nbytes(self) -> int:
        """Logical (decoded) source bytes a full pass reads."""
        r0, r1, c0, c1 = self._scan_block
        kr, kc = self._source.shape[2:]
        return (r1 - r0) * (c1 - c0) * kr * kc * self._source.dtype.itemsize

    @property
    def calibration(self) -> Calibration:
        """Calibration of the axes as loaded."""
        return self._calibration

    @property
    def representation(self) -> str:
        """Payload representation of the chunks (``dense``, ``encoded``, ``paired``, ``packed``)."""
        return self._representation

    @property
    def representation_options(self) -> dict[str, Any]:
        """Options of the representation (codec, threshold, block size, verify...)."""
        return dict(self._representation_options)

    @property
    def storage_schema(self) -> str:
        """Versioned layout of the chunk payloads."""
        return get_representation(self._representation).schema

    @property
    def scan_block(self) -> Region:
        """Source scan region ``(r0, r1, c0, c1)`` this dataset covers."""
        return self._scan_block

    @property
    def detector_ops(self) -> tuple[DetectorOp, ...]:
        """Lazy detector transforms, in order."""
        return self._detector_ops

    @property
    def notes(self) -> list[str]:
        """Explicit choices made while opening (recorded in provenance)."""
        return [*self._source.notes, *self._notes]

    @property
    def transforms(self) -> list[dict[str, Any]]:
        """Every region and binning applied, in order, for provenance."""
        out: list[dict[str, Any]] = []
        R, C = self._source.shape[:2]
        if self._scan_block != (0, R, 0, C):
            out.append({"transform": "scan_region", "region": list(self._scan_block)})
        out.extend(op.to_dict() for op in self._detector_ops)
        threshold = self._representation_options.get("threshold")
        if threshold is not None:
            out.append(
                {
                    "transform": "threshold",
                    "threshold": threshold,
                    "representation": self._representation,
                    "lossless": False,
                    "rule": "values below the threshold set to 0",
                }
            )
        return out

    @property
    def flags(self) -> dict[str, bool]:
        """``native``, ``cropped`` and ``binned`` flags."""
        kinds = {t["transform"] for t in self.transforms}
        cropped = bool(kinds & {"scan_region", "detector_region"})
        binned = "bin_detector" in kinds
        thresholded = "threshold" in kinds
        return {
            "native": not (cropped or binned or thresholded),
            "cropped": cropped,
            "binned": binned,
            "thresholded": thresholded,
        }

    @property
    def chunk_rows(self) -> int:
        """Scan rows per chunk."""
        rows = self.shape[0]
        if self._chunk_rows_requested is not None:
            return min(self._chunk_rows_requested, rows)
        kr, kc = self._source.shape[2:]
        row_bytes = self.shape[1] * kr * kc * self._source.dtype.itemsize
        target = max(1, min(rows, int(self._chunk_mib * 2**20 // max(row_bytes, 1))))
        unit = self._source.row_chunk_multiple
        if unit is not None and unit > 0 and self._scan_block[0] % unit == 0:
            # whole stored row chunks per task: none is read (or computed) twice
            return min(rows, max(unit, target // unit * unit))
        return target

    @property
    def chunks(self) -> list[tuple[int, int]]:
        """Half-open scan-row ranges of the chunks, in dataset rows."""
        step = self.chunk_rows
        rows = self.shape[0]
        return [(r, min(r + step, rows)) for r in range(0, rows, step)]

    def describe(self) -> dict[str, Any]:
        """Return a JSON-ready description (for provenance and ``info``)."""
        return {
            "shape": list(self.shape),
            "dtype": str(self._dtype),
            "source_dtype": str(self._source.dtype),
            "representation": self.representation,
            "representation_options": describe_options(self._representation_options),
            "storage_schema": self.storage_schema,
            "chunk_rows": self.chunk_rows,
            "n_chunks": len(self.chunks),
            "nbytes": self.nbytes,
            "calibration": self._calibration.to_dict(),
            **self._opened,
        }

    def __repr__(self) -> str:
        return (
            f"Dataset4D(shape={self.shape}, dtype={self._dtype}, format={self._source.format!r}, "
            f"chunks={len(self.chunks)} x {self.chunk_rows} rows, representation="
            f"{self.representation!r}, native={self.flags['native']}"
            f"{', persisted' if self._resident is not None else ''})"
        )

    def _repr_html_(self) -> str:
        """The summary a Jupyter notebook shows (reads no frame)."""
        from .html_repr import dataset_html

        path = getattr(self._source, "path", None) or self._source.opened_as or "in memory"
        text = dataset_html(self.describe(), path=str(path), format=self._source.format)
        if self._resident is not None:
            text = text.replace("(lazy: nothing read to show this)", "(persisted on the cluster)")
        return text

    # -- derived datasets ---------------------------------------------------------
    def _derive(self, **changes: Any) -> Dataset4D:
        kwargs: dict[str, Any] = {
            "calibration": self._calibration,
            "chunk_rows": self._chunk_rows_requested,
            "chunk_mib": self._chunk_mib,
            "notes": self._notes,
            "_scan_block": self._scan_block,
            "_detector_ops": self._detector_ops,
            "_representation": self._representation,
            "_representation_options": self._representation_options,
            "_opened": self._opened,
        }
        kwargs.update(changes)
        return type(self)(self._source, **kwargs)

    def with_calibration(self, calibration: Calibration | None = None, **fields: Any) -> Dataset4D:
        """Return the dataset with a new calibration (of the axes as loaded).

        A persisted dataset stays persisted: the calibration does not change
        the chunks.

        Parameters
        ----------
        calibration
            A full calibration, or ``None`` to change only ``fields``.
        **fields
            Fields of :class:`Calibration` to replace.
        """
        cal = calibration or self._calibration
        if fields:
            cal = cal.replace(**fields)
        opened = dict(self._opened)
        if cal != self._calibration:
            opened.update(_override_record(self._calibration, cal, opened.get("calibration_from")))
            opened["calibration_from"] = "given (with_calibration)"
        return self._derive(calibration=cal, _resident=self._resident, _opened=opened)

    # -- residency -----------------------------------------------------------------------
    def persist(self, *, client: Any = None, backend: str = "auto") -> Dataset4D:
        """Load every chunk once and keep it resident on the workers.

        Later computations on the returned dataset read no file: their
        kernels run on the resident chunks, pinned to the worker that holds
        each one.  Crops, binning and rechunking of a persisted dataset give
        a dataset that reads from the source again (the resident chunks
        no longer match); :meth:`with_calibration` keeps residency.

        Parameters
        ----------
        client
            As for :func:`quantem_flow.compute`: ``None`` (embedded local
            cluster), a ``distributed.Client``, or ``"synchronous"`` or
            ``"threads"`` (chunks kept in this process; either may compute
            them).
        backend
            Runtime the chunks are resident for (``"auto"`` or a name): the
            payload lives where that runtime computes (host for ``cpu``).

        Returns
        -------
        Dataset4D
            The same dataset, persisted.
        """
        if not _PERSIST_HOOK:
            raise RuntimeError("no persist hook registered; import quantem_flow")
        result: Dataset4D = _PERSIST_HOOK[0](self, client=client, backend=backend)
        return result

    @property
    def resident(self) -> Any:
        """The resident chunks of a persisted dataset (``None`` if not persisted)."""
        return self._resident

    @property
    def is_persisted(self) -> bool:
        """Whether every chunk is held resident on the workers."""
        return self._resident is not None

    def release(self) -> Dataset4D:
        """Drop the resident chunks and return the dataset reading from its source."""
        if self._resident is not None:
            self._resident.release()
        return self._derive()

    def to_representation(
        self, representation: str, *, verify: str = "full", **options: Any
    ) -> Dataset4D:
        """Return the dataset with its chunks held in another representation.

        Conversion is explicit and lossless: each chunk is converted when it
        is loaded (or read natively when the source stores that
        representation) and, when converted, checked for exactness.

        Parameters
        ----------
        representation
            ``"dense"``, ``"encoded"``, ``"paired"`` or ``"packed"``.
        verify
            ``"full"`` (every value compared after the conversion),
            ``"totals"`` (total and non-zero count compared) or ``"none"``;
            recorded in provenance.  Native reads need no check.
        **options
            Representation options, e.g. ``threshold=`` for ``paired`` (only
            when asked: values below it are dropped, which is not lossless
            and is recorded), ``codec=`` for ``encoded``, ``block_values=``
            for ``packed``.

        Returns
        -------
        Dataset4D
            The same data in the new representation (lazy).
        """
        get_representation(representation)  # fail now on an unknown name
        if verify not in ("full", "totals", "none"):
            raise ParameterError(f"verify must be 'full', 'totals' or 'none', got {verify!r}")
        return self._derive(
            _representation=representation,
            _representation_options={**options, "verify": verify},
        )

    def load_payload(
        self, rows: tuple[int, int], *, buffer: np.ndarray | None = None
    ) -> tuple[Any, dict[str, Any]]:
        """Load one chunk in the dataset's representation (eager).

        Parameters
        ----------
        rows
            Half-open scan-row range in this dataset's coordinates.
        buffer
            For dense data: a staging array of :meth:`raw_block_shape` and
            the source dtype to decode into (see :meth:`load_block`).

        Returns
        -------
        tuple
            The payload and a record of how it was made (native read or
            conversion, the exactness check, physical bytes).
        """
        rep = get_representation(self._representation)
        opts = dict(self._representation_options)
        verify = str(opts.pop("verify", "full"))
        if self._representation == "dense":
            block = self.load_block(rows, buffer=buffer)
            return block, {"made": "dense read", "payload_bytes": int(block.nbytes)}
        C = self.scan_shape[1]
        b = self._scan_block
        if self._representation in self._source.payload_representations:
            payload = self._source.read_payload(
                self._representation, (b[0] + rows[0], b[0] + rows[1]), (b[2], b[2] + C), **opts
            )
            payload = rep.apply_detector_ops(payload, self._detector_ops)
            made: dict[str, Any] = {"made": f"native {self._source.format} read"}
        else:
            block = self.load_block(rows, apply_threshold=False)
            payload = rep.from_dense(block, **opts)
            made = {"made": "converted from dense"}
            if verify != "none":
                made["check"] = rep.check(block, payload, full=verify == "full")
        made["payload_bytes"] = int(payload.nbytes)
        describe = getattr(payload, "describe", None)
        if callable(describe):
            made["payload"] = describe()  # codec, layout: recorded in provenance
        return payload, made

    def for_resident_tasks(self) -> Dataset4D:
        """The dataset as tasks on its resident chunks need it, without data they never read.

        The same description (shape, dtype, chunks, calibration, representation,
        identity) over :meth:`Source.for_resident_tasks`: a persisted in-memory
        dataset's queries then ship no copy of the array to the workers.
        """
        source = self._source.for_resident_tasks()
        if source is self._source:
            return self
        kwargs: dict[str, Any] = {
            "calibration": self._calibration,
            "chunk_rows": self._chunk_rows_requested,
            "chunk_mib": self._chunk_mib,
            "notes": self._notes,
            "_scan_block": self._scan_block,
            "_detector_ops": self._detector_ops,
            "_representation": self._representation,
            "_representation_options": self._representation_options,
            "_opened": self._opened,
            "_resident": self._resident,  # on the client; never pickled (__getstate__)
        }
        return type(self)(source, **kwargs)

    def _with_resident(self, resident: Any) -> Dataset4D:
        return self._derive(_resident=resident)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_resident"] = None  # futures and in-process chunks never travel
        return state

    def rechunk(self, *, rows: int | None = None, mib: float | None = None) -> Dataset4D:
        """Return the dataset with another chunking (``rows`` per chunk or ``mib`` per chunk)."""
        if rows is not None and mib is not None:
            raise ParameterError("give rows or mib, not both")
        return self._derive(chunk_rows=rows, chunk_mib=mib if mib is not None else self._chunk_mib)

    def crop_scan(
        self,
        region: Sequence[int] | None = None,
        *,
        rows: Sequence[int] | None = None,
        cols: Sequence[int] | None = None,
    ) -> Dataset4D:
        """Keep a half-open scan region.

        Parameters
        ----------
        region
            ``(row_start, row_stop, col_start, col_stop)`` scan positions.
        rows, cols
            Or the same as keywords: ``rows=(r0, r1)``, ``cols=(c0, c1)``; an
            axis not given is kept whole.

        Returns
        -------
        Dataset4D
            The lazy view (nothing is read).
        """
        box = _region_of(region, rows, cols, self.scan_shape, "crop_scan")
        r0, r1, c0, c1 = _check_region(box, self.scan_shape, "scan region")
        b = self._scan_block
        return self._derive(_scan_block=(b[0] + r0, b[0] + r1, b[2] + c0, b[2] + c1))

    def crop_detector(
        self,
        region: Sequence[int] | None = None,
        *,
        rows: Sequence[int] | None = None,
        cols: Sequence[int] | None = None,
    ) -> Dataset4D:
        """Keep a half-open detector region (the calibration's origin follows).

        Parameters
        ----------
        region
            ``(row_start, row_stop, col_start, col_stop)`` detector pixels.
        rows, cols
            Or the same as keywords: ``rows=(r0, r1)``, ``cols=(c0, c1)``; an
            axis not given is kept whole.

        Returns
        -------
        Dataset4D
            The lazy view (nothing is read).
        """
        box = _region_of(region, rows, cols, self.detector_shape, "crop_detector")
        r = _check_region(box, self.detector_shape, "detector region")
        cal = self._calibration.detector_cropped(r[0], r[2])
        return self._derive(
            _detector_ops=(*self._detector_ops, DetectorOp("crop", r)), calibration=cal
        )

    def bin_detector(self, factor: int | Sequence[int]) -> Dataset4D:
        """Sum ``factor`` x ``factor`` detector pixels (count-preserving, widened).

        Partial edge bins are kept: a detector of 130 pixels binned by 4 has
        33 bins, the last summing 2 pixels.  Integer data widen to 32 bits
        (64 from 32-bit input), floats to float64.
        """
        f = (
            (int(factor), int(factor))
            if isinstance(factor, (int, np.integer))
            else tuple(int(v) for v in factor)
        )
        if len(f) != 2 or min(f) < 1:
            raise ParameterError(
                f"bin factor must be a positive integer or (row, col), got {factor!r}"
            )
        if f == (1, 1):
            return self
        if self._dtype.kind not in "uif":
            raise DtypeError(f"cannot bin dtype {self._dtype}")
        cal = self._calibration.detector_binned((f[0], f[1]))
        return self._derive(
            _detector_ops=(*self._detector_ops, DetectorOp("bin", (f[0], f[1]))), calibration=cal
        )

    # -- reading ---------------------------------------------------------------------
    def raw_block_shape(
        self, rows: tuple[int, int], cols: tuple[int, int] | None = None
    ) -> tuple[int, int, int, int]:
        """Shape of the source block :meth:`load_block` reads before detector transforms."""
        c0, c1 = cols if cols is not None else (0, self.shape[1])
        kr, kc = self._source.shape[2:]
        return (rows[1] - rows[0], c1 - c0, kr, kc)

    def block_bytes(
        self, rows: tuple[int, int], cols: tuple[int, int] | None = None
    ) -> tuple[Path, int] | None:
        """``(file, byte offset)`` where this block's frames are stored as they read, else ``None``.

        Only a view that changes nothing (no detector crop or bin, no
        threshold, the source's dtype) of a source storing the block as one
        run of native-order bytes (:meth:`Source.block_bytes`) has one.
        """
        if not self.is_plain_view:
            return None
        C = self.scan_shape[1]
        c0, c1 = cols if cols is not None else (0, C)
        b = self._scan_block
        return self._source.block_bytes((b[0] + rows[0], b[0] + rows[1]), (b[2] + c0, b[2] + c1))

    @property
    def is_plain_view(self) -> bool:
        """Whether the values are the source's as read.

        No detector crop or bin, no threshold, the source's dtype.
        """
        return (
            not self._detector_ops
            and self._representation_options.get("threshold") is None
            and self._dtype == self._source.dtype
        )

    def stored_block(
        self,
        rows: tuple[int, int],
        cols: tuple[int, int] | None = None,
        *,
        buffer: np.ndarray | None = None,
    ) -> StoredFrames:
        """The source's frames of a scan block as stored, undecoded (scan order).

        For sources with a :attr:`~quantem_flow.io.base.Source.stored_frames_codec`;
        the detector transforms are not applied (:meth:`transform_block` does, on
        the decoded values).
        """
        C = self.scan_shape[1]
        c0, c1 = cols if cols is not None else (0, C)
        b = self._scan_block
        return self._source.stored_block(
            (b[0] + rows[0], b[0] + rows[1]), (b[2] + c0, b[2] + c1), buffer=buffer
        )

    def transform_block(self, block: np.ndarray, *, apply_threshold: bool = True) -> np.ndarray:
        """Apply the detector transforms, threshold and dtype to a raw ``(..., k_r, k_c)`` block."""
        for op in self._detector_ops:
            block = op.apply(block)
        threshold = self._representation_options.get("threshold")
        if threshold is not None and apply_threshold:
            # the dense view of a thresholded dataset shows what its payloads hold
            block = np.where(block >= threshold, block, np.zeros((), dtype=block.dtype))
        return np.ascontiguousarray(block, dtype=self._dtype)

    def load_block(
        self,
        rows: tuple[int, int],
        cols: tuple[int, int] | None = None,
        *,
        buffer: np.ndarray | None = None,
        apply_threshold: bool = True,
    ) -> np.ndarray:
        """Read and transform a block of scan positions (eager).

        Parameters
        ----------
        rows, cols
            Half-open ranges in this dataset's scan coordinates; ``cols``
            defaults to all columns.
        buffer
            Optional staging array of :meth:`raw_block_shape` and the source
            dtype to decode into (see :meth:`Source.read`).
        apply_threshold
            Apply a representation's ``threshold=`` option (values below it
            read as 0), so the dense view matches the payloads.

        Returns
        -------
        numpy.ndarray
            ``(rows, cols, k_r, k_c)`` C-contiguous in :attr:`dtype`.
        """
        R, C = self.scan_shape
        c0, c1 = cols if cols is not None else (0, C)
        r0, r1 = rows
        if not (0 <= r0 < r1 <= R and 0 <= c0 < c1 <= C):
            raise ShapeError(f"block rows={rows} cols={cols} outside the scan of shape {(R, C)}")
        b = self._scan_block
        block = self._source.read((b[0] + r0, b[0] + r1), (b[2] + c0, b[2] + c1), buffer=buffer)
        return self.transform_block(block, apply_threshold=apply_threshold)

    def frame(self, row: int, col: int) -> np.ndarray:
        """Read one diffraction pattern (eager)."""
        return np.asarray(self.load_block((row, row + 1), (col, col + 1))[0, 0])

    def to_dask(self) -> Any:
        """Return a plain ``dask.array.Array`` over the chunks, for interoperability."""
        import dask.array as da
        from dask.highlevelgraph import HighLevelGraph
        from dask.task_spec import Task
        from dask.tokenize import tokenize

        name = "qf-dataset-" + tokenize(
            self._source.identity, self._scan_block, self._detector_ops, self.chunk_rows
        )
        dsk: dict[Any, Any] = {}
        for i, (r0, r1) in enumerate(self.chunks):
            key = (name, i, 0, 0, 0)
            dsk[key] = Task(key, _load_block, self, r0, r1)
        graph = HighLevelGraph.from_collections(name, dsk, dependencies=())
        chunks = (
            tuple(r1 - r0 for r0, r1 in self.chunks),
            (self.shape[1],),
            (self.shape[2],),
            (self.shape[3],),
        )
        return da.Array(graph, name, chunks, dtype=self._dtype)


_PERSIST_HOOK: list[Any] = []


def register_persist(hook: Any) -> None:
    """Register the function :meth:`Dataset4D.persist` delegates to (the graph layer's)."""
    _PERSIST_HOOK[:] = [hook]


def _load_block(ds: Dataset4D, r0: int, r1: int) -> np.ndarray:
    return ds.load_block((r0, r1))


def open(
    path_or_array: str | os.PathLike[str] | np.ndarray | Any,
    *,
    format: str | None = None,
    calibration: Calibration | dict[str, Any] | None = None,
    chunk_rows: int | None = None,
    chunk_mib: float | None = None,
    **reader_options: Any,
) -> Dataset4D:
    """Open a 4D-STEM input lazily (metadata only).

    Parameters
    ----------
    path_or_array
        A file (HDF5, Dectris master, ``.npy``, raw, EMPAD ``.xml``, Merlin
        ``.mib``...), a Zarr store, or an array held in this session, opened
        lazily without copying: a NumPy or Dask array (its row chunks kept),
        an xarray ``DataArray`` (its coordinates' ``units`` give the
        calibration), a ``zarr.Array`` or ``h5py.Dataset`` (reopened by path),
        any object with ``shape``, ``dtype`` and slicing, or a list (copied).
        4-D ``(R_r, R_c, k_r, k_c)``, or 3-D ``(frames, k_r, k_c)`` with
        ``scan_shape=``.
    format
        Reader name (see :data:`quantem_flow.io.READERS`); guessed from the
        path when ``None``.
    calibration
        Calibration of the axes; when ``None`` a JSON sidecar's
        ``"calibration"`` or the reader's own is used, else everything is
        uncalibrated (``px``).  Which one was used is recorded.
    chunk_rows, chunk_mib
        Chunking along scan rows (default ~``config.get("chunk_mib")`` MiB).
    **reader_options
        ``verify="checksums"`` refuses a source whose chunks carry no
        checksum verified on read (HDF5 Fletcher32, Zarr crc32c; see
        docs/data-integrity.md).  The rest are passed to the reader:
        ``dataset_path=``, ``scan_shape=``, ``frame_offset=``, ``dtype=``, ``frame_shape=``...

    Returns
    -------
    Dataset4D
        The lazy dataset.
    """
    verify = reader_options.pop("verify", None)
    source, format_from = open_source_explained(path_or_array, format=format, **reader_options)
    notes: list[str] = []
    if verify not in (None, "none", "checksums"):
        raise ParameterError(f"verify must be None, 'none' or 'checksums', got {verify!r}")
    if verify == "checksums":  # docs/data-integrity.md
        checked, how = source.integrity
        if not checked:
            raise ParameterError(
                f"verify='checksums' was asked, but {how}; open without verify= to read it "
                "unchecked"
            )
        notes.append(f"integrity: {how}")
    metadata = source.metadata
    # What the input itself records: a JSON sidecar (written by a person) wins over the file.
    path = getattr(source, "path", None)
    found: Calibration | None = sidecar_calibration(path) if path is not None else None
    found_from = f"JSON sidecar next to {str(path)!r}" if found is not None else None
    if found is None and source.calibration is not None:
        found = source.calibration
        found_from = metadata.get("calibration_from") or f"read from the {source.format} file"
    opened: dict[str, Any] = {
        "format_from": format_from,
        "scan_shape_from": metadata.get("scan_shape_from", f"the {source.format} input's shape"),
    }
    cal: Calibration
    if isinstance(calibration, (dict, Calibration)):
        cal = Calibration.from_dict(calibration) if isinstance(calibration, dict) else calibration
        how = "given"
        opened["calibration_from"] = "given (calibration=)"
        if found is not None and found != cal:
            # Explicit values win; what the file said is kept in provenance.
            record = _override_record(found, cal, found_from)
            opened.update(record)
            notes.append(
                f"calibration: the given calibration overrides the one {found_from} records "
                f"(differing fields: {sorted(record['calibration_overridden']['fields'])})"
            )
    elif calibration is None:
        if found is not None:
            cal = found
            how = str(found_from)
            opened["calibration_from"] = found_from
        else:
            cal = Calibration()
            how = "none (all axes uncalibrated px)"
            opened["calibration_from"] = "none (all axes uncalibrated px)"
    else:
        raise ParameterError(
            f"calibration must be a Calibration, a dict or None, got {type(calibration).__name__}"
        )
    notes.append(f"calibration: {how}")
    return Dataset4D(
        source,
        calibration=cal,
        chunk_rows=chunk_rows,
        chunk_mib=chunk_mib,
        notes=notes,
        _opened=opened,
    )


def _override_record(old: Calibration, new: Calibration, old_from: Any) -> dict[str, Any]:
    """The provenance entry of an explicit calibration replacing another one."""
    a, b = old.to_dict(), new.to_dict()
    fields = {k: {"was": a[k], "now": b[k]} for k in a if a[k] != b.get(k)}
    return {
        "calibration_overridden": {"from": old_from, "calibration": a, "fields": fields},
    }
