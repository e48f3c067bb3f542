"""Save typed results to HDF5 or Zarr, load them back, export them as JSON.

Layout
------
One file (HDF5) or directory (Zarr v3) holds any number of results.  The
root carries the attributes

* ``quantem_flow_results_version`` -- the layout version, ``2``;
* ``quantem_flow_version`` -- the version of quantem-flow that wrote it;
* ``quantem_flow_result_names`` -- JSON list of the result groups, in the
  order they were saved;
* ``default`` -- the first result's name (NeXus: what a viewer opens).

Every result is one group, named by its key, holding the array ``data`` and
the attributes ``quantem_flow_kind`` (``"ScanImage"``, ``"VectorField"``...),
``units``, ``name``, ``quantem_flow_axes`` (JSON list of :meth:`Axis.to_dict`;
layout 1 named it ``axes``) and ``provenance`` (JSON of
:meth:`Provenance.to_dict`).  :func:`load_results` rebuilds the typed results
and reads layouts 1 and 2.

Layout 2 also writes each group in the conventions other tools read without
quantem-flow (:mod:`quantem_flow.io.nexus`): a NeXus ``NXdata`` group
(``@signal``, ``@axes``, ``AXISNAME_indices``) with one coordinate dataset per
axis (``@units``, ``@long_name``), ``data`` with ``@units`` and
``@long_name``, HDF5 dimension scales, and in Zarr the same attributes plus
``dimension_names`` (xarray reads them).  h5web, silx and NeXpy show each result as an
image with calibrated axes.

Safety
------
A results file is never half written and an existing one is never lost:
the new file (or directory) is written under a temporary name next to the
target and moved into place only once complete.  Writing over an existing
path needs ``overwrite=True``.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import importlib.metadata
import json
import os
import shutil
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from ..errors import (
    DtypeError,
    FormatError,
    OverwriteError,
    ParameterError,
    QuantemFlowError,
    StorageError,
)
from ..provenance import jsonable
from ..results import RESULT_TYPES, Result, result_from_parts
from .base import check_exists

__all__ = [
    "RESULTS_LAYOUT_VERSION",
    "check_replaceable",
    "describe_results",
    "is_results_store",
    "load_results",
    "not_ours_reason",
    "results_to_json",
    "save_results",
]

RESULTS_LAYOUT_VERSION = 2
_T = TypeVar("_T")
"""Version of the on-disk layout written by :func:`save_results`."""

_VERSION_ATTR = "quantem_flow_results_version"
_PACKAGE_ATTR = "quantem_flow_version"
_NAMES_ATTR = "quantem_flow_result_names"
_KIND_ATTR = "quantem_flow_kind"
#: The axes as JSON (layout 2; layout 1 called it ``axes``, which NeXus now uses).
_AXES_ATTR = "quantem_flow_axes"
_GROUP_ATTRS = (_KIND_ATTR, "units", "name", _AXES_ATTR, "provenance")
_FORMATS = ("hdf5", "zarr")
_SUFFIXES = {".h5": "hdf5", ".hdf5": "hdf5", ".zarr": "zarr"}


# -- helpers -------------------------------------------------------------------------------
def _package_version() -> str:
    try:
        return importlib.metadata.version("quantem-flow")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=jsonable)


def _check_name(name: str, where: str) -> None:
    if not isinstance(name, str):
        raise ParameterError(
            f"result names must be strings, got {name!r} ({type(name).__name__}) {where}"
        )
    if not name:
        raise ParameterError(
            f"a result has an empty name {where}; give every result a name "
            "(pass a mapping {'bf': result, ...} or set result.name)"
        )
    if "/" in name or "\x00" in name or name in (".", "..") or name.startswith("__"):
        raise ParameterError(
            f"result name {name!r} {where} cannot be a group name in HDF5/Zarr; "
            "use letters, digits, '_', '-' or '.' without '/' and not starting with '__'"
        )


def _normalize(results: Mapping[str, Result] | Sequence[Result]) -> dict[str, Result]:
    """Return ``{group name: result}`` after checking types and names."""
    items: list[tuple[str, Any]]
    if isinstance(results, Mapping):
        items = list(results.items())
        where = "(mapping key)"
    elif isinstance(results, Sequence) and not isinstance(results, (str, bytes)):
        items = [(getattr(r, "name", ""), r) for r in results]
        where = "(result.name)"
    elif isinstance(results, Result):
        raise ParameterError(
            f"expected a mapping or a sequence of results, got a single {type(results).__name__}; "
            "wrap it: [result] or {'name': result}"
        )
    else:
        raise ParameterError(
            f"expected a mapping {{name: Result}} or a sequence of Result, "
            f"got {type(results).__name__}"
        )
    out: dict[str, Result] = {}
    for name, result in items:
        if not isinstance(result, Result):
            raise ParameterError(
                f"{name!r}: expected a quantem_flow Result (ScanImage, VectorField, ...), "
                f"got {type(result).__name__}"
            )
        if type(result).kind not in RESULT_TYPES:
            raise ParameterError(
                f"{name!r}: {type(result).__name__} has kind {type(result).kind!r}, which "
                f"load_results could not rebuild; known kinds: {sorted(RESULT_TYPES)}"
            )
        _check_name(name, where)
        if name in out:
            raise ParameterError(
                f"two results are named {name!r} {where}; names must be unique -- pass a "
                "mapping with distinct keys or rename one result"
            )
        out[name] = result
    return out


def _storable(result: Result, name: str) -> np.ndarray:
    """Return the data of ``result`` as a native-byte-order array both formats can hold."""
    data = np.asarray(result.data)
    if data.dtype.kind not in "biufc":
        raise DtypeError(
            f"result {name!r} has data of dtype {data.dtype}; results files hold bool, "
            "integer, float or complex data -- convert the data before saving"
        )
    if not data.dtype.isnative:
        data = data.astype(data.dtype.newbyteorder("="))
    return data


def _group_attrs(result: Result) -> dict[str, str]:
    return {
        _KIND_ATTR: type(result).kind,
        "units": str(result.units),
        "name": str(result.name),
        _AXES_ATTR: _dumps([a.to_dict() for a in result.axes]),
        "provenance": _dumps(result.provenance.to_dict()),
    }


def _root_attrs(names: list[str]) -> dict[str, Any]:
    return {
        _VERSION_ATTR: RESULTS_LAYOUT_VERSION,
        _PACKAGE_ATTR: _package_version(),
        _NAMES_ATTR: _dumps(names),
    }


def _resolve_format(path: Path, format: str | None) -> str:
    if format is not None:
        fmt = str(format).lower()
        if fmt == "h5":
            fmt = "hdf5"
        if fmt not in _FORMATS:
            raise ParameterError(f"format must be one of {list(_FORMATS)}, got {format!r}")
        return fmt
    fmt_guess = _SUFFIXES.get(path.suffix.lower())
    if fmt_guess is None:
        raise ParameterError(
            f"cannot tell the results format from the name {path.name!r}; end it with "
            f".h5/.hdf5 (HDF5) or .zarr (Zarr v3), or pass format='hdf5' or format='zarr'"
        )
    return fmt_guess


def _temporary_sibling(path: Path) -> Path:
    return path.with_name(f".{path.name}.{uuid.uuid4().hex[:12]}.tmp")


# -- writers -------------------------------------------------------------------------------
def _write_hdf5(target: Path, results: Mapping[str, Result]) -> None:
    import h5py

    names = list(results)
    with h5py.File(target, "x", track_order=True) as f:
        for key, value in _root_attrs(names).items():
            f.attrs[key] = value
        if names:  # NeXus: the result a viewer opens first
            f.attrs["default"] = names[0]
        for name, result in results.items():
            _write_hdf5_group(f, name, result)


def _write_hdf5_group(f: Any, name: str, result: Result) -> None:
    from .nexus import write_hdf5_axes

    data = _storable(result, name)
    group = f.create_group(name, track_order=True)
    dset = group.create_dataset("data", data=data)
    for key, value in _group_attrs(result).items():
        group.attrs[key] = value
    write_hdf5_axes(group, dset, **_nexus_fields(result, name))


def _write_zarr(target: Path, results: Mapping[str, Result]) -> None:
    import zarr

    root = zarr.open_group(str(target), mode="w-", zarr_format=3)
    root.attrs.update(_root_attrs(list(results)))
    if results:
        root.attrs["default"] = next(iter(results))
    for name, result in results.items():
        _write_zarr_group(root, name, result)


def _write_zarr_group(root: Any, name: str, result: Result) -> None:
    from .nexus import write_zarr_data

    data = _storable(result, name)
    group = root.create_group(name)
    group.attrs.update(_group_attrs(result))
    write_zarr_data(group, data, **_nexus_fields(result, name))


def _nexus_fields(result: Result, name: str) -> dict[str, Any]:
    """What :mod:`quantem_flow.io.nexus` writes of a result besides its data."""
    from .nexus import measured_from

    return {
        "name": str(result.name or name),
        "units": str(result.units),
        "axes": result.axes,
        "origin_from": measured_from(result.provenance.parameters),
    }


def _fsync(path: Path) -> None:
    with contextlib.suppress(OSError), open(path, "rb") as fh:
        os.fsync(fh.fileno())


def _drain_zarr_writes(timeout_s: float = 5.0) -> None:
    """Wait (at most ``timeout_s``) for writes still running on Zarr's event loop.

    When one chunk write fails, Zarr raises while the others run on; they would
    recreate the temporary store after it is removed.  Best effort: Zarr's loop is
    its own (``zarr.core.sync``); any failure here leaves :func:`_remove`'s retries.
    """

    async def drain() -> None:
        me = asyncio.current_task()
        pending = [t for t in asyncio.all_tasks() if t is not me]
        if pending:
            await asyncio.wait(pending, timeout=timeout_s)

    with contextlib.suppress(Exception):
        from zarr.core.sync import sync

        sync(drain())


def _remove(path: Path, *, tries: int = 10, settle_s: float = 0.1) -> bool:
    """Remove a file or directory tree; ``False`` if it is still there after ``tries``.

    Zarr writes chunks concurrently on its own event loop: when one write fails, the
    others may still be finishing (and creating their folders again) after a first
    removal.  So a removal counts only once the path has stayed gone for ``settle_s``;
    until then it is retried (seen on a loaded 2-core machine: one straggler recreated
    the store after a removal that had succeeded).
    """
    for attempt in range(tries):
        with contextlib.suppress(OSError):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
        if not (path.exists() or path.is_symlink()):
            time.sleep(settle_s)
            if not (path.exists() or path.is_symlink()):
                return True
            continue
        time.sleep(0.05 * (attempt + 1))
    return False


#: Bytes a results file or store adds to its arrays (groups, attributes, provenance JSON).
_OVERHEAD_BYTES_PER_RESULT = 1 << 16


def _bytes_needed(results: Mapping[str, Result]) -> int:
    """About how many bytes a save of ``results`` writes."""
    return sum(
        int(np.asarray(_storable(r, n)).nbytes) + _OVERHEAD_BYTES_PER_RESULT
        for n, r in results.items()
    )


def _free_bytes(directory: Path) -> int | None:
    try:
        return int(shutil.disk_usage(directory).free)
    except OSError:
        return None


def _storage_error(exc: BaseException, target: Path, needed: int) -> StorageError:
    """The project's error for a failed write: the target, bytes needed and free, what to do."""
    free = _free_bytes(target.parent if target.parent.exists() else Path(target.anchor or "/"))
    code = getattr(exc, "errno", None)
    full = code in (errno.ENOSPC, errno.EDQUOT) or (
        free is not None and free < needed and not isinstance(exc, PermissionError)
    )
    space = (
        f"about {needed} bytes needed, {free} free"
        if free is not None
        else f"about {needed} bytes needed"
    )
    if full:
        what = f"the disk (or quota) holding {str(target.parent)!r} is full ({space})"
        todo = "free space there, or save to another disk"
    elif code == errno.EROFS:
        what = f"{str(target.parent)!r} is on a read-only file system"
        todo = "save to a writable directory"
    elif code in (errno.EACCES, errno.EPERM):
        what = f"no permission to write in {str(target.parent)!r}"
        todo = "save to a directory you can write, or change its permissions"
    else:
        what = f"the write failed ({space})"
        todo = "check the disk and the path, then save again"
    return StorageError(
        f"could not save the results to {str(target)!r}: {what}: {type(exc).__name__}: {exc}. "
        f"{todo.capitalize()}; nothing was changed at the target (earlier results there are "
        "intact)",
        target=str(target),
        needed_bytes=needed,
        free_bytes=free,
    )


