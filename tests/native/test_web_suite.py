"""The web/ worker's own suites (node's test runner) and linters, run as part of the pytest suite.

CI installs Node's packages with ``scripts/install-toolchains.sh`` (``npm ci``); a
missing install is a failure that says how to install: the WebGPU worker runs on
this machine kind (Dawn on Mesa GLES, Chromium's SwiftShader).  The one exception
is a machine that cannot reach the npm registry: the tests skip with that reason
(:mod:`tests.npm_registry`).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.npm_registry import require_web_build

WEB = Path(__file__).resolve().parents[2] / "web"

pytestmark = pytest.mark.slow


def _npm(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    npm = shutil.which("npm")
    assert npm is not None, "npm is not on PATH; install Node.js 20 and npm"
    require_web_build(WEB / "node_modules", what="web/'s npm packages")
    return subprocess.run(
        [npm, *args], cwd=WEB, capture_output=True, text=True, timeout=timeout, check=False
    )


def test_web_node_test_suite_passes() -> None:
    run = _npm("test", timeout=600)
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-6000:]
    passed = re.search(r"^# pass (\d+)$", out, re.M)
    failed = re.search(r"^# fail (\d+)$", out, re.M)
    skipped = re.search(r"^# skipped (\d+)$", out, re.M)
    assert passed and failed and skipped, out[-3000:]
    assert int(failed.group(1)) == 0
    assert int(skipped.group(1)) == 0, "a skipped web test is not evidence"
    assert int(passed.group(1)) >= 20, out[-3000:]


def test_web_sources_are_formatted_and_typecheck() -> None:
    run = _npm("run", "lint", timeout=300)
    assert run.returncode == 0, (run.stdout + run.stderr)[-6000:]
