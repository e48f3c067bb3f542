"""LLVM's -O3 pipeline and the host's machine code, for the kernels written as IR.

The dot kernel (:mod:`.dot_ir`) and the row hasher (:mod:`.xxh3_ir`) are
parsed, optimised and compiled in LLVM's one global context, which Numba's
code generator uses from other worker threads at the same time: every use
of :func:`optimised`, :func:`compiled` and :func:`assembly` holds Numba's
compiler lock.  (The SSB loop of :mod:`.trotter_ir` keeps its own context.)
"""

from __future__ import annotations

from typing import Any

__all__ = ["assembly", "compiled", "host_target", "optimise_o3", "optimised"]


def optimise_o3(module: Any, machine: Any) -> None:
    """Run LLVM's -O3 module pipeline on ``module`` (llvmlite) for ``machine``, in place."""
    import llvmlite.binding as llvm

    if hasattr(llvm, "create_pass_builder"):  # llvmlite >= 0.44: the new pass manager
        tuning = llvm.create_pipeline_tuning_options(speed_level=3)
        builder = llvm.create_pass_builder(machine, tuning)
        builder.getModulePassManager().run(module, builder)
    else:  # pragma: no cover - older llvmlite
        legacy = llvm.PassManagerBuilder()
        legacy.opt_level = 3
        passes = llvm.ModulePassManager()
        legacy.populate(passes)
        passes.run(module)


def host_target() -> dict[str, str]:
    """``cpu`` and ``features`` of this machine, as :func:`optimised` takes them."""
    import llvmlite.binding as llvm

    return {
        "cpu": str(llvm.get_host_cpu_name()),
        "features": llvm.get_host_cpu_features().flatten(),
    }


def optimised(module: Any, *, cpu: str, features: str) -> tuple[Any, Any]:
    """``module`` (``llvmlite.ir``) parsed, verified and optimised for ``cpu``.

    Returns the parsed module and its target machine.  The caller holds
    ``numba.core.compiler_lock.global_compiler_lock`` (see the module docstring).
    """
    import llvmlite.binding as llvm

    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    parsed = llvm.parse_assembly(str(module))
    parsed.verify()
    target = llvm.Target.from_triple(module.triple)
    machine = target.create_target_machine(cpu=cpu, features=features, opt=3)
    optimise_o3(parsed, machine)
    return parsed, machine


def compiled(module: Any, *, cpu: str, features: str) -> Any:
    """An execution engine holding ``module`` compiled for ``cpu`` (it must outlive the code)."""
    import llvmlite.binding as llvm
    from numba.core.compiler_lock import global_compiler_lock

    with global_compiler_lock:
        parsed, machine = optimised(module, cpu=cpu, features=features)
        engine = llvm.create_mcjit_compiler(parsed, machine)
        engine.finalize_object()
    return engine


def assembly(module: Any, *, cpu: str, features: str) -> str:
    """The machine code ``module`` compiles to for ``cpu``, as assembly text."""
    from numba.core.compiler_lock import global_compiler_lock

    with global_compiler_lock:
        parsed, machine = optimised(module, cpu=cpu, features=features)
        return str(machine.emit_assembly(parsed))