def _is_results_zarr(path: Path) -> bool:
    meta = path / "zarr.json"
    try:
        doc = json.loads(meta.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(doc, dict) and _VERSION_ATTR in (doc.get("attributes") or {})


# -- overwrite safety ----------------------------------------------------------------------
def not_ours_reason(path: Path) -> str | None:
    """Say why the existing ``path`` is not a file quantem-flow wrote, or ``None`` if it is.

    Files are recognised by the project's own metadata, never by name: an
    HDF5 results file or Zarr results store by its root attribute
    ``quantem_flow_results_version``, a JSON export by the same top-level
    key, a PNG by its ``Software: quantem-flow`` text chunk.
    """
    if path.is_symlink():
        return "it is a symbolic link (the file it points to is not replaced through it)"
    if path.is_dir():
        if _is_results_zarr(path):
            return None
        return "it is a directory that is not a quantem-flow results store"
    try:
        with open(path, "rb") as fh:
            head = fh.read(8)
    except OSError as exc:
        return f"it cannot be read ({exc})"
    if head == b"\x89HDF\r\n\x1a\n":
        import h5py

        try:
            with h5py.File(path, "r") as f:
                if _VERSION_ATTR in f.attrs:
                    return None
        except (OSError, RuntimeError, ValueError) as exc:
            return f"it is an HDF5 file that cannot be opened ({exc})"
        return (
            f"it is an HDF5 file without the {_VERSION_ATTR!r} attribute quantem-flow writes "
            "(an input or someone else's file)"
        )
    if head == b"\x89PNG\r\n\x1a\n":
        try:
            from PIL import Image

            with Image.open(path) as im:
                software = str(getattr(im, "text", {}).get("Software", ""))
        except (ImportError, OSError, ValueError) as exc:
            return f"it is a PNG that cannot be read ({exc})"
        if software.startswith("quantem-flow"):
            return None
        return "it is a PNG that quantem-flow did not write (no 'Software: quantem-flow' tag)"
    if head.lstrip()[:1] == b"{":
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError, UnicodeDecodeError):
            doc = None
        if isinstance(doc, dict) and _VERSION_ATTR in doc:
            return None
        return f"it is not a JSON export of quantem-flow (no {_VERSION_ATTR!r} key)"
    return "it is not a file quantem-flow wrote (no quantem-flow metadata)"


