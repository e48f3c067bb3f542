"""The reader registry: which readers exist, and which one opens a file.

Readers live in one :class:`quantem_flow.plugins.Registry` (the mechanism
every kind of extension shares).  Where they come from, in order:

1. the built-in readers, one row each in :data:`~quantem_flow.io.BUILTIN_READERS`
   (a :class:`ReaderEntry`: format name, ``"module:Class"``, ``"module:sniff"``,
   lower-case suffixes, and ``generic`` for a reader of any file of a
   container format, generic HDF5, chosen only when no specific reader
   recognises the file); nothing is imported until it is used;
2. installed distributions, through the entry-point group
   ``quantem_flow.readers`` (:data:`ENTRY_POINT_GROUP`), read once, lazily.
   The entry point's name is the format name and its value
   ``"module:Class"``: a :class:`~quantem_flow.io.base.Source` subclass whose
   ``format`` is that name.  Like an xarray backend, the class may declare,
   as class attributes, ``suffixes`` (a tuple of lower-case name endings),
   ``sniff(path, head) -> bool`` (a static method; ``head`` is the first
   4096 bytes, ``b""`` for a directory) or xarray's
   ``guess_can_open(path) -> bool``, and ``generic = True`` for a container
   reader.  A broken entry point is reported with a
   :class:`ReaderRegistryWarning` naming its distribution (and again if its
   format is asked for); the built-in readers keep working.

A third-party package declares, in its ``pyproject.toml``::

    [project.entry-points."quantem_flow.readers"]
    myformat = "my_package.reader:MyFormatSource"

Detection (:func:`detect`) reads the first bytes of the file once and asks
every reader's sniffer: content first, the name's suffix only to choose
between several readers that recognise the content, or, when none does,
to hand the file to the reader its suffix names (whose error then says what
is wrong with the file).  When several readers could open a file, or none,
the error lists every reader and why.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from ..errors import FormatError, ParameterError
from ..plugins import PluginWarning, Registry, load_attribute
from .base import Source, check_exists

__all__ = [
    "ENTRY_POINT_GROUP",
    "Detection",
    "ReaderEntry",
    "ReaderRegistryWarning",
    "clear_reader_cache",
    "detect",
    "reader_class",
    "reader_entry_point_errors",
    "reader_names",
    "readers",
]

logger = logging.getLogger(__name__)

#: The entry-point group third-party readers register in.
ENTRY_POINT_GROUP = "quantem_flow.readers"

Sniffer = Callable[[Path, bytes], bool]


class ReaderRegistryWarning(PluginWarning):
    """An installed reader's entry point could not be registered (it names the distribution)."""


@dataclasses.dataclass(frozen=True)
class ReaderEntry:
    """One registered reader.

    Attributes
    ----------
    name
        Format name (``format=`` of :func:`quantem_flow.open`).
    target
        ``"module:Class"`` of the :class:`~quantem_flow.io.base.Source` subclass.
    sniffer
        ``"module:function"``, a callable ``(path, head) -> bool``, or
        ``None`` when the format is never detected by content.
    suffixes
        Lower-case endings of the names of its files (``(".npy",)``).
    generic
        Whether it opens any file of a container format (chosen only when
        no specific reader recognises the file).
    origin
        ``"built-in"`` or ``"distribution 'name version'"``.
    """

    name: str
    target: str
    sniffer: str | Sniffer | None = None
    suffixes: tuple[str, ...] = ()
    generic: bool = False
    origin: str = "built-in"

    def load_class(self) -> type[Source]:
        """Import and return the reader class."""
        return _load_class(self.target)

    def sniff_function(self) -> Sniffer | None:
        """The sniffer as a callable (imported on first use), or ``None``."""
        if self.sniffer is None or callable(self.sniffer):
            return self.sniffer
        fn: Sniffer = load_attribute(self.sniffer)
        return fn

    def looks_for(self) -> str:
        """What the sniffer looks for: the first line of its docstring."""
        try:
            fn = self.sniff_function()
        except Exception as exc:  # reported, never raised from an error message
            return f"(its sniffer {self.sniffer!r} cannot be imported: {type(exc).__name__})"
        if fn is None:
            return "(no content sniffer: never detected, pass format=)"
        doc = (getattr(fn, "__doc__", None) or "").strip().splitlines()
        # reStructuredText literals read better without their backquotes in a message
        return doc[0].rstrip(".").replace("``", "") if doc else f"content recognised by {fn!r}"

    def sniff(self, path: Path, head: bytes) -> tuple[bool, str | None]:
        """Return whether the content is this format, and the sniffer's failure if it raised."""
        try:
            fn = self.sniff_function()
            return (False, None) if fn is None else (bool(fn(path, head)), None)
        except Exception as exc:  # a third-party sniffer never breaks detection
            return False, f"{type(exc).__name__}: {exc}"


