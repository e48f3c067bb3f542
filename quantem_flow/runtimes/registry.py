"""The runtime registry: every runtime declared once, everything else derived from it.

A runtime declares itself with one :class:`RuntimeSpec`: its name, the
module it needs, a lazily imported factory, the (operation, representation,
dtype) kernels it offers, its rank for ``backend="auto"``, a probe that says
whether it runs here and with what budget, the array adapter of the SSB
stage, and where its payloads live.  Listing the registry never imports a
runtime's dependency (CuPy, MLX): the factory, the probe and the adapter are
``"module:attribute"`` strings imported on first use.

What used to be kept by hand in several places is derived from the
declarations: the capability manifest (:func:`manifest`), the
``backend="auto"`` order (:func:`auto_order`), the worker's device probe
(:func:`probe_runtime`), the modules whose objects live in device memory
(:func:`device_modules`) and the SSB backend choice.

Where the declarations come from, in order:

1. the built-in ``cpu``, ``cuda`` and ``mps`` runtimes (:data:`BUILTIN_RUNTIMES`;
   each declaration lives next to its runtime, in ``<runtime>/spec.py``);
2. installed distributions, through the entry-point group
   ``quantem_flow.runtimes`` (:data:`ENTRY_POINT_GROUP`), read once, lazily,
   on the first lookup.  Each entry point loads to a :class:`RuntimeSpec`, a
   list of them, or a callable returning either.  A broken entry point is
   reported with a :class:`RuntimeRegistryWarning` naming its distribution
   (and again as a :class:`~quantem_flow.errors.RuntimeUnavailableError`
   if its runtime is asked for); it never hides the built-in runtimes;
3. :func:`register_runtime`, in process (tests, an external-runtime bridge,
   and the external runtimes of :data:`ON_REQUEST`, registered when named).

All three live in one :class:`quantem_flow.plugins.Registry`, the mechanism
every kind of extension shares (a runtime entry point may declare several
runtimes, so the group is read whole).

A third-party package declares, in its ``pyproject.toml``::

    [project.entry-points."quantem_flow.runtimes"]
    webgpu = "my_package.spec:SPEC"
"""

from __future__ import annotations

import dataclasses
import logging
import re
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import plugins
from ..errors import ParameterError, RuntimeUnavailableError

if TYPE_CHECKING:
    from .base import Runtime

__all__ = [
    "BUILTIN_RUNTIMES",
    "BUILTIN_SPECS",
    "ENTRY_POINT_GROUP",
    "ON_REQUEST",
    "OPERATIONS",
    "ProbeResult",
    "RuntimeRegistryWarning",
    "RuntimeSpec",
    "auto_order",
    "clear_registry_cache",
    "device_modules",
    "entry_point_errors",
    "get_spec",
    "host_probe",
    "load_attribute",
    "manifest",
    "probe_runtime",
    "register_runtime",
    "runtime_specs",
    "unregister_runtime",
    "unregistered_reason",
]

logger = logging.getLogger(__name__)

#: The entry-point group third-party runtimes register in.
ENTRY_POINT_GROUP = "quantem_flow.runtimes"

#: The built-in runtimes, one row each: name -> ``"module:attribute"`` of its declaration.
BUILTIN_RUNTIMES: dict[str, str] = {
    "cpu": "quantem_flow.runtimes.cpu.spec:SPEC",
    "cuda": "quantem_flow.runtimes.cuda.spec:SPEC",
    "mps": "quantem_flow.runtimes.mps.spec:SPEC",
}
#: ``"module:attribute"`` of the built-in declarations, in this order (a view of the rows).
BUILTIN_SPECS = tuple(BUILTIN_RUNTIMES.values())