def _same_or_nested(a: Path, b: Path) -> bool:
    with contextlib.suppress(OSError):
        if a.exists() and b.exists() and os.path.samefile(a, b):
            return True
    ra, rb = a.resolve(), b.resolve()
    return ra == rb or ra in rb.parents or rb in ra.parents


def _check_protected(target: Path, protected: Sequence[str | os.PathLike[str]]) -> None:
    for p in protected:
        if _same_or_nested(target, Path(p).expanduser().absolute()):
            raise OverwriteError(
                f"{str(target)!r} is, holds or lies inside the input {str(p)!r}; an input is "
                "never overwritten, even with overwrite -- choose another output path"
            )


def check_replaceable(
    path: str | os.PathLike[str], *, protected: Sequence[str | os.PathLike[str]] = ()
) -> None:
    """Raise unless the existing ``path`` may be replaced by an output.

    Parameters
    ----------
    path
        The output about to be replaced.
    protected
        Paths that are never replaced, whatever ``overwrite`` says: the
        inputs a result was computed from (a target equal to one, inside
        one, or holding one is refused).

    Raises
    ------
    OverwriteError
        With the path and the reason: it is an input, or it is not a file
        quantem-flow wrote (recognised by its own metadata).
    """
    target = Path(path).expanduser().absolute()
    _check_protected(target, protected)
    if not (target.exists() or target.is_symlink()):
        return
    reason = not_ours_reason(target)
    if reason is not None:
        raise OverwriteError(
            f"{str(target)!r} exists and will not be replaced: {reason}. overwrite only "
            "replaces files quantem-flow wrote -- remove it yourself or choose another path"
        )


