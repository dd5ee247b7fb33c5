#!/bin/bash
# The tensor engine's GPU checks (issue 15), as one prepared run for a machine with CUDA GPUs:
# every test that needs a GPU skips elsewhere and says why. With one GPU the one-GPU test runs;
# the NCCL collectives over 4 ranks and per-proc GPU tests need 2 and 4 GPUs; the CUDA random
# builtins, regency.random's CUDA state and the CUDA-event timer need one.
# Usage: scripts/gpu_check.sh   (after `make` has built .venv with a CUDA build of torch)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
"$PY" - <<'PYEOF'
import torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "gpus", torch.cuda.device_count())
PYEOF
nvidia-smi --query-gpu=name,memory.total --format=csv || true
exec "$PY" -m pytest -q -rs -p no:cacheprovider \
    tests/tensor/test_tensor_devices.py \
    tests/tensor/test_collectives.py \
    tests/tensor/test_tensor_random.py \
    tests/tensor/test_tensor_timer.py \
    -k "gpu or cuda or nccl" "$@"
