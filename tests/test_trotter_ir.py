"""SSB's trotter loop in LLVM IR: the reference loop's values bit for bit, without Numba."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import numba
import numpy as np
import pytest

from quantem_flow.runtimes.cpu.array_ops import _trotter_loop
from quantem_flow.runtimes.cpu.trotter_ir import trotter_kernel

REFERENCE = numba.njit(cache=False, nogil=True)(_trotter_loop)


def _inputs(rng: np.random.Generator, n: int, nr: int, nc: int, phase: bool) -> list[Any]:
    f = rng.normal(size=(n, nr, nc)) + 1j * rng.normal(size=(n, nr, nc))
    vr, vc = rng.normal(size=n) * 0.4, rng.normal(size=n) * 0.4
    m = rng.uniform(0.2, 3.0, size=n)
    qr, qc = rng.normal(size=nr), rng.normal(size=nc)
    if phase:
        er = np.exp(1j * rng.normal(size=(n, nr)) * 3)
        ec = np.exp(1j * rng.normal(size=(n, nc)) * 3)
    else:
        er = ec = np.ones((1, 1), dtype=np.complex128)
    return [f, vr, vc, m, qr, qc, er, ec, phase]


def _run(fn: Any, args: list[Any], nr: int, nc: int) -> list[np.ndarray]:
    out = [
        np.zeros((nr, nc), dtype=np.complex128),
        np.zeros((nr, nc), dtype=np.complex128),
        np.zeros((2, nr, nc), dtype=np.int64),
        np.zeros((nr, nc)),
        np.zeros((nr, nc)),
    ]
    fn(*args, *out)
    return out


def _same_bits(a: list[np.ndarray], b: list[np.ndarray]) -> None:
    for x, y in zip(a, b, strict=True):
        assert x.tobytes() == y.tobytes()


@pytest.mark.parametrize("phase", [False, True])
def test_values_equal_the_reference_bit_for_bit(rng: np.random.Generator, phase: bool) -> None:
    kernel = trotter_kernel()
    counted = 0
    for _ in range(25):
        n, nr, nc = (int(v) for v in rng.integers(1, 24, 3))
        args = _inputs(rng, n, nr, nc, phase)
        got = _run(kernel, args, nr, nc)
        _same_bits(got, _run(REFERENCE, args, nr, nc))
        counted += int(got[2].sum())
    # some frequencies were in a trotter (a block of one or two pixels may have none)
    assert counted > 0


def test_non_finite_values_and_a_ssb_sized_block(rng: np.random.Generator) -> None:
    n, nr, nc = 64, 70, 36
    args = _inputs(rng, n, nr, nc, True)
    f = args[0]
    f[3, 5, 7] = np.nan
    f[9, 1, 2] = complex(np.inf, -np.inf)
    args[3][4] = np.nan  # a pixel whose aperture term is NaN: never in a trotter
    got = _run(trotter_kernel(), args, nr, nc)
    _same_bits(got, _run(REFERENCE, args, nr, nc))


def test_arguments_are_checked_before_raw_memory_is_read(rng: np.random.Generator) -> None:
    kernel = trotter_kernel()
    args = _inputs(rng, 4, 3, 2, True)
    out = [
        np.zeros((3, 2), dtype=np.complex128),
        np.zeros((3, 2), dtype=np.complex128),
        np.zeros((2, 3, 2), dtype=np.int64),
        np.zeros((3, 2)),
        np.zeros((3, 2)),
    ]
    with pytest.raises(ValueError, match=r"argument ec: .*shape \(4, 2\)"):
        kernel(*args[:7], args[7][:, :1], True, *out)
    with pytest.raises(ValueError, match="argument counts: expected a C-contiguous int64"):
        kernel(*args, *out[:2], out[2].astype(np.int32), *out[3:])
    with pytest.raises(ValueError, match=r"argument f: .*contiguous: False"):
        kernel(np.asfortranarray(args[0]), *args[1:], *out)
    out[3].flags.writeable = False
    with pytest.raises(ValueError, match="output e1 is read-only"):
        kernel(*args, *out)
    empty = _inputs(rng, 0, 3, 2, False)
    kernel(*empty, *[np.zeros_like(o) for o in out])  # nothing to add


def test_the_cpu_stage_compiles_it_without_numba() -> None:
    code = (
        "import sys, numpy as np\n"
        "from quantem_flow.runtimes.cpu.trotter_ir import trotter_kernel\n"
        "k = trotter_kernel()\n"
        "f = np.ones((2, 3, 4), dtype=complex)\n"
        "v = np.array([0.1, -0.2]); m = np.array([1.0, 2.0])\n"
        "q3, q4 = np.linspace(-1, 1, 3), np.linspace(-1, 1, 4)\n"
        "e = np.ones((1, 1), dtype=complex)\n"
        "out = [np.zeros((3, 4), complex), np.zeros((3, 4), complex),\n"
        "       np.zeros((2, 3, 4), np.int64), np.zeros((3, 4)), np.zeros((3, 4))]\n"
        "k(f, v, v, m, q3, q4, e, e, False, *out)\n"
        "print(int(out[2].sum()), 'numba' in sys.modules, round(k.compile_s, 3))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    total, numba_loaded, _ = done.stdout.split()
    assert int(total) > 0
    assert numba_loaded == "False"