def _input_paths(items: Mapping[str, Result]) -> list[str]:
    paths: list[str] = []
    for result in items.values():
        source = getattr(result.provenance, "source", None) or {}
        if isinstance(source, Mapping):
            paths.extend(str(p) for p in source.get("paths", []) or [])
    return paths


def _check_target(path: Path, fmt: str, overwrite: bool) -> None:
    if not (path.exists() or path.is_symlink()):
        return
    if not overwrite:
        raise FileExistsError(
            f"{str(path)!r} already exists; results are never overwritten silently -- choose "
            "another path, or pass overwrite=True to replace it"
        )
    if fmt == "hdf5" and path.is_dir():
        raise ParameterError(
            f"{str(path)!r} is a directory; an HDF5 results file cannot replace it -- "
            "choose another path"
        )
    if fmt == "hdf5":
        check_replaceable(path)
    if fmt == "zarr":
        if not path.is_dir():
            raise ParameterError(
                f"{str(path)!r} is a file; a Zarr results store (a directory) will not "
                "replace it -- remove it first or choose another path"
            )
        if any(path.iterdir()) and not _is_results_zarr(path):
            raise ParameterError(
                f"{str(path)!r} is a directory that is not a quantem-flow results store; "
                "overwrite=True only replaces results stores -- remove it yourself or "
                "choose another path"
            )


