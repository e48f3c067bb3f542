#!/usr/bin/env bash
# Run HERE (a machine with PyPI) before a device run: downloads the Python 3.12
# x86-64 wheels the GPU machine lacks into .whl/ (ignored by git), to be carried
# with `run(carry=[".whl"])`. The GPU image already has numpy, numba, h5py,
# cupy-cuda13x, scipy, pyyaml, pillow, tqdm, click, msgpack, psutil, toolz.
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
rm -rf .whl && mkdir -p .whl
dl() {
  python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux1_x86_64 -d .whl "$@"
}
dl "dask==2026.8.0" "distributed==2026.8.0" hdf5plugin zarr numcodecs bitshuffle \
   cloudpickle partd locket tblib zict sortedcontainers tornado fsspec donfig \
   crc32c typing_extensions packaging
ls -la .whl
du -sh .whl
