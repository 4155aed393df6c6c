#!/usr/bin/env bash
# The GPU checks of mmcirc in one short run (torch + timm only, no OpenMMLab needed):
#   1. tests/ops/test_cuda.py: the operators on CUDA against the float64 dense
#      references, gradients, bf16 autocast;
#   2. tools/analysis/benchmark_attention.py on CUDA, float32 and bf16 autocast;
#   3. tools/deployment/benchmark_gpu.py --modes eager: DeiT-T against mmcirc's CA-DeiT-T,
#      batch 1, float32 and bf16 (the eager, batch-1 part of that script; its compile and
#      batch-32 cells take a run of their own).
# Usage: bash tools/analysis/cuda_checks.sh [OUT_DIR]   (default work_dirs/cuda_checks)
# Writes each step's log, JSON and tables under OUT_DIR and, after every step, packs
# them into $TAR_TO (default OUT_DIR/cuda_checks.tar.gz), so a run stopped early still
# leaves what it measured. A failing step is reported and the next one still runs;
# the exit status is the number of failed steps.
set -u
cd "$(dirname "$0")/../.."
OUT=${1:-work_dirs/cuda_checks}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
TAR_TO=${TAR_TO:-$OUT/cuda_checks.tar.gz}
pack() { tar -czf "$TAR_TO.tmp" -C "$OUT" --exclude '*.tar.gz*' . && mv "$TAR_TO.tmp" "$TAR_TO"; }
export PYTHONUNBUFFERED=1
failed=0
step() {  # step NAME TIMEOUT_S CMD...
    local name=$1 limit=$2
    shift 2
    echo "=== $name ($(date +%T))"
    if timeout "$limit" "$@" 2>&1 | tee "$OUT/$name.log"; [ "${PIPESTATUS[0]}" -ne 0 ]; then
        echo "=== $name FAILED"
        failed=$((failed + 1))
    fi
    pack
}

"$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name())" \
    | tee "$OUT/device.txt"
step test_cuda 90 "$PY" -m pytest tests/ops/test_cuda.py -q -p no:cacheprovider
for amp in fp32 bf16; do
    flag=(); [ "$amp" = bf16 ] && flag=(--amp bf16)
    step "attention_$amp" 130 "$PY" tools/analysis/benchmark_attention.py --device cuda \
        --sizes 64 128 256 512 --repeat 20 --max-seconds 3 "${flag[@]}" \
        --out-dir "$OUT/attention_$amp"
done
step cadeit 200 "$PY" tools/deployment/benchmark_gpu.py --device cuda --modes eager \
    --batches 1 --precisions fp32 bf16 --sizes 224 512 1024 1536 2048 3072 4096 \
    --budget-s 170 --out-dir "$OUT/cadeit"
echo "=== done: $failed failed step(s); $TAR_TO"
exit "$failed"