def _commit_file(tmp: Path, path: Path, overwrite: bool) -> None:
    """Move the finished file ``tmp`` to ``path`` atomically."""
    if overwrite:
        os.replace(tmp, path)
        return
    try:
        # A hard link fails if ``path`` appeared meanwhile: never clobbers.
        os.link(tmp, path)
    except FileExistsError:
        raise FileExistsError(
            f"{str(path)!r} was created by someone else while the results were being "
            "written; nothing was overwritten -- choose another path or pass overwrite=True"
        ) from None
    except OSError:  # file system without hard links
        if path.exists():
            raise FileExistsError(
                f"{str(path)!r} already exists; pass overwrite=True to replace it"
            ) from None
        os.replace(tmp, path)
    else:
        tmp.unlink()


def _commit_dir(tmp: Path, path: Path) -> None:
    """Move the finished directory ``tmp`` to ``path``, keeping the old one until done."""
    backup: Path | None = None
    if path.exists():
        backup = _temporary_sibling(path)
        os.rename(path, backup)
    try:
        os.rename(tmp, path)
    except BaseException:
        if backup is not None:
            os.rename(backup, path)
        raise
    if backup is not None:
        shutil.rmtree(backup, ignore_errors=True)


def save_results(
    results: Mapping[str, Result] | Sequence[Result],
    path: str | os.PathLike[str],
    *,
    format: str | None = None,
    overwrite: bool = False,
) -> Path:
    """Save typed results to one HDF5 file or Zarr v3 store.

    Parameters
    ----------
    results
        ``{name: result}``, or a sequence of results named by their
        ``name``.  Names must be unique, non-empty, without ``/`` and not
        starting with ``__``.
    path
        Target file (``.h5``/``.hdf5``) or directory (``.zarr``).  Missing
        parent directories are created.
    format
        ``"hdf5"`` or ``"zarr"``; guessed from the suffix of ``path`` when
        ``None``.
    overwrite
        Replace an existing file or results store.  The old one stays
        intact until the new one is completely written.

    Returns
    -------
    pathlib.Path
        The absolute path written.

    Raises
    ------
    FileExistsError
        If ``path`` exists and ``overwrite`` is false.
    StorageError
        The disk (or quota) is full, the file system read-only, or writing is not
        permitted: naming the target, the bytes needed and free, and what to do.
        Checked against the free space before writing; the temporary file or
        store is removed on every path, and what was at the target is intact.
    ParameterError
        For bad names, unknown formats, or a target that cannot be
        replaced (a directory that is not a results store, ...).
    DtypeError
        If a result's data is not bool, integer, float or complex.

    Notes
    -----
    Data are stored in native byte order.  Provenance values that JSON
    cannot hold (paths, complex numbers, ...) are stored as strings or
    ``{"real", "imag"}`` pairs.

    """
    items = _normalize(results)
    target = Path(path).expanduser().absolute()
    fmt = _resolve_format(target, format)
    for name, result in items.items():
        _storable(result, name)  # fail before touching the disk
    # never the input a result came from (named in its provenance), even with overwrite
    _check_protected(target, _input_paths(items))
    _check_target(target, fmt, overwrite)  # and with overwrite, only a results file or store
    needed = _bytes_needed(items)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise _storage_error(exc, target, needed) from exc
    free = _free_bytes(target.parent)
    if free is not None and needed > free:  # known before a byte is written
        raise _storage_error(OSError(errno.ENOSPC, "not enough free space"), target, needed)
    tmp = _temporary_sibling(target)
    try:
        if fmt == "hdf5":
            _write_hdf5(tmp, items)
            _fsync(tmp)
            _commit_file(tmp, target, overwrite)
        else:
            _write_zarr(tmp, items)
            if target.exists() and not overwrite:
                raise FileExistsError(
                    f"{str(target)!r} was created by someone else while the results were "
                    "being written; nothing was overwritten -- choose another path or pass "
                    "overwrite=True"
                )
            _commit_dir(tmp, target)
    except (QuantemFlowError, FileExistsError):
        raise
    except (OSError, RuntimeError) as exc:  # a full or read-only disk (h5py: RuntimeError)
        error = _storage_error(exc, target, needed)
        if fmt == "zarr":
            _drain_zarr_writes()
        if (tmp.exists() or tmp.is_symlink()) and not _remove(tmp):
            error = StorageError(
                f"{error} The temporary {str(tmp)!r} could not be removed: remove it by hand",
                target=error.target,
                needed_bytes=error.needed_bytes,
                free_bytes=error.free_bytes,
            )
        raise error from exc
    finally:
        if tmp.exists() or tmp.is_symlink():
            _remove(tmp)
    return target


