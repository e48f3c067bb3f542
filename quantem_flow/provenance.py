"""Provenance: where a result came from and every choice made on the way."""

from __future__ import annotations

import dataclasses
import datetime as _dt
import functools
import hashlib
import importlib.metadata
import json
import platform
import sys
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

__all__ = [
    "CONTENT_DIGEST_ALGORITHM",
    "Provenance",
    "array_identity",
    "combine_digests",
    "environment",
    "jsonable",
    "package_versions",
]

#: The hash of content digests (xxHash XXH3, 128 bits, seed 0; docs/data-integrity.md).
CONTENT_DIGEST_ALGORITHM = "xxh3_128"

_VERSIONED = (
    "quantem-flow",
    "numpy",
    "scipy",
    "numba",
    "dask",
    "distributed",
    "h5py",
    "hdf5plugin",
    "zarr",
    "numcodecs",
    "xxhash",
)


def package_versions() -> dict[str, str]:
    """Return the installed version of every package a result may depend on."""
    return dict(_package_versions())


@functools.lru_cache(maxsize=1)
def _package_versions() -> dict[str, str]:
    out: dict[str, str] = {}
    for name in _VERSIONED:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


def environment() -> dict[str, str]:
    """Return the Python and operating-system versions a result was computed with.

    Returns
    -------
    dict
        ``python`` (``"3.11.9"``), ``python_implementation`` (``"CPython"``),
        ``python_build`` (compiler and build date), ``os`` (system and
        release, ``"Linux 6.8.0"``), ``platform`` (:func:`platform.platform`),
        ``machine`` (``"x86_64"``) and ``byteorder``.
    """
    return dict(_environment())


@functools.lru_cache(maxsize=1)
def _environment() -> dict[str, str]:
    return {
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "python_build": " ".join((*platform.python_build(), platform.python_compiler())),
        "os": f"{platform.system()} {platform.release()}".strip(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "byteorder": sys.byteorder,
    }


def combine_digests(units: Iterable[tuple[int, int, str]], *, header: str) -> str:
    """Combine ordered ``(row_start, row_stop, hex digest)`` units into one digest.

    The result is the :data:`CONTENT_DIGEST_ALGORITHM` hex digest of
    ``header``, a newline, then one line ``"<row_start> <row_stop>
    <digest>"`` per unit, sorted by rows: it depends on the units, never on
    the order they were computed in.

    Parameters
    ----------
    units
        Half-open scan-row ranges and the hex digests of their bytes.
    header
        What the digests are of (representation, dtype, shapes), so that the
        same bytes read as different things give different digests.

    Returns
    -------
    str
        32 hexadecimal characters.
    """
    import xxhash

    h = xxhash.xxh3_128()
    h.update(header.encode())
    h.update(b"\n")
    for r0, r1, digest in sorted((int(a), int(b), str(d)) for a, b, d in units):
        h.update(f"{r0} {r1} {digest}\n".encode())
    return str(h.hexdigest())


def array_identity(array: np.ndarray) -> dict[str, Any]:
    """Return a small, stable identity of an array (shape, dtype, SHA-256).

    Used for masks and other array parameters so that provenance names them
    exactly without storing them.
    """
    a = np.ascontiguousarray(array)
    digest = hashlib.sha256()
    digest.update(str(a.dtype).encode())
    digest.update(repr(a.shape).encode())
    digest.update(a.tobytes())
    return {"shape": list(a.shape), "dtype": str(a.dtype), "sha256": digest.hexdigest()}


def jsonable(value: Any) -> Any:
    """Return ``value`` as JSON types (mappings, lists, str, numbers, bool, None).

    NumPy arrays and scalars become lists and numbers; tuples and sets lists;
    bytes text; non-finite floats the strings ``"nan"``, ``"inf"``, ``"-inf"``;
    complex numbers ``{"real", "imag"}``; dates ISO strings; anything else its
    ``str``.  The one conversion every module uses for provenance and metadata.
    """
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return jsonable(value.tolist())
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not np.isfinite(value):
        return str(value)
    if isinstance(value, complex):
        return {"real": jsonable(value.real), "imag": jsonable(value.imag)}
    if isinstance(value, (set, frozenset)):
        return [jsonable(v) for v in sorted(value, key=repr)]
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    if isinstance(value, (_dt.date, _dt.datetime)):
        return value.isoformat()
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)


