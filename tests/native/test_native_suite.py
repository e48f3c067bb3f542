"""The native/ Swift worker's own suites (Swift Testing), run as part of the pytest suite.

- ``swift test``: the codec against every golden vector (parsed and re-emitted byte for
  byte, every invalid one refused with the reference's code), canonical JSON, 12 000
  seeded mutations of the vectors, the CPU backend's kernels against a reference on random
  data, the worker's state machine, and the executable replayed over real pipes;
- the same tests built with AddressSanitizer (LeakSanitizer on; the suppressions name only
  the test harness: XCTest, Foundation's JSONDecoder and Process);
- a bounded libFuzzer run (``swiftc -sanitize=fuzzer,address``) of the frame decoder and
  request validation, seeded with the golden vectors;
- ``swift format lint --strict`` over the package.

``scripts/install-toolchains.sh`` builds them (``scripts/build-native.sh``).  Where Swift is
installed a missing build fails, saying how to build it; where ``swift`` is not installed
(a machine without the toolchain) the tests skip, naming how to install it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.swift_toolchain import INSTALL_HINT

NATIVE = Path(__file__).resolve().parents[2] / "native"
VECTORS = NATIVE.parent / "docs" / "protocol" / "vectors"

pytestmark = pytest.mark.slow


def _swift() -> str:
    swift = shutil.which("swift")
    if swift is None:
        pytest.skip(INSTALL_HINT)
    return swift


def _require(path: Path) -> None:
    assert path.exists(), (
        f"{path} is missing: run `bash scripts/install-toolchains.sh` (scripts/build-native.sh)"
    )


def _swift_test(*args: str, env: dict[str, str] | None = None) -> str:
    # SwiftPM leaves an empty TemporaryDirectory.XXXXXX in $TMPDIR on every run: its own TMPDIR
    with tempfile.TemporaryDirectory(prefix="qf-swiftpm-") as tmp:
        run = subprocess.run(
            [_swift(), "test", *args],
            cwd=NATIVE,
            capture_output=True,
            text=True,
            timeout=900,
            env={**os.environ, **(env or {}), "TMPDIR": tmp},
            check=False,
        )
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-6000:]
    summary = re.search(r"Test run with (\d+) tests? in \d+ suites? passed", out)
    assert summary is not None, out[-3000:]
    assert int(summary.group(1)) >= 30, out[-3000:]
    assert "✘" not in out and "skipped" not in out.lower(), "a skipped Swift test is not evidence"
    return out


def test_swift_suite_passes() -> None:
    _swift()
    _require(NATIVE / ".build" / "debug")
    out = _swift_test()
    for suite in ("golden vectors", "CPU backend kernels", "qf-swift-worker over pipes"):
        assert f'Suite "{suite}" passed' in out, suite


def test_swift_suite_passes_under_address_sanitizer() -> None:
    _swift()
    _require(NATIVE / ".build-asan")
    supp = NATIVE / "Tests" / "lsan-suppressions.txt"
    out = _swift_test(
        "--sanitize=address",
        "--scratch-path",
        ".build-asan",
        env={"LSAN_OPTIONS": f"suppressions={supp}", "ASAN_OPTIONS": "detect_leaks=1"},
    )
    assert "ERROR: AddressSanitizer" not in out and "ERROR: LeakSanitizer" not in out


def test_frame_parser_survives_a_bounded_libfuzzer_run(tmp_path: Path) -> None:
    _swift()
    fuzzer = NATIVE / ".build-fuzz" / "qf-fuzz-protocol"
    _require(fuzzer)
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    vectors = sorted(VECTORS.glob("*.bin"))
    assert len(vectors) >= 20
    for v in vectors:
        (corpus / v.name).write_bytes(v.read_bytes())
    run = subprocess.run(
        [str(fuzzer), "-max_total_time=5", "-rss_limit_mb=1024", "-timeout=5", str(corpus)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=tmp_path,
    )
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-4000:]
    done = re.search(r"Done (\d+) runs", out)
    assert done is not None and int(done.group(1)) > 1000, out[-2000:]


def test_swift_sources_are_formatted(tmp_path: Path) -> None:
    swift = _swift()
    run = subprocess.run(
        [
            swift,
            "format",
            "lint",
            "--strict",
            "--recursive",
            "Sources",
            "Tests",
            "Fuzz",
            "Package.swift",
        ],
        cwd=NATIVE,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "TMPDIR": str(tmp_path)},  # SwiftPM's leftover temporary folders
        check=False,
    )
    assert run.returncode == 0 and not run.stderr.strip(), run.stdout + run.stderr


def test_every_target_treats_warnings_as_errors() -> None:
    manifest = (NATIVE / "Package.swift").read_text()
    targets = re.findall(r"\.(?:target|executableTarget|testTarget)\(\s*name: \"(\w+)\"", manifest)
    assert len(targets) == 7, targets
    blocks = re.split(r"\.(?:target|executableTarget|testTarget)\(", manifest)[1:]
    assert all("swiftSettings: strict" in b for b in blocks), "a target without warnings as errors"
    assert "treatAllWarnings(as: .error)" in manifest
    assert ".package(" not in manifest, "native/ depends on nothing outside the toolchain"


def test_metal_kernel_source_is_well_formed_cpp_under_a_stand_in_header(tmp_path: Path) -> None:
    """A syntax and name check of the MSL source on Linux, with g++ and a stand-in header.

    Linux has no Metal: this cannot say that the kernels compile or run on a GPU (the
    macOS workflow, .github/workflows/native-macos.yml, does that on Apple hardware).  It
    catches what C++ catches: syntax, undeclared names, type mismatches in the shared code.
    """
    gxx = shutil.which("g++")
    assert gxx is not None, "g++ is not installed (apt-get install g++)"
    swift = (NATIVE / "Sources" / "QFDevice" / "MetalKernels.swift").read_text()
    start = swift.index('static let source = """') + len('static let source = """')
    source = swift[start : swift.index('"""', start)]
    assert "kernel void frame_dot" in source and "function_constant(0)" in source
    assert source.count("#include <metal_stdlib>") == 1
    cpp = tmp_path / "kernels.cpp"
    cpp.write_text(source.replace("#include <metal_stdlib>", '#include "msl-syntax-shim.h"'))
    run = subprocess.run(
        [
            gxx,
            "-std=c++17",
            "-fsyntax-only",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-Wno-attributes",
            "-Wno-unused-parameter",
            "-I",
            str(NATIVE / "Tests"),
            str(cpp),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-4000:]
