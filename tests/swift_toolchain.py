"""Whether Swift can exist here, and what a native/ test does when the worker is not built.

Where the Swift toolchain is installed, a missing ``native/`` build is a failure that says
how to build it (``scripts/install-toolchains.sh`` builds it).  Where ``swift`` is not
installed (a machine without the toolchain: Debian ships none, and no reachable registry
carries one), the tests skip, naming how to install it.
"""

from __future__ import annotations

import shutil

import pytest

from quantem_flow.runtimes.external.swift import swift_worker_path

INSTALL_HINT = (
    "the Swift toolchain is not installed here: install Swift 6 (https://www.swift.org/install/"
    ", or Xcode on macOS) and run `bash scripts/install-toolchains.sh`"
)


def require_swift_build() -> None:
    """Skip where Swift is not installed; fail where it is and the worker is not built."""
    if swift_worker_path().is_file():
        return
    if shutil.which("swift") is None:
        pytest.skip(INSTALL_HINT)
    pytest.fail(
        f"{swift_worker_path()} is missing: run `bash scripts/install-toolchains.sh` "
        "(scripts/build-native.sh builds native/)"
    )