#: ``"module:function"`` of providers of runtimes registered when first named,
#: called as ``provider([name]) -> names registered``.  The external runtimes
#: (``webgpu``...) start a process or a browser when probed, so workers do not
#: probe them by default; naming one (``backend=``, ``runtimes=``) registers it.
#: Like :data:`BUILTIN_SPECS` and the entry points, these are read by name: the
#: registry never imports the external layer (``tests/test_layers.py``).
ON_REQUEST = ("quantem_flow.runtimes.external.spec:register_requested",)
#: ``"module:function"`` of the same providers' reasons, ``reason(name) -> str | None``:
#: why a runtime that was asked for could not be registered (its worker is not built...).
ON_REQUEST_REASONS = ("quantem_flow.runtimes.external.spec:why_not_registered",)

#: Operations the engine drives, and what each kernel computes.
OPERATIONS: dict[str, str] = {
    "frame_pass": "per-frame dot products with weight rows, sum and max patterns",
    "gather": "the values of chosen detector pixels for every frame",
    "ssb": "the SSB FFT and accumulation stage on gathered bright-field pixels",
}

_NAME = re.compile(r"^[a-z][a-z0-9_-]*$")
_TARGET = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")
_COMPLEX = ("complex128", "complex64")


class RuntimeRegistryWarning(plugins.PluginWarning):
    """A runtime declaration from an installed distribution could not be registered."""


def load_attribute(target: str) -> Any:
    """Import ``"module:attribute"`` (dots allowed in the attribute) and return the attribute.

    Raises
    ------
    ParameterError
        ``target`` is not of the form ``"module:attribute"``.
    ImportError, AttributeError
        The module or the attribute does not exist.
    """
    if not isinstance(target, str) or not _TARGET.match(target):
        raise ParameterError(
            f"expected 'module:attribute' (for example 'quantem_flow.runtimes.cpu:CpuRuntime'), "
            f"got {target!r}"
        )
    return plugins.load_attribute(target)


@dataclasses.dataclass(frozen=True)
class ProbeResult:
    """What a runtime's probe found on this machine.

    Attributes
    ----------
    available
        Whether the runtime runs here.
    reason
        Why not, or what was found (device, versions), for people.
    slots
        Tasks of this runtime the worker runs at once (its threads for
        ``cpu``, 1 per device otherwise); 0 when not available.
    budget_bytes
        Bytes of resident payload the worker admits for this runtime.
    details
        JSON-ready details (device name, memory, library versions).
    """

    available: bool
    reason: str
    slots: float = 0.0
    budget_bytes: int = 0
    details: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.available, bool):
            raise ParameterError(f"ProbeResult.available must be a bool, got {self.available!r}")
        if not isinstance(self.reason, str):
            raise ParameterError(f"ProbeResult.reason must be a string, got {self.reason!r}")
        slots = self.slots
        if isinstance(slots, bool) or not isinstance(slots, (int, float)) or slots < 0:
            raise ParameterError(f"ProbeResult.slots must be a number >= 0, got {slots!r}")
        if self.available and slots <= 0:
            raise ParameterError(
                f"an available runtime needs slots > 0 (tasks it runs at once), got {slots!r}"
            )
        budget = self.budget_bytes
        if isinstance(budget, bool) or not isinstance(budget, (int, np.integer)) or budget < 0:
            raise ParameterError(
                f"ProbeResult.budget_bytes must be an integer >= 0, got {budget!r}"
            )
        if not isinstance(self.details, Mapping):
            raise ParameterError(f"ProbeResult.details must be a mapping, got {self.details!r}")
        object.__setattr__(self, "slots", float(slots))
        object.__setattr__(self, "budget_bytes", int(budget))
        object.__setattr__(self, "details", dict(self.details))


def _check_target(field: str, value: Any, *, optional: bool) -> None:
    if value is None and optional:
        return
    if not isinstance(value, str) or not _TARGET.match(value):
        raise ParameterError(
            f"RuntimeSpec.{field} must be 'module:attribute'"
            + (" or None" if optional else "")
            + f", got {value!r}"
        )


