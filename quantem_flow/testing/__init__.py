"""Test support shipped with quantem-flow, for its own tests and for third-party runtimes.

:mod:`quantem_flow.testing.runtime_conformance` is the runtime conformance
suite: one case per ``(operation, representation, dtype)`` triple a runtime
declares, run through the payload contract (``put``, ``run_frame_pass``,
``run_gather``, ``release``) against the CPU reference, with tolerances
taken from the runtime's declared accumulation precision.  Any package can
run it on its runtime::

    import pytest
    from quantem_flow.testing import conformance_params, run_case

    @pytest.mark.parametrize("case", conformance_params(["webgpu"]))
    def test_webgpu_conforms(case):
        run_case(case)

:mod:`quantem_flow.testing.readers` is the reader conformance suite: the
checks every reader passes (format, shape, exact whole and block reads,
stored-byte runs, orientation, pickling, identity), run on a case a
package writes with its own independent writer.

pytest is needed only by :func:`conformance_params` and by the skips of
:func:`run_case`; importing this package does not import it.
"""

from .runtime_conformance import (
    ConformanceCase,
    RuntimeFactory,
    Tol,
    check_frame_pass,
    check_frame_pass_case,
    check_gather_case,
    conformance_cases,
    conformance_params,
    register_poisoner,
    run_case,
    tolerances,
)

__all__ = [
    "ConformanceCase",
    "RuntimeFactory",
    "Tol",
    "check_frame_pass",
    "check_frame_pass_case",
    "check_gather_case",
    "conformance_cases",
    "conformance_params",
    "register_poisoner",
    "run_case",
    "tolerances",
]
