"""One mechanism for every kind of extension: :class:`Registry`.

A registry holds one kind of extension: representations
(``quantem_flow.representations``), readers (``quantem_flow.io.registry``),
runtimes (``quantem_flow.runtimes.registry``) and pipeline operations
(``quantem_flow.pipeline.schema``).  Each has

- **built-in rows**, ``name -> "module:attribute"`` strings, imported on
  first use only (a bare ``import quantem_flow`` imports none of them), or
  light declarations made without importing anything (a reader's row:
  its class as a string, its sniffer and suffixes);
- **an entry-point group** per kind (``quantem_flow.representations``...),
  read once, lazily: an installed distribution joins by declaring, in its
  ``pyproject.toml``, ``[project.entry-points."quantem_flow.<kind>"]`` with
  ``name = "module:attribute"``, exactly the form of a built-in row;
- **rows registered in process** (:meth:`Registry.register`), for tests
  and bridges.

A broken plug-in (its module does not import, its attribute is not of the
kind, it reuses a built-in's name) is reported: a warning naming its
distribution when the group is read or the plug-in loaded,
:meth:`Registry.errors`, and the error raised when its name is asked for.
It never hides the built-ins.
"""

from __future__ import annotations

import importlib
import logging
import threading
import warnings
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

from .errors import ParameterError

__all__ = ["PluginWarning", "Registry", "distribution_label", "load_attribute"]

logger = logging.getLogger(__name__)

T = TypeVar("T")


class PluginWarning(UserWarning):
    """An installed plug-in could not be registered (the message names its distribution)."""


def load_attribute(target: str) -> Any:
    """Import ``"module:attribute"`` (dots allowed in the attribute) and return the attribute.

    Raises
    ------
    ParameterError
        ``target`` is not of the form ``"module:attribute"``.
    ImportError, AttributeError
        The module or the attribute does not exist.
    """
    module, sep, attr = target.partition(":") if isinstance(target, str) else ("", "", "")
    if not sep or not module or not attr:
        raise ParameterError(
            f"expected 'module:attribute' (for example 'my_package.module:Name'), got {target!r}"
        )
    obj: Any = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def distribution_label(entry_point: Any) -> str:
    """``"name version"`` of the distribution that declared an entry point."""
    dist = getattr(entry_point, "dist", None)
    if dist is None:
        return "an unknown distribution"
    name = getattr(dist, "name", None) or dist.metadata.get("Name", "?")
    version = getattr(dist, "version", None)
    return f"{name} {version}" if version else str(name)