# -- readers -------------------------------------------------------------------------------
def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    if isinstance(value, np.ndarray) and value.shape == ():
        return _text(value.item())
    return str(value)


def _describe(keys: list[str], attrs: Mapping[str, Any]) -> str:
    shown = keys[:8] + (["..."] if len(keys) > 8 else [])
    return f"top-level members {shown} and root attributes {sorted(attrs)[:8]}"


def _check_root(path: Path, kind: str, keys: list[str], attrs: Mapping[str, Any]) -> list[str]:
    """Check the root attributes and return the result group names in saved order."""
    if _VERSION_ATTR not in attrs:
        raise FormatError(
            f"{str(path)!r} is a {kind} file but not a quantem-flow results file: expected a "
            f"root attribute {_VERSION_ATTR!r}, found {_describe(keys, attrs)}; open raw "
            "data with quantem_flow.open() instead"
        )
    try:
        version = int(attrs[_VERSION_ATTR])
    except (TypeError, ValueError):
        raise FormatError(
            f"{str(path)!r}: root attribute {_VERSION_ATTR!r} should be an integer, got "
            f"{attrs[_VERSION_ATTR]!r}"
        ) from None
    if version > RESULTS_LAYOUT_VERSION:
        raise FormatError(
            f"{str(path)!r} uses results layout {version}, newer than the layout "
            f"{RESULTS_LAYOUT_VERSION} this quantem-flow reads; upgrade quantem-flow "
            f"(it was written by quantem-flow {_text(attrs.get(_PACKAGE_ATTR, '?'))})"
        )
    names: list[str] = sorted(keys)
    if _NAMES_ATTR in attrs:
        try:
            listed = json.loads(_text(attrs[_NAMES_ATTR]))
        except ValueError:
            listed = None
        if isinstance(listed, list) and sorted(map(str, listed)) == names:
            names = [str(n) for n in listed]
        else:
            raise FormatError(
                f"{str(path)!r}: root attribute {_NAMES_ATTR!r} lists {listed!r} but the "
                f"file holds {names}; the file was modified by another tool"
            )
    return names


def _axes_json(attrs: Mapping[str, Any]) -> Any:
    """The axes attribute: ``quantem_flow_axes`` (layout 2) or ``axes`` (layout 1)."""
    return attrs[_AXES_ATTR] if _AXES_ATTR in attrs else attrs.get("axes")


def _build(path: Path, name: str, data: Any, attrs: Mapping[str, Any]) -> Result:
    if _AXES_ATTR not in attrs and isinstance(attrs.get("axes"), (str, bytes)):
        attrs = {**attrs, _AXES_ATTR: attrs["axes"]}  # written by layout 1
    missing = [a for a in _GROUP_ATTRS if a not in attrs]
    if missing:
        raise FormatError(
            f"{str(path)!r}: result group {name!r} lacks the attribute(s) {missing}; "
            f"found {sorted(attrs)}"
        )
    try:
        metadata = {
            "kind": _text(attrs[_KIND_ATTR]),
            "name": _text(attrs["name"]),
            "units": _text(attrs["units"]),
            "axes": json.loads(_text(attrs[_AXES_ATTR])),
            "provenance": json.loads(_text(attrs["provenance"])),
        }
        return result_from_parts(np.asarray(data), metadata)
    except (QuantemFlowError, ValueError, KeyError, TypeError) as exc:
        raise FormatError(
            f"{str(path)!r}: result group {name!r} could not be rebuilt: {exc}"
        ) from exc


def _load_hdf5(path: Path) -> dict[str, Result]:
    import h5py

    from .hdf5 import open_h5

    with open_h5(path) as f:
        keys = list(f.keys())
        attrs = dict(f.attrs)
        names = _check_root(path, "HDF5", keys, attrs)
        out: dict[str, Result] = {}
        for name in names:
            group = f[name]
            if not isinstance(group, h5py.Group) or not isinstance(group.get("data"), h5py.Dataset):
                raise FormatError(
                    f"{str(path)!r}: {name!r} should be a group holding a dataset 'data'"
                )
            out[name] = _build(path, name, group["data"][()], dict(group.attrs))
        return out