@dataclasses.dataclass
class Provenance:
    """Everything needed to say how a result was produced.

    Attributes
    ----------
    operator
        Name of the operator that made the result (``"virtual_image"``...).
    parameters
        The operator's resolved parameters, with units, mask identities and
        any automatically found geometry (for example the probe estimate).
    source
        Identity of the input: format, paths (``paths`` as the reader
        found them, ``paths_given`` as passed to ``open``,
        ``paths_resolved`` absolute with symlinks resolved), file sizes, a
        SHA-256 of the headers, shapes and dtypes, and the
        ``content_digest`` of the bytes the pass read
        (docs/data-integrity.md).
    dataset
        Shape, dtype, representation and storage schema of the dataset the
        operator ran on (after any regions or binning).
    transforms
        Every crop, bin or other change applied to the data, in order.
    flags
        ``native`` (no transform), ``cropped``, ``binned``.
    accumulation_dtype
        The dtype sums were accumulated in.
    execution
        Requested and chosen runtime, scheduler, per-chunk records
        (rows, worker, runtime, bytes read, content digest, seconds of
        reading, hashing, JIT compiling and kernels).
    derived_from
        Provenance of the results this one was computed from (for example
        the centre of mass an iDPC phase integrates).
    notes
        Human-readable remarks on explicit choices (guessed square scans,
        empty frames set to NaN, ...).
    versions
        Package versions.
    environment
        Python and operating-system versions (:func:`environment`); empty
        for provenance written before they were recorded.
    timings
        Wall-clock seconds of the stages of the computation.
    created
        ISO 8601 UTC time the result was produced.
    """

    operator: str
    parameters: dict[str, Any] = dataclasses.field(default_factory=dict)
    source: dict[str, Any] = dataclasses.field(default_factory=dict)
    dataset: dict[str, Any] = dataclasses.field(default_factory=dict)
    transforms: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    flags: dict[str, bool] = dataclasses.field(default_factory=dict)
    accumulation_dtype: str | None = None
    execution: dict[str, Any] = dataclasses.field(default_factory=dict)
    derived_from: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)
    versions: dict[str, str] = dataclasses.field(default_factory=package_versions)
    environment: dict[str, str] = dataclasses.field(default_factory=environment)
    timings: dict[str, float] = dataclasses.field(default_factory=dict)
    created: str = dataclasses.field(
        default_factory=lambda: _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")
    )

    @property
    def native(self) -> bool:
        """Whether the result was computed on the unmodified (native) data."""
        return bool(self.flags.get("native", not self.transforms))

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-ready dict."""
        return {f.name: jsonable(getattr(self, f.name)) for f in dataclasses.fields(self)}

    def to_json(self, *, indent: int | None = 2) -> str:
        """Return the provenance as a JSON document."""
        return json.dumps(self.to_dict(), indent=indent, ensure_ascii=False)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Provenance:
        """Rebuild provenance from :meth:`to_dict` output.

        Fields missing from older documents stay unknown: ``environment`` is
        empty, never this process's.
        """
        names = {f.name for f in dataclasses.fields(cls)}
        kwargs = {k: v for k, v in d.items() if k in names}
        kwargs.setdefault("environment", {})
        return cls(**kwargs)

    @classmethod
    def from_json(cls, text: str) -> Provenance:
        """Rebuild provenance from :meth:`to_json` output."""
        return cls.from_dict(json.loads(text))
