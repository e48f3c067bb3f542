"""LLVM's -O3 pipeline on a parsed module, for the kernels written as IR (dot, trotter)."""

from __future__ import annotations

from typing import Any

__all__ = ["optimise_o3"]


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
