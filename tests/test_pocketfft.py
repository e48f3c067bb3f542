"""SciPy's pocketfft extension loaded without the scipy.fft package: SciPy's values, bit for bit."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import scipy.fft

from quantem_flow.runtimes.cpu import pocketfft


def test_this_scipy_s_extension_loads_on_its_own() -> None:
    # the SciPy the project installs keeps it where pocketfft.py looks: if a SciPy release
    # moves it, every call still runs through scipy.fft, and this test says so
    assert pocketfft.extension() is not None
    assert "pocketfft extension" in pocketfft.backend_name()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("workers", [1, 2])
def test_rfft_fft_and_rfft2_are_scipy_s_bit_for_bit(
    rng: np.random.Generator, dtype: type, workers: int
) -> None:
    x = rng.standard_normal((4, 37, 50)).astype(dtype)
    for n in (50, 64, 40):  # as is, zero-padded, cut
        a = scipy.fft.rfft(x, n=n, axis=-1, workers=workers)
        b = pocketfft.rfft(x, n=n, axis=-1, workers=workers)
        assert b.dtype == a.dtype and np.array_equal(a, b)
        band = a[:, :, :7]  # a view, as the SSB stage passes it
        for m in (37, 48, 30):
            for overwrite in (False, True):
                c1, c2 = band.copy(), band.copy()
                a2 = scipy.fft.fft(c1, n=m, axis=1, workers=workers, overwrite_x=overwrite)
                b2 = pocketfft.fft(c2, n=m, axis=1, workers=workers, overwrite_x=overwrite)
                assert b2.dtype == a2.dtype and np.array_equal(a2, b2)
        real = scipy.fft.fft(x, n=n, axis=-1, workers=workers)
        assert np.array_equal(real, pocketfft.fft(x, n=n, axis=-1, workers=workers))
    for s in ((37, 50), (64, 64), (30, 40)):
        a = scipy.fft.rfft2(x, s=s, axes=(-2, -1), workers=workers)
        assert np.array_equal(a, pocketfft.rfft2(x, s=s, axes=(-2, -1), workers=workers))
    ints = rng.integers(0, 9, (3, 8, 8))  # converted as scipy.fft converts them (float64)
    a = scipy.fft.rfft(ints, n=8, axis=-1, workers=1)
    assert np.array_equal(a, pocketfft.rfft(ints, n=8, axis=-1, workers=1))


def test_bad_input_is_refused_as_scipy_refuses_it() -> None:
    with pytest.raises(TypeError, match="real"):
        pocketfft.rfft(np.ones(4, dtype=np.complex128), n=4, axis=-1, workers=1)
    with pytest.raises(ValueError, match="axis 3 is out of range"):
        pocketfft.rfft(np.ones((2, 2)), n=2, axis=3, workers=1)


def test_the_ssb_stage_does_not_import_the_scipy_fft_package() -> None:
    code = (
        "import sys, numpy as np\n"
        "from quantem_flow.runtimes.cpu import pocketfft\n"
        "f = pocketfft.rfft(np.ones((2, 8)), n=8, axis=-1, workers=1)\n"
        "print(sorted(m for m in ('scipy.fft', 'scipy.special') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_without_the_extension_every_call_is_scipy_fft_s(
    monkeypatch: pytest.MonkeyPatch, rng: np.random.Generator
) -> None:
    monkeypatch.setattr(pocketfft, "_loaded", [None])
    assert pocketfft.backend_name().startswith("scipy.fft (pocketfft)")
    x = rng.standard_normal((3, 9, 10))
    assert np.array_equal(
        pocketfft.rfft(x, n=12, axis=-1, workers=1), scipy.fft.rfft(x, n=12, axis=-1)
    )
    f = scipy.fft.rfft(x, axis=-1)
    assert np.array_equal(pocketfft.fft(f, n=9, axis=1, workers=1), scipy.fft.fft(f, n=9, axis=1))
    assert np.array_equal(
        pocketfft.rfft2(x, s=(9, 10), axes=(-2, -1), workers=1), scipy.fft.rfft2(x)
    )