@dataclasses.dataclass(frozen=True)
class Detection:
    """The reader chosen for a path and why.

    Attributes
    ----------
    format
        The reader's name.
    how
        How it was chosen (for provenance): ``"content: ..."`` or
        ``"suffix ..."``.
    matched
        Readers whose sniffer recognised the content.
    """

    format: str
    how: str
    matched: tuple[str, ...] = ()


def _load_class(target: str) -> type[Source]:
    cls = load_attribute(target)
    if not (isinstance(cls, type) and issubclass(cls, Source)):
        raise TypeError(f"{target!r} is not a quantem_flow.io.Source subclass: {cls!r}")
    return cls


def _entry_from_class(name: str, cls: Any) -> ReaderEntry:
    """Build the registry entry of a plugin class, or raise why it cannot be one."""
    if not (isinstance(cls, type) and issubclass(cls, Source)):
        raise TypeError(f"it is not a quantem_flow.io.Source subclass: {cls!r}")
    if cls.format != name:
        raise TypeError(
            f"its class declares format={cls.format!r}, not the entry point's name {name!r}; "
            "the two must agree (the name is what provenance records)"
        )
    suffixes = getattr(cls, "suffixes", ())
    if isinstance(suffixes, str) or not all(isinstance(s, str) for s in suffixes):
        raise TypeError(f"its class attribute 'suffixes' must be a tuple of str, got {suffixes!r}")
    sniffer: Sniffer | None = None
    sniff = getattr(cls, "sniff", None)
    guess = getattr(cls, "guess_can_open", None)
    if callable(sniff):
        sniffer = sniff
    elif callable(guess):

        def sniffer(path: Path, head: bytes, _guess: Any = guess) -> bool:
            return bool(_guess(path))

        sniffer.__doc__ = (getattr(guess, "__doc__", None) or "").strip() or (
            f"{cls.__name__}.guess_can_open"
        )
    return ReaderEntry(
        name=name,
        target=f"{cls.__module__}:{cls.__qualname__}",
        sniffer=sniffer,
        suffixes=tuple(s.lower() for s in suffixes),
        generic=bool(getattr(cls, "generic", False)),
    )


def _make(name: str, row: Any) -> ReaderEntry:
    """A built-in row as it is; a plug-in's class as the entry its class attributes declare."""
    return row if isinstance(row, ReaderEntry) else _entry_from_class(name, row)


_registry: Registry[ReaderEntry] | None = None
_registry_lock = threading.Lock()


def _readers() -> Registry[ReaderEntry]:
    global _registry
    with _registry_lock:
        if _registry is None:
            from . import BUILTIN_READERS

            _registry = Registry(
                "reader",
                ENTRY_POINT_GROUP,
                {row.name: row for row in BUILTIN_READERS},
                _make,
                warning=ReaderRegistryWarning,
            )
        return _registry


def clear_reader_cache() -> None:
    """Forget the entry points read so far (the next lookup reads them again)."""
    _readers().clear()


def readers() -> dict[str, ReaderEntry]:
    """Return ``{name: ReaderEntry}`` of every registered reader, built-ins first.

    Every installed plug-in is loaded (detection asks each one's sniffer); a
    broken one is left out, reported by :func:`reader_entry_point_errors` and
    a :class:`ReaderRegistryWarning` naming its distribution.
    """
    registry = _readers()
    out: dict[str, ReaderEntry] = {}
    for name in registry.names():
        try:
            entry = registry.get(name)
        except ParameterError:  # a broken plug-in: reported by the registry
            continue
        origin = registry.origin(name)
        out[name] = entry if entry.origin == origin else dataclasses.replace(entry, origin=origin)
    return out


def reader_names() -> list[str]:
    """Return the sorted names of every registered reader."""
    return sorted(readers())