class Registry(Generic[T]):
    """The extensions of one kind (see the module docstring).

    Parameters
    ----------
    kind
        What the rows are, for messages (``"representation"``).
    group
        The entry-point group (``"quantem_flow.representations"``).
    builtins
        ``{name: row}`` of the built-in rows: ``"module:attribute"`` strings
        (imported on first use) or objects handed to ``make`` as they are.
    make
        Turns a loaded attribute (or a built-in row object) into the
        registry's value (instantiating a class, checking its type), or
        raises ``TypeError`` saying why it cannot be one; called once per name.
    warning
        The warning category of reports about broken plug-ins (a subclass of
        :class:`PluginWarning`).
    several
        For kinds whose entry points may declare several rows at once (a
        runtime package's list of declarations): ``several(where, loaded) ->
        values`` turns a loaded entry point into its values (raising
        ``TypeError`` saying why it cannot), and ``name_of(value)`` names
        each.  Such a group is loaded whole when it is first read; the
        entry point's own name only labels its errors.
    name_of
        See ``several``.
    builtins_replaceable
        Whether :meth:`register` may replace a built-in row in this process
        (``replace=True``).
    """

    def __init__(
        self,
        kind: str,
        group: str,
        builtins: Mapping[str, Any],
        make: Callable[[str, Any], T],
        *,
        warning: type[PluginWarning] = PluginWarning,
        several: Callable[[str, Any], list[T]] | None = None,
        name_of: Callable[[T], str] | None = None,
        builtins_replaceable: bool = False,
    ) -> None:
        if (several is None) != (name_of is None):
            raise ParameterError("several and name_of go together: pass both or neither")
        self.kind = kind
        self.group = group
        self._builtins = dict(builtins)
        self._make = make
        self._warning = warning
        self._several = several
        self._name_of = name_of
        self._builtins_replaceable = builtins_replaceable
        self._lock = threading.RLock()
        # name -> (target, origin, distribution label)
        self._plugins: dict[str, tuple[str, str, str]] | None = None
        self._errors: dict[str, str] = {}
        self._registered: dict[str, T] = {}
        self._values: dict[str, T] = {}

    # -- what is there -----------------------------------------------------------------
    def names(self) -> list[str]:
        """Every name: built-ins first (in their order), then plug-ins, then registered."""
        out = list(self._builtins)
        out += [n for n in self._entry_points() if n not in out]
        out += [n for n in self._registered if n not in out]
        return out

    def origin(self, name: str) -> str:
        """``"built-in"``, ``"distribution 'name version'"`` or ``"registered in process"``."""
        if name in self._registered:
            return "registered in process"
        if name in self._builtins:
            return "built-in"
        plugin = self._entry_points().get(name)
        if plugin is not None:
            return plugin[1]
        raise self._unknown(name)

    def builtin_names(self) -> tuple[str, ...]:
        """The built-in rows' names, in their order."""
        return tuple(self._builtins)

    def distribution(self, name: str) -> str | None:
        """``"name version"`` of the distribution a plug-in row came from (else ``None``)."""
        if name in self._registered or name in self._builtins:
            return None
        plugin = self._entry_points().get(name)
        return None if plugin is None else plugin[2]

    def target(self, name: str) -> str | None:
        """The ``"module:attribute"`` a built-in string row or a plug-in names (else ``None``)."""
        row = self._builtins.get(name)
        if isinstance(row, str):
            return row
        plugin = None if row is not None else self._entry_points().get(name)
        return None if plugin is None else plugin[0]

    def errors(self) -> dict[str, str]:
        """``{name: message}`` of the entry points that could not be registered."""
        self._entry_points()
        return dict(self._errors)

    def get(self, name: str) -> T:
        """The value of ``name`` (loaded and made on first use)."""
        with self._lock:
            if name in self._registered:
                return self._registered[name]
            if name in self._values:
                return self._values[name]
            if name in self._builtins:
                row = self._builtins[name]
                value = self._make(name, load_attribute(row) if isinstance(row, str) else row)
            else:
                plugin = self._entry_points().get(name)
                if plugin is None:
                    raise self._unknown(name)
                if name in self._values:  # a group of several rows: made when it was read
                    return self._values[name]
                try:
                    value = self._make(name, load_attribute(plugin[0]))
                except Exception as exc:  # third-party code: report, never break the rest
                    message = (
                        f"the {self.kind} {name!r} of {plugin[1]} (entry point "
                        f"{plugin[0]!r}, group {self.group!r}) failed to load: "
                        f"{type(exc).__name__}: {exc}. It is not registered; fix or uninstall "
                        "its distribution"
                    )
                    first = name not in self._errors
                    self._errors[name] = message
                    if first:
                        warnings.warn(message, self._warning, stacklevel=3)
                        logger.warning("quantem-flow: %s", message)
                    raise ParameterError(message) from exc
            self._values[name] = value
            return value

    # -- in process --------------------------------------------------------------------
    def register(self, name: str, value: T, *, replace: bool = False) -> None:
        """Register ``value`` as ``name`` in this process (a built-in name if replaceable)."""
        with self._lock:
            if name in self._builtins and not (self._builtins_replaceable and replace):
                raise ParameterError(
                    f"{name!r} is a built-in {self.kind}; it cannot be replaced"
                    + ("" if not self._builtins_replaceable else " unless replace=True")
                )
            if name in self._registered and not replace:
                raise ParameterError(
                    f"a {self.kind} {name!r} is already registered; pass replace=True"
                )
            self._registered[name] = value

    def unregister(self, name: str) -> None:
        """Forget a row registered in process (built-ins and plug-ins stay)."""
        with self._lock:
            self._registered.pop(name, None)

    def clear(self) -> None:
        """Forget the entry points read and the values made (the next lookup reads again)."""
        with self._lock:
            self._plugins = None
            self._errors.clear()
            self._values.clear()

    # -- internals ---------------------------------------------------------------------
    def _unknown(self, name: str) -> ParameterError:
        why = f"; {self._errors[name]}" if name in self._errors else ""
        return ParameterError(f"unknown {self.kind} {name!r}; known: {self.names()}{why}")

    def _entry_points(self) -> dict[str, tuple[str, str, str]]:
        with self._lock:
            if self._plugins is not None:
                return self._plugins
            from importlib.metadata import entry_points

            found: dict[str, tuple[str, str, str]] = {}
            errors: dict[str, str] = {}
            for ep in entry_points(group=self.group):
                label = distribution_label(ep)
                origin = f"distribution {label!r}"
                where = f"entry point {ep.name!r} = {ep.value!r} of {origin}"
                if self._several is not None:
                    self._read_several(ep, where, label, found, errors)
                elif ep.name in self._builtins:
                    errors[ep.name] = (
                        f"{where} (group {self.group!r}) declares {ep.name!r}, a built-in "
                        f"{self.kind} it may not replace; it is ignored. Rename the entry point"
                    )
                elif ep.name in found:
                    errors[ep.name] = (
                        f"{where} declares {ep.name!r}, already declared by "
                        f"{found[ep.name][1]}; it is ignored"
                    )
                else:
                    found[ep.name] = (str(ep.value), origin, label)
            self._plugins = found
            self._errors.update(errors)
        for message in errors.values():
            warnings.warn(message, self._warning, stacklevel=3)
            logger.warning("quantem-flow: %s", message)
        return found

    def _read_several(
        self,
        ep: Any,
        where: str,
        label: str,
        found: dict[str, tuple[str, str, str]],
        errors: dict[str, str],
    ) -> None:
        """Load one entry point of a group whose entry points declare several rows."""
        assert self._several is not None and self._name_of is not None
        origin = f"distribution {label!r}"
        try:
            values = self._several(where, ep.load())
        except Exception as exc:  # third-party code: report, never break the rest
            errors[ep.name] = (
                f"{where} (group {self.group!r}) failed to load: {type(exc).__name__}: {exc}. "
                f"Its {self.kind} is not registered; fix or uninstall {label.split(' ')[0]!r}"
            )
            return
        for value in values:
            name = self._name_of(value)
            if name in self._builtins:
                problem = f"declares {name!r}, a built-in {self.kind} it may not replace"
            elif name in found:
                problem = f"declares {name!r}, already declared by {found[name][1]}"
            else:
                try:
                    self._values[name] = self._make(name, value)
                except Exception as exc:  # third-party code: report, never break the rest
                    errors.setdefault(
                        name, f"{where} declares {name!r}: {type(exc).__name__}: {exc}"
                    )
                    continue
                found[name] = (str(ep.value), origin, label)
                continue
            errors.setdefault(name, f"{where} {problem}; it is ignored")