def _check_dtype_name(value: Any, triple: tuple[Any, ...]) -> str:
    try:
        canonical = np.dtype(value).name
    except TypeError:
        canonical = None
    if not isinstance(value, str) or canonical != value:
        raise ParameterError(
            f"kernel {triple!r}: the dtype must be a NumPy dtype name such as 'uint16' or "
            f"'float32', got {value!r}" + (f" (write {canonical!r})" if canonical else "")
        )
    return value


@dataclasses.dataclass(frozen=True)
class RuntimeSpec:
    """The one declaration of a runtime.

    Attributes
    ----------
    name
        The runtime's name (``backend=`` and worker resources use it):
        lower case letters, digits, ``-`` and ``_``, starting with a letter.
    factory
        ``"module:Class"`` of the :class:`~quantem_flow.runtimes.base.Runtime`
        (or a callable returning one), imported on first use only.
    dependency
        The module the runtime needs (``"cupy"``, ``"mlx.core"``), ``None``
        for none beyond quantem-flow's own.  Objects of its top-level package
        count as device payloads for the worker's data mapping when
        :attr:`residency` is not ``"host"``.
    kernels
        ``(operation, representation, dtype)`` triples the runtime runs,
        dtype a NumPy dtype name (``"uint16"``).  Operations:
        :data:`OPERATIONS`; ``ssb`` takes the representation ``"gathered"``.
    auto_rank
        Preference of ``backend="auto"`` (lower first); ``None``: never
        chosen automatically.
    probe
        ``"module:function"`` called as ``probe(*, nthreads, memory_limit,
        budget_fraction)`` returning a :class:`ProbeResult`; ``None`` for
        :func:`host_probe` (the factory's ``available()``, one slot, a share
        of host memory).
    array_ops
        ``"module:attribute"`` of the SSB stage's array adapter (an
        :class:`~quantem_flow.runtimes.array_ops.ArrayOps` class), or
        ``None`` if the runtime has no SSB stage.
    array_ops_precision
        ``"complex128"`` or ``"complex64"``: the FFT precision of
        :attr:`array_ops` (complex64 runs only when the caller allows it).
    residency
        Residency prefix of the runtime's payloads: ``"host"``, ``"cuda"``
        (``cuda:<n>``), ``"mps"``, ``"external"`` (``external:<name>``).
    description
        One line for people.
    distribution
        The installed distribution that declared it (set by the registry
        for entry points; ``None`` for built-in and in-process runtimes).
    memory_pool
        The memory its payloads and kernels draw on, for budgets and
        placement: ``"host"`` (host RAM; ``mps`` too: unified memory on Apple
        silicon, host RAM elsewhere), a device's own pool (``"cuda"``), or
        ``None``: the residency for an in-process runtime, the runtime's own
        name for an external one.
    host_copy_value_bytes
        A runtime that keeps its own copy of a payload in the same memory
        pool (MLX copies host arrays into its own, ``4``: float32 values)
        declares the bytes per value of that copy, so admission counts it;
        ``None``: no such copy.
    """

    name: str
    factory: str
    dependency: str | None
    kernels: frozenset[tuple[str, str, str]]
    auto_rank: int | None = None
    probe: str | None = None
    array_ops: str | None = None
    array_ops_precision: str | None = None
    residency: str = "host"
    description: str = ""
    distribution: str | None = None
    memory_pool: str | None = None
    host_copy_value_bytes: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            raise ParameterError(
                "RuntimeSpec.name must be lower case letters, digits, '-' or '_' starting with a "
                f"letter, got {self.name!r}"
            )
        if self.name in ("auto", "any"):
            raise ParameterError(
                f"RuntimeSpec.name {self.name!r} is reserved (backend='auto', qf_runtime='any')"
            )
        _check_target("factory", self.factory, optional=False)
        _check_target("probe", self.probe, optional=True)
        _check_target("array_ops", self.array_ops, optional=True)
        if self.memory_pool is not None and (
            not isinstance(self.memory_pool, str) or not _NAME.match(self.memory_pool)
        ):
            raise ParameterError(
                f"RuntimeSpec.memory_pool must be a pool name such as 'host' or None, got "
                f"{self.memory_pool!r}"
            )
        if self.host_copy_value_bytes is not None and (
            isinstance(self.host_copy_value_bytes, bool)
            or not isinstance(self.host_copy_value_bytes, int)
            or self.host_copy_value_bytes < 1
        ):
            raise ParameterError(
                "RuntimeSpec.host_copy_value_bytes must be an integer >= 1 or None, got "
                f"{self.host_copy_value_bytes!r}"
            )
        if self.dependency is not None and (
            not isinstance(self.dependency, str)
            or not re.match(r"^[A-Za-z_][\w.]*$", self.dependency)
        ):
            raise ParameterError(
                f"RuntimeSpec.dependency must be a module name such as 'cupy' or None, got "
                f"{self.dependency!r}"
            )
        triples: set[tuple[str, str, str]] = set()
        try:
            items = list(self.kernels)
        except TypeError:
            items = None
        if items is None or isinstance(self.kernels, (str, bytes)):
            raise ParameterError(
                f"RuntimeSpec.kernels must be (operation, representation, dtype) triples, got "
                f"{self.kernels!r}"
            )
        for triple in items:
            if (
                not isinstance(triple, tuple)
                or len(triple) != 3
                or not all(isinstance(v, str) and v for v in triple[:2])
            ):
                raise ParameterError(
                    f"RuntimeSpec {self.name!r}: each kernel must be an (operation, "
                    f"representation, dtype) tuple of strings, got {triple!r}"
                )
            triples.add((triple[0], triple[1], _check_dtype_name(triple[2], triple)))
        object.__setattr__(self, "kernels", frozenset(triples))
        if self.auto_rank is not None and (
            isinstance(self.auto_rank, bool) or not isinstance(self.auto_rank, int)
        ):
            raise ParameterError(
                f"RuntimeSpec.auto_rank must be an integer (lower is preferred) or None (never "
                f"chosen by backend='auto'), got {self.auto_rank!r}"
            )
        if self.array_ops is not None and self.array_ops_precision not in _COMPLEX:
            raise ParameterError(
                f"RuntimeSpec {self.name!r} declares array_ops, so array_ops_precision must be "
                f"one of {list(_COMPLEX)}, got {self.array_ops_precision!r}"
            )
        if self.array_ops is None and self.array_ops_precision is not None:
            raise ParameterError(
                f"RuntimeSpec {self.name!r}: array_ops_precision given without array_ops"
            )
        if any(op == "ssb" for op, _, _ in triples) and self.array_ops is None:
            raise ParameterError(
                f"RuntimeSpec {self.name!r} declares 'ssb' kernels but no array_ops adapter"
            )
        if not isinstance(self.residency, str) or not _NAME.match(self.residency):
            raise ParameterError(
                "RuntimeSpec.residency must be a residency prefix such as 'host', 'cuda', 'mps' "
                f"or 'external', got {self.residency!r}"
            )
        if not isinstance(self.description, str):
            raise ParameterError(
                f"RuntimeSpec.description must be a string, got {self.description!r}"
            )

    # -- queries ------------------------------------------------------------------------------
    def supports(self, operation: str, representation: str, dtype: Any = None) -> bool:
        """Whether a kernel is declared for ``operation`` on ``representation`` (and ``dtype``).

        ``dtype=None`` asks for any dtype.
        """
        if dtype is None:
            return any(op == operation and rep == representation for op, rep, _ in self.kernels)
        return (operation, representation, dtype_name(dtype)) in self.kernels

    def dtypes(self, operation: str, representation: str) -> tuple[str, ...]:
        """The dtype names declared for ``operation`` on ``representation``, sorted."""
        return tuple(
            sorted(d for op, rep, d in self.kernels if op == operation and rep == representation)
        )

    def operations(self) -> frozenset[tuple[str, str]]:
        """The declared ``(operation, representation)`` pairs."""
        return frozenset((op, rep) for op, rep, _ in self.kernels)

    @property
    def origin(self) -> str:
        """Where the declaration came from, for messages."""
        if self.distribution:
            return f"distribution {self.distribution!r}"
        return "quantem-flow" if self.name in _builtin_names() else "register_runtime()"

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-ready description."""
        return {
            "name": self.name,
            "factory": self.factory,
            "dependency": self.dependency,
            "kernels": sorted(list(k) for k in self.kernels),
            "auto_rank": self.auto_rank,
            "probe": self.probe,
            "array_ops": self.array_ops,
            "array_ops_precision": self.array_ops_precision,
            "residency": self.residency,
            "description": self.description,
            "distribution": self.distribution,
        }


def dtype_name(dtype: Any) -> str:
    """The NumPy name of ``dtype`` (byte order ignored): ``">u2"`` gives ``"uint16"``."""
    return str(np.dtype(dtype).name)


# -- registry state ---------------------------------------------------------------------------
_lock = threading.RLock()
_instances: dict[str, Runtime] = {}


def _make_spec(name: str, spec: Any) -> RuntimeSpec:
    """A loaded declaration, checked, with its residency announced to the chunk layer."""
    if not isinstance(spec, RuntimeSpec):
        raise TypeError(f"it is not a RuntimeSpec: {spec!r}")
    if spec.name != name:
        raise TypeError(f"it declares the runtime {spec.name!r}, not {name!r}")
    _announce_residency(spec)
    return spec


_registry: plugins.Registry[RuntimeSpec] = plugins.Registry(
    "runtime",
    ENTRY_POINT_GROUP,
    BUILTIN_RUNTIMES,
    _make_spec,
    warning=RuntimeRegistryWarning,
    several=lambda where, loaded: _specs_of(loaded, where),
    name_of=lambda spec: spec.name,
    builtins_replaceable=True,
)


def _builtin_names() -> tuple[str, ...]:
    return _registry.builtin_names()


def _announce_residency(spec: RuntimeSpec) -> None:
    from ..representations.chunk import register_residency

    register_residency(spec.residency)


def _specs_of(obj: Any, where: str) -> list[RuntimeSpec]:
    if callable(obj) and not isinstance(obj, RuntimeSpec):
        obj = obj()
    items = [obj] if isinstance(obj, RuntimeSpec) else obj
    if (
        not isinstance(items, (list, tuple))
        or not items
        or not all(isinstance(s, RuntimeSpec) for s in items)
    ):
        raise TypeError(
            f"{where} must load to a RuntimeSpec, a list of them, or a callable returning "
            f"either; got {type(obj).__name__}" + (" (empty)" if items == [] else "")
        )
    return list(items)


def runtime_specs() -> dict[str, RuntimeSpec]:
    """Return ``{name: RuntimeSpec}`` of every registered runtime (built-ins first).

    Reads the entry points once (see the module docstring); never imports a
    runtime's dependency.
    """
    out: dict[str, RuntimeSpec] = {}
    with _lock:
        for name in _registry.names():
            spec = _registry.get(name)
            label = _registry.distribution(name)
            out[name] = spec if label is None else dataclasses.replace(spec, distribution=label)
    return out


def entry_point_errors() -> dict[str, str]:
    """Return ``{entry point or runtime name: message}`` of declarations that failed."""
    return _registry.errors()


def get_spec(name: str) -> RuntimeSpec:
    """Return the declaration of runtime ``name``.

    Raises
    ------
    RuntimeUnavailableError
        No runtime of that name is registered (the message names those that
        are, and why a broken entry point of that name did not register).
    """
    specs = runtime_specs()
    spec = specs.get(name) if isinstance(name, str) else None
    if spec is not None:
        return spec
    for target in ON_REQUEST:  # runtimes registered when named (webgpu...)
        try:
            registered = load_attribute(target)([name]) if isinstance(name, str) else []
        except ImportError as exc:  # pragma: no cover - a broken installation
            logger.warning("quantem-flow: runtime provider %s does not import: %s", target, exc)
            continue
        if name in registered:
            return runtime_specs()[name]
    why = unregistered_reason(name) if isinstance(name, str) else None
    if why:
        raise RuntimeUnavailableError(
            f"runtime {name!r} is not registered: {why}. Registered runtimes: {sorted(specs)}"
        )
    broken = entry_point_errors().get(name) if isinstance(name, str) else None
    if broken:
        raise RuntimeUnavailableError(
            f"runtime {name!r} is not registered: {broken}. Registered runtimes: {sorted(specs)}"
        )
    raise RuntimeUnavailableError(
        f"unknown runtime {name!r}; registered runtimes: {sorted(specs)}. Install the package "
        f"that provides it (entry-point group {ENTRY_POINT_GROUP!r}) or register it with "
        "quantem_flow.runtimes.register_runtime()"
    )


def unregistered_reason(name: str) -> str | None:
    """Why runtime ``name`` was asked for but could not be registered (``None``: no reason known).

    The providers of :data:`ON_REQUEST` say it (an external worker that is not
    built, a toolchain that is missing); a broken entry point's error is
    :func:`entry_point_errors`'.
    """
    for target in ON_REQUEST_REASONS:
        try:
            why = load_attribute(target)(name)
        except ImportError as exc:  # pragma: no cover - a broken installation
            logger.warning("quantem-flow: runtime provider %s does not import: %s", target, exc)
            continue
        if why:
            return str(why)
    return None


def register_runtime(spec: RuntimeSpec, *, replace: bool = False) -> RuntimeSpec:
    """Register a runtime in this process (tests, bridges to external workers).

    Parameters
    ----------
    spec
        The declaration.
    replace
        Replace a runtime of the same name (built-in ones included) instead
        of refusing.

    Returns
    -------
    RuntimeSpec
        ``spec``.

    Raises
    ------
    ParameterError
        ``spec`` is not a :class:`RuntimeSpec`, or its name is taken and
        ``replace`` is false.
    """
    if not isinstance(spec, RuntimeSpec):
        raise ParameterError(f"register_runtime() takes a RuntimeSpec, got {spec!r}")
    with _lock:
        existing = runtime_specs().get(spec.name)
        if existing is not None and existing != spec and not replace:
            raise ParameterError(
                f"runtime {spec.name!r} is already registered (by {existing.origin}); choose "
                "another name, or pass replace=True to replace it in this process"
            )
        _registry.register(spec.name, spec, replace=True)
        _instances.pop(spec.name, None)
        _announce_residency(spec)
    return spec


def unregister_runtime(name: str) -> None:
    """Remove a runtime registered with :func:`register_runtime` (a no-op for unknown names).

    Raises
    ------
    ParameterError
        ``name`` is a built-in or entry-point runtime not replaced in process.
    """
    with _lock:
        known = runtime_specs()
        if name in known and _registry.origin(name) == "registered in process":
            _registry.unregister(name)
            _instances.pop(name, None)
            return
        if name in known:
            raise ParameterError(
                f"runtime {name!r} was not registered with register_runtime() (it comes from "
                f"{runtime_specs()[name].origin}); only in-process registrations can be removed"
            )


def clear_registry_cache() -> None:
    """Forget the entry points read and the runtime instances made; read them again next time.

    In-process registrations (:func:`register_runtime`) are kept.
    """
    with _lock:
        _registry.clear()
        _instances.clear()


# -- derived views ----------------------------------------------------------------------------
def auto_order() -> tuple[str, ...]:
    """Names ``backend="auto"`` tries, best first (by ``auto_rank``, then name)."""
    ranked = [(s.auto_rank, n) for n, s in runtime_specs().items() if s.auto_rank is not None]
    return tuple(n for _, n in sorted(ranked))


def manifest() -> dict[str, dict[str, Any]]:
    """Return ``{name: declaration as a dict}``: what each runtime offers, without importing it."""
    return {name: spec.to_dict() for name, spec in runtime_specs().items()}


def device_modules() -> tuple[str, ...]:
    """Top-level packages whose objects live in device memory (``("cupy", "mlx")``)."""
    out: list[str] = []
    for spec in runtime_specs().values():
        if spec.residency != "host" and spec.dependency:
            top = spec.dependency.split(".", 1)[0]
            if top not in out:
                out.append(top)
    return tuple(out)


def residency_of_module(module: str) -> str | None:
    """The residency prefix of objects of top-level package ``module``, if a runtime declares it."""
    for spec in runtime_specs().values():
        if (
            spec.residency != "host"
            and spec.dependency
            and spec.dependency.split(".", 1)[0] == module
        ):
            return spec.residency
    return None


def host_probe(
    spec: RuntimeSpec, *, nthreads: int, memory_limit: int, budget_fraction: float
) -> ProbeResult:
    """The probe of a runtime that declares none: its ``available()``, 1 slot, host budget."""
    factory = load_attribute(spec.factory)
    check = getattr(factory, "available", None)
    if callable(check):
        ok, why = check()
    else:
        ok, why = True, "declares no availability check"
    if not ok:
        return ProbeResult(False, str(why))
    return ProbeResult(True, str(why), 1.0, int(budget_fraction * memory_limit), {})


def probe_runtime(
    name: str, *, nthreads: int = 1, memory_limit: int, budget_fraction: float = 0.8
) -> ProbeResult:
    """Run runtime ``name``'s declared probe.

    Parameters
    ----------
    name
        A registered runtime.
    nthreads
        The worker's threads.
    memory_limit
        Host bytes the worker may use (its memory limit, or the machine's).
    budget_fraction
        Share of memory admitted for resident payloads, in (0, 1].

    Returns
    -------
    ProbeResult
        Availability, slots, budget and details.  A probe that raises or
        returns something else is reported as not available, with the error
        as the reason.

    Raises
    ------
    RuntimeUnavailableError
        ``name`` is not registered.
    """
    spec = get_spec(name)
    try:
        if spec.probe is None:
            result: Any = host_probe(
                spec, nthreads=nthreads, memory_limit=memory_limit, budget_fraction=budget_fraction
            )
        else:
            fn = load_attribute(spec.probe)
            result = fn(
                nthreads=nthreads, memory_limit=memory_limit, budget_fraction=budget_fraction
            )
    except Exception as exc:  # a probe failure is the runtime being unavailable, with the reason
        return ProbeResult(
            False, f"the probe {spec.probe or 'host_probe'} raised {type(exc).__name__}: {exc}"
        )
    if not isinstance(result, ProbeResult):
        return ProbeResult(
            False,
            f"the probe {spec.probe} of runtime {name!r} ({spec.origin}) returned "
            f"{type(result).__name__}, not a ProbeResult",
        )
    return result


def instances() -> dict[str, Runtime]:
    """The process's runtime instances by name (made by ``get_runtime``)."""
    return _instances


def iter_specs(names: Iterable[str] | None = None) -> Iterator[RuntimeSpec]:
    """Yield the declarations of ``names`` (default every registered runtime)."""
    specs = runtime_specs()
    for name in specs if names is None else names:
        yield specs[name] if name in specs else get_spec(name)


def factory_of(spec: RuntimeSpec) -> Callable[..., Runtime]:
    """Import and return the runtime factory of ``spec``."""
    factory: Callable[..., Runtime] = load_attribute(spec.factory)
    return factory