def reader_entry_point_errors() -> dict[str, str]:
    """Return ``{entry point name: message}`` of reader entry points that failed."""
    readers()
    return _readers().errors()


def reader_class(fmt: str) -> type[Source]:
    """Return the reader class registered for ``fmt``.

    Raises
    ------
    ParameterError
        No reader of that name is registered (the message lists them, and
        says why an installed one of that name failed to register).
    """
    entry = readers().get(fmt)
    if entry is None:
        broken = reader_entry_point_errors().get(fmt)
        why = f"; an installed reader of that name failed: {broken}" if broken else ""
        raise ParameterError(f"unknown format {fmt!r}; known formats: {reader_names()}{why}")
    return entry.load_class()


def _suffix_of(entry: ReaderEntry, name: str) -> str | None:
    """The longest of the reader's suffixes that ``name`` ends with."""
    hits = [s for s in entry.suffixes if name.endswith(s)]
    return max(hits, key=len) if hits else None


def _listing(entries: Iterable[ReaderEntry], why: dict[str, str]) -> str:
    return "; ".join(f"{e.name}: {why[e.name]}" for e in entries)


def detect(path: str | Path, *, head: bytes | None = None) -> Detection:
    """Choose the reader of a file or directory by its content, then its name.

    Parameters
    ----------
    path
        The file or directory.
    head
        Its first bytes, if already read (``b""`` for a directory).

    Returns
    -------
    Detection
        The reader's name and how it was chosen.

    Raises
    ------
    FormatError
        When no reader recognises the file and no suffix names one, or when
        several readers recognise it equally; the message lists every reader
        and why it was or was not chosen, and says to pass ``format=``.
    """
    from .sniffers import read_head

    p = check_exists(path)
    if head is None:
        head = read_head(p)
    entries = [e for e in readers().values() if e.name != "memory"]
    name = p.name.lower()
    content: list[ReaderEntry] = []
    why: dict[str, str] = {}
    for e in entries:
        ok, failed = e.sniff(p, head)
        if ok:
            content.append(e)
            why[e.name] = f"content recognised ({e.looks_for()})"
        elif e.sniffer is None:
            why[e.name] = "never detected by content; pass format= to use it"
        else:
            why[e.name] = f"content not recognised (looks for: {e.looks_for()})"
            if failed:
                why[e.name] += f"; its sniffer raised {failed}"
        suffix = _suffix_of(e, name)
        if suffix is not None:
            why[e.name] += f"; name ends with {suffix!r}"
    what = f"{'directory' if p.is_dir() else 'file'} {str(p)!r}"
    hint = (
        f"pass format= one of {sorted(e.name for e in entries)} (raw binary needs "
        "format='raw', dtype= and frame_shape=)"
    )
    for group in ([e for e in content if not e.generic], [e for e in content if e.generic]):
        if len(group) == 1:
            return Detection(group[0].name, f"content: {group[0].looks_for()}", (group[0].name,))
        if len(group) > 1:
            named = [e for e in group if _suffix_of(e, name) is not None]
            if len(named) == 1:
                e = named[0]
                return Detection(
                    e.name,
                    f"content recognised by {sorted(g.name for g in group)}; the name's suffix "
                    f"{_suffix_of(e, name)!r} chose {e.name!r}",
                    tuple(g.name for g in group),
                )
            raise FormatError(
                f"{what} is recognised by several readers: {_listing(group, why)}. Pass format= "
                f"one of {sorted(e.name for e in group)} to say which"
            )
    by_suffix = [(e, s) for e in entries if (s := _suffix_of(e, name)) is not None]
    if by_suffix:
        longest = max(len(s) for _, s in by_suffix)
        best = [e for e, s in by_suffix if len(s) == longest]
        if len(best) > 1:
            best = [e for e in best if not e.generic] or best
        if len(best) == 1:
            e = best[0]
            return Detection(
                e.name,
                f"suffix {_suffix_of(e, name)!r} (the content was not recognised by any reader)",
            )
        raise FormatError(
            f"{what}: no reader recognises its content and its name's suffix fits several: "
            f"{_listing(best, why)}. {hint}"
        )
    raise FormatError(
        f"cannot tell the format of {what}: no reader recognises its content or its name. "
        f"Readers: {_listing(entries, why)}. {hint}"
    )