def _load_zarr(path: Path) -> dict[str, Result]:
    import zarr

    try:
        root = zarr.open_group(str(path), mode="r")
    except Exception as exc:
        raise FormatError(
            f"{str(path)!r} is a directory but not a readable Zarr group "
            f"({type(exc).__name__}: {exc}); expected a .zarr results store"
        ) from exc
    keys = [str(k) for k in root]
    attrs = dict(root.attrs)
    names = _check_root(path, "Zarr", keys, attrs)
    out: dict[str, Result] = {}
    for name in names:
        group = root[name]
        data = group.get("data") if isinstance(group, zarr.Group) else None
        if not isinstance(data, zarr.Array):
            raise FormatError(f"{str(path)!r}: {name!r} should be a group holding an array 'data'")
        out[name] = _build(path, name, data[...], dict(group.attrs))
    return out


def is_results_store(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a results file or store :func:`save_results` wrote.

    Recognised by the root attribute ``quantem_flow_results_version``, never
    by name; reads no array.
    """
    p = Path(path)
    if p.is_dir():
        return _is_results_zarr(p)
    try:
        with open(p, "rb") as fh:
            head = fh.read(8)
    except OSError:
        return False
    if head != b"\x89HDF\r\n\x1a\n":
        return False
    import h5py

    try:
        with h5py.File(p, "r") as f:
            return _VERSION_ATTR in f.attrs
    except (OSError, RuntimeError, ValueError):
        return False


def describe_results(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Describe a results file without reading its arrays.

    Returns
    -------
    dict
        ``path``, ``format``, ``layout_version``, ``written_by`` and
        ``results``: one entry per result in saved order with its ``kind``,
        ``shape``, ``dtype``, ``units``, axis units, ``operator`` and the
        ``source`` it was computed from (format, paths, shape and the
        SHA-256 of its headers); and ``load_with``.

    Raises
    ------
    FormatError
        When ``path`` is not a results file.
    """
    p = check_exists(path, what="results file")
    entries: list[tuple[str, tuple[int, ...], str, Mapping[str, Any]]] = []
    if p.is_dir():
        import zarr

        root: Any = zarr.open_group(str(p), mode="r")
        attrs: dict[str, Any] = dict(root.attrs)
        names = _check_root(p, "Zarr", [str(k) for k in root], attrs)
        for name in names:
            arr: Any = root[name]["data"]
            entries.append((name, tuple(arr.shape), str(arr.dtype), dict(root[name].attrs)))
        fmt = "zarr"
    else:
        from .hdf5 import open_h5

        with open_h5(p) as f:
            attrs = dict(f.attrs)
            names = _check_root(p, "HDF5", list(f.keys()), attrs)
            for name in names:
                dset = f[name]["data"]
                entries.append((name, tuple(dset.shape), str(dset.dtype), dict(f[name].attrs)))
        fmt = "hdf5"
    results = []
    for name, shape, dtype, gattrs in entries:
        try:
            axes = json.loads(_text(_axes_json(gattrs) or "[]"))
            prov = json.loads(_text(gattrs.get("provenance", "{}")))
        except ValueError:
            axes, prov = [], {}
        source = prov.get("source") or {}
        results.append(
            {
                "name": name,
                "kind": _text(gattrs.get(_KIND_ATTR, "?")),
                "shape": list(shape),
                "dtype": dtype,
                "units": _text(gattrs.get("units", "?")),
                "axes": [
                    f"{a.get('name')} ({a.get('units')})" for a in axes if isinstance(a, dict)
                ],
                "operator": prov.get("operator"),
                "source": {
                    "format": source.get("format"),
                    "paths": source.get("paths"),
                    "shape": source.get("shape"),
                    "header_sha256": source.get("header_sha256"),
                },
            }
        )
    return {
        "path": str(p),
        "format": fmt,
        "layout_version": int(attrs[_VERSION_ATTR]),
        "written_by": f"quantem-flow {_text(attrs.get(_PACKAGE_ATTR, '?'))}",
        "results": results,
        "load_with": f"qf.load_results({str(p)!r})",
    }


def _foreign_to_format_error(func: Callable[..., _T]) -> Callable[..., _T]:
    """Turn exceptions of h5py/zarr/numcodecs on a damaged results file into FormatError."""

    @functools.wraps(func)
    def wrapper(path: str | os.PathLike[str], *args: Any, **kwargs: Any) -> _T:
        from . import FOREIGN_READ_ERRORS

        try:
            return func(path, *args, **kwargs)
        except QuantemFlowError:
            raise
        except FOREIGN_READ_ERRORS as exc:
            raise FormatError(
                f"{str(path)!r} could not be read as a quantem-flow results file: "
                f"{type(exc).__module__}.{type(exc).__name__}: {str(exc)[:300]}. It is damaged, "
                "or was written with a codec this installation lacks; restore it or save the "
                "results again"
            ) from exc

    return wrapper


@_foreign_to_format_error
def load_results(path: str | os.PathLike[str]) -> dict[str, Result]:
    """Load every result saved by :func:`save_results`.

    Parameters
    ----------
    path
        An HDF5 results file or a Zarr results directory.  The format is
        told from the content, not the name.

    Returns
    -------
    dict of str to Result
        ``{name: result}`` in the order they were saved; each result has its
        original class, data (dtype included), units, axes and provenance.

    Raises
    ------
    SourceNotFoundError
        If ``path`` does not exist.
    FormatError
        If ``path`` is not a quantem-flow results file, or a newer layout.

    """
    p = check_exists(path, what="results file")
    if p.is_dir():
        if not (p / "zarr.json").exists():
            found = sorted(x.name for x in p.iterdir())[:8]
            raise FormatError(
                f"{str(p)!r} is a directory without zarr.json (found {found}); expected a "
                "Zarr v3 results store written by save_results"
            )
        return _load_zarr(p)
    import h5py

    if not h5py.is_hdf5(p):
        with open(p, "rb") as fh:
            head = fh.read(8)
        raise FormatError(
            f"{str(p)!r} is not an HDF5 file (starts with {head!r}, size "
            f"{p.stat().st_size} bytes); expected an HDF5 or Zarr results file written by "
            "save_results"
        )
    return _load_hdf5(p)


# -- JSON export ---------------------------------------------------------------------------
def _data_json(data: np.ndarray) -> Any:
    if data.dtype.kind == "c":
        return {"real": _data_json(data.real), "imag": _data_json(data.imag)}
    values = data.tolist()
    if data.dtype.kind == "f" and not bool(np.isfinite(data).all()):
        values = jsonable(values)
    return values


def _iter_entries(items: Mapping[str, Result], include_data: bool) -> Iterator[tuple[str, Any]]:
    for name, result in items.items():
        entry = result.metadata()
        if include_data:
            entry["data"] = _data_json(np.asarray(result.data))
        yield name, entry


def results_to_json(
    results: Mapping[str, Result] | Sequence[Result],
    path: str | os.PathLike[str] | None = None,
    *,
    include_data: bool = False,
) -> str:
    """Export the metadata and provenance of results as one JSON document.

    Parameters
    ----------
    results
        ``{name: result}``, or a sequence of results named by their ``name``.
    path
        When given, the document is also written there (UTF-8, replacing
        any existing JSON file atomically).
    include_data
        Add each result's values as nested lists under ``"data"``; complex
        data become ``{"real": [...], "imag": [...]}``.

    Returns
    -------
    str
        The JSON document: ``{"quantem_flow_results_version", "quantem_flow_version",
        "results": {name: {"kind", "name", "units", "shape", "dtype", "axes",
        "provenance"[, "data"]}}}``.  The JSON is strict: non-finite numbers
        are written as the strings ``"nan"``, ``"inf"`` and ``"-inf"``.

    """
    items = _normalize(results)
    doc = {
        _VERSION_ATTR: RESULTS_LAYOUT_VERSION,
        _PACKAGE_ATTR: _package_version(),
        "results": dict(_iter_entries(items, include_data)),
    }
    text = json.dumps(jsonable(doc), indent=2, ensure_ascii=False, allow_nan=False)
    if path is not None:
        target = Path(path).expanduser().absolute()
        if target.is_dir():
            raise ParameterError(
                f"{str(target)!r} is a directory; give a file name such as results.json"
            )
        if target.is_file():
            import h5py

            if h5py.is_hdf5(target):
                raise ParameterError(
                    f"{str(target)!r} is an HDF5 file; the JSON export will not replace it -- "
                    "give a .json path"
                )
        check_replaceable(target, protected=_input_paths(items))
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = _temporary_sibling(target)
        try:
            tmp.write_text(text + "\n", encoding="utf-8")
            os.replace(tmp, target)
        finally:
            if tmp.exists():
                tmp.unlink()
    return text
