#!/usr/bin/env bash
# One device check for issue 5: install what is missing, run the CUDA
# conformance cases, time the main kernels on a 512 x 512 scan x 192 x 192
# detector uint16 dataset (generated on the GPU), print a short table.
#
# Usage on the device machine (through the `device` tool):
#   run(command="bash benchmarks/gpu_check.sh", carry=[".whl"], timeout_s=540)
# after `bash benchmarks/gpu_wheels.sh` here. Output table also goes to $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/qf-gpu-out}"; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
else
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c "import quantem_flow, cupy; print('quantem_flow', quantem_flow.__file__, 'cupy', cupy.__version__)"
echo "== nvcc compile of every raw kernel"
python3 -m pytest -q -p no:cacheprovider tests/test_cuda_sources.py 2>&1 | tail -3
echo "== CUDA conformance (every cuda case must PASS, none skip)"
python3 -m pytest -q -p no:cacheprovider -rs tests/test_runtime_conformance.py -k cuda \
  2>&1 | tee "$OUT/conformance.txt" | tail -15
echo "== timings"
timeout 400 python3 benchmarks/bench_gpu.py --json "$OUT/bench_gpu.json" 2>&1 | tee "$OUT/bench_gpu.txt"
