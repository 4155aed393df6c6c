#!/usr/bin/env bash
# The one prepared run of mmcirc's GPU checks on the lent machine (one H200, torch 2.11 +
# CUDA 13.0, Python 3.12, nvcc 13.0, 16 cores; no OpenMMLab, nothing downloadable; at most
# 64 MiB carried; 10 min per command, ~15 min of device time in all). Cheapest and most
# important first; each step's log, JSON and tables are written as soon as it ends:
#   (a) tests/ops/test_cuda.py: the operators on CUDA against float64 dense references;
#   (b) CA-DeiT-T against DeiT-T (flash attention under bf16; fp32), batch 1 and 32, eager
#       and CUDA graphs (torch.compile mode=reduce-overhead): python -m mmcirc.benchmark model;
#   (e) (run after (b)) the Triton kernel of circulant attention's core against the FFT path
#       and SDPA (flash), one layer of 192 channels, batch 32, 14x14 / 32x32 / 64x64 maps,
#       forward and training, bf16, tl.dot in float32 (ieee) and tf32, time and error:
#       python -m mmcirc.benchmark layer;
#   (c) backbone forward of PVT-S, CA-PVT-S, all-circulant PVT-S, all-core PVT-S, Swin-T and
#       CA-Swin-T at 512-4096 px, fp32 and bf16, time and peak memory:
#       python -m mmcirc.benchmark model (needs the carried OpenMMLab wheels and mmcv);
#   (d) with mmcv's CUDA ops: tools/misc/check_mmcv_cuda.py, 20 iterations of the toy CA-PVT-T
#       RetinaNet on CUDA, tools/test.py on it (bbox mAP from the JSON), one training step of
#       CA-Swin-T Mask R-CNN, then the compiled training step: the toy RetinaNet and Semantic
#       FPN, 20 iterations eager against the backbone and neck compiled (tools/train.py
#       --compile), time per iteration, compile time, recompiles, graph breaks:
#       python -m mmcirc.benchmark compile_train.
# mmcv 2.1.0 is compiled there from its sdist (tools/mmcv_build.sh, as tools/setup_env.sh
# does) in the background while (a) and (b) run, on the cores (a)/(b) do not use (taskset):
# first with CPU ops only (~2 min; enough for (c)), then with CUDA ops for sm_90 (for (d)).
# If the CUDA build is not done when (d) is due, (d) says so (objects compiled / total); the
# build folder is kept, so a second call (--steps d) on the still-warm machine resumes it.
#
# Here, with PyPI (once; 28 MiB into the ignored work_dirs/wheels, 18 of them numpy 1.26):
#   bash tools/deployment/gpu_checks.sh --prepare
# There (the device call; carry work_dirs/wheels; $OUT comes back):
#   bash tools/deployment/gpu_checks.sh --out work_dirs/gpu_checks --pack $OUT/gpu_checks.tar.gz
# Rehearsal here, on the CPU, tiny sizes, the current environment's OpenMMLab, no build:
#   bash tools/deployment/gpu_checks.sh --device cpu --out /tmp/gpu_rehearsal
# Options: --steps a,b,c,d (a subset), --budget-s S (default 540: no step starts after it,
# each step's limit shrinks to what is left), --wheels DIR, PYTHON=python3; the steps'
# limits (s): LIMIT_A=90 LIMIT_B=170 LIMIT_C=150 LIMIT_E=150 (d: what is left, at least 150).
# Results: OUT/summary.md (one row per step: status, seconds, what), OUT/<step>.log, and the
# tools' results_*.json / table_*.md under OUT/<step>/. Exit status: failed steps.
set -u
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PY=${PYTHON:-python3}
DEVICE=cuda OUT_DIR=work_dirs/gpu_checks WHEELS="$ROOT/work_dirs/wheels" PACK="" STEPS=a,b,c,d,e
BUDGET=540 PREPARE=0 BUILD_ONLY=""
while [ $# -gt 0 ]; do
  case "$1" in
    --device) DEVICE=$2; shift 2 ;;
    --out) OUT_DIR=$2; shift 2 ;;
    --wheels) WHEELS=$2; shift 2 ;;
    --pack) PACK=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;;
    --budget-s) BUDGET=$2; shift 2 ;;
    --prepare) PREPARE=1; shift ;;
    --_build) BUILD_ONLY=$2; shift 2 ;;  # internal: the background mmcv builds (see below)
    -h | --help) sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "error: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
case "$DEVICE" in cuda | cpu) ;; *) echo "error: --device must be cuda or cpu, got $DEVICE" >&2; exit 2 ;; esac
[[ "$STEPS" =~ ^[a-e](,[a-e])*$ ]] || { echo "error: --steps takes letters a-e joined by commas, got $STEPS" >&2; exit 2; }
[[ "$BUDGET" =~ ^[0-9]+$ ]] || { echo "error: --budget-s must be whole seconds, got $BUDGET" >&2; exit 2; }
say() { printf '[gpu_checks] %s\n' "$*"; }
fail() { printf 'error: %s (try: %s)\n' "$1" "$2" >&2; exit 1; }
# shellcheck source=../mmcv_build.sh
. "$ROOT/tools/mmcv_build.sh"

# --- here: the wheels to carry (Python 3.12, manylinux x86_64), versions as in .venv -------
if [ "$PREPARE" = 1 ]; then
  VPY="$ROOT/.venv/bin/python"
  ver() { "$VPY" -c "import importlib.metadata as m; print(m.version('$1'))"; }
  pip_quiet() {  # minus the warnings this machine's pip.conf prints for absent local indexes
    "$VPY" -m pip --disable-pip-version-check "$@" 2> >(grep -v 'is ignored: it is neither a file nor a directory' >&2)
  }
  mkdir -p "$WHEELS"
  # what mmengine / mmdet / mmseg import that the machine's image lacks (its package list:
  # the device tool's list of kinds); setuptools<82 for pkg_resources (mmcv's setup.py, mmengine)
  names=(mmengine mmdet mmsegmentation addict yapf platformdirs termcolor terminaltables
    pycocotools shapely ftfy wcwidth prettytable)
  specs=()
  for n in "${names[@]}"; do specs+=("$n==$(ver "$n")"); done
  specs+=("setuptools==$(ver setuptools)")
  pip_quiet download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d "$WHEELS" "${specs[@]}" || fail "pip download" "check PyPI"
  # numpy 1.26 for Python 3.12, installed there only if the stack fails with the image's 2.x
  pip_quiet download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$WHEELS/numpy1" "numpy==$(ver numpy)" || fail "pip download numpy" "check PyPI"
  sdist="$(ls "${MMCIRC_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/mmcirc}"/src/mmcv-2.1.0.tar.gz 2>/dev/null)"
  if [ -n "$sdist" ]; then cp "$sdist" "$WHEELS/"; else
    pip_quiet download -q --no-deps --no-binary :all: --no-build-isolation mmcv==2.1.0 -d "$WHEELS" \
      || fail "pip download mmcv==2.1.0 (sdist)" "check PyPI"
  fi
  say "carry $WHEELS: $(du -sh "$WHEELS" | cut -f1) ($(ls "$WHEELS" | wc -l) files)"
  exit 0
fi

# --- there, in the background: mmcv with CPU ops (enough for (c)), then with CUDA ops -------
if [ -n "$BUILD_ONLY" ]; then
  NPROC=$(nproc)
  cores="4-$((NPROC - 1))" && export MAX_JOBS=$((NPROC - 4))
  [ "$NPROC" -ge 8 ] || { cores="0-$((NPROC - 1))" && export MAX_JOBS=$NPROC; }
  taskset -cp "$cores" $$ > /dev/null  # the timed steps run on cores 0-3
  export PYTHONPATH="$BUILD_ONLY/site" TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}
  inc="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')"
  [ -f "$inc/Python.h" ] || fail "no Python.h in $inc: C extensions cannot be built" "carry the python3-dev headers"
  for kind in cpu cuda; do
    cuda=0 && [ $kind = cuda ] && cuda=1
    [ -f "$BUILD_ONLY/build/$kind.done" ] && continue
    say "building mmcv ($kind ops, $MAX_JOBS jobs on cores $cores) from $(date -u +%T)"
    if [ $cuda = 1 ]; then
      CUDA_HOME="$(mmcv_find_cuda_home)"
      mmcv_check_nvcc "$PY" "$CUDA_HOME" "$(mmcv_torch_cuda "$PY")"
      export CUDA_HOME
    fi
    mmcv_patch_sources "$PY" "$WHEELS/mmcv-2.1.0.tar.gz" "$BUILD_ONLY/build/$kind/src" $cuda
    mmcv_build_wheel "$PY" $cuda "$BUILD_ONLY/build/$kind/src" "$BUILD_ONLY/build/$kind/out" || exit 1
    touch "$BUILD_ONLY/build/$kind.done"
    say "built $(ls "$BUILD_ONLY/build/$kind"/out/mmcv-*.whl) at $(date -u +%T)"
  done
  exit 0
fi

mkdir -p "$OUT_DIR"
OUT_DIR="$(cd "$OUT_DIR" && pwd)"
# absolute (steps run in other folders), without resolving a venv's python symlink
case "$PY" in */*) PY="$(cd "$(dirname "$PY")" && pwd)/$(basename "$PY")" ;; *) PY="$(command -v "$PY")" ;; esac
[ -x "$PY" ] || fail "no python at ${PYTHON:-python3}" "PYTHON=/path/to/python3"
export PYTHONUNBUFFERED=1 PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
T0=$SECONDS
failed=0
SUMMARY="$OUT_DIR/summary.md"
printf '# gpu_checks %s (--device %s, --steps %s)\n\n| step | status | s | what |\n| --- | --- | --- | --- |\n' \
  "$(date -u +%FT%TZ)" "$DEVICE" "$STEPS" > "$SUMMARY"
pack() {
  [ -n "$PACK" ] || return 0
  # not the installed wheels, the build folders, checkpoints or toy images: $OUT takes 16 MiB a file
  tar -czf "$PACK.tmp" -C "$OUT_DIR" --exclude ./site --exclude ./build --exclude '*.pth' \
    --exclude data . && mv "$PACK.tmp" "$PACK"
  cp "$SUMMARY" "$(dirname "$PACK")/summary.md"
}
row() { printf '| %s | %s | %s | %s |\n' "$1" "$2" "$3" "$4" >> "$SUMMARY"; pack; }
left() { echo $((BUDGET - (SECONDS - T0))); }
want() { [[ ",$STEPS," == *",$1,"* ]]; }
# step NAME LIMIT_S WHAT CMD...: runs CMD (its output in OUT/NAME.log), one summary row
step() {
  local name=$1 limit=$2 what=$3 t=$SECONDS rc
  shift 3
  [ "$limit" -gt "$(left)" ] && limit=$(left)
  if [ "$limit" -le 5 ]; then
    row "$name" "NOT RUN: budget spent" 0 "$what"; failed=$((failed + 1)); return 1
  fi
  say "$name ($what), limit ${limit}s"
  timeout "$limit" "$@" > "$OUT_DIR/$name.log" 2>&1
  rc=$?
  tail -n 25 "$OUT_DIR/$name.log"
  if [ $rc -eq 0 ]; then
    row "$name" ok $((SECONDS - t)) "$what; last line: $(grep -v '^\s*$' "$OUT_DIR/$name.log" | tail -n1 | tr '|' '/' | cut -c1-120)"
    return 0
  fi
  [ $rc -eq 124 ] && rc="timeout after ${limit}s" || rc="failed (exit $rc)"
  row "$name" "$rc: $(grep -m1 -E '^(error|[A-Za-z.]*Error):' "$OUT_DIR/$name.log" | tr '|' '/' | cut -c1-200)" \
    $((SECONDS - t)) "$what"
  failed=$((failed + 1))
  return 1
}

BENCH=()  # the timed steps run on cores 0-3 on the GPU machine; the mmcv compile on the rest
[ "$DEVICE" = cuda ] && [ "$(nproc)" -ge 8 ] && BENCH=(taskset -c 0-3)
"${BENCH[@]}" "$PY" -c "
import os, platform, torch
print('python', platform.python_version(), 'torch', torch.__version__, 'cuda', torch.version.cuda,
      'device', torch.cuda.get_device_name() if torch.cuda.is_available() else 'cpu',
      'cores', os.cpu_count())" > "$OUT_DIR/env.txt" 2>&1
[ "$DEVICE" = cuda ] && { nvidia-smi -L; nvcc --version | tail -n 2; } >> "$OUT_DIR/env.txt" 2>&1
cat "$OUT_DIR/env.txt"

# --- mmcv: the carried wheels into SITE, then the builds in the background -----------------
SITE="$OUT_DIR/site"
BUILD_DIR="$OUT_DIR/build"
mmcv_objects() {  # compiled / total objects of the KIND (cpu|cuda) build
  local src="$BUILD_DIR/$1/src" n t
  n=$(find "$src" -name '*.o' 2>/dev/null | wc -l)
  t=$(cat "$src"/build/temp*/build.ninja 2>/dev/null | grep -c '^build .*\.o:')
  echo "$n/${t:-?}"
}
if [ "$DEVICE" = cuda ] && ! ls "$WHEELS"/mmcv-2.1.0.tar.gz > /dev/null 2>&1; then
  want c || want d \
    && fail "no $WHEELS/mmcv-2.1.0.tar.gz" "bash tools/deployment/gpu_checks.sh --prepare here, then carry work_dirs/wheels"
  row wheels "none carried" 0 "(a) and (b) need torch and timm only"
elif [ "$DEVICE" = cuda ]; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$SITE" "$WHEELS"/*.whl > "$OUT_DIR/install.log" 2>&1 \
    || fail "installing the carried wheels (see $OUT_DIR/install.log)" "rerun --prepare"
  export PYTHONPATH="$ROOT:$SITE${PYTHONPATH#"$ROOT"}"
  # the image's numpy is 2.x; if the OpenMMLab stack does not import with it, the carried
  # numpy 1.26 (--prepare puts it in WHEELS/numpy1) goes first on the path, also for the build
  probe=(-c "import mmengine.runner, mmcv, mmdet, mmseg, pycocotools.coco, shapely.geometry")
  if ! "$PY" "${probe[@]}" > "$OUT_DIR/probe.log" 2>&1; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$SITE" \
      "$WHEELS"/numpy1/numpy-*.whl >> "$OUT_DIR/install.log" 2>&1
    "$PY" "${probe[@]}" >> "$OUT_DIR/probe.log" 2>&1 \
      || fail "the carried OpenMMLab wheels do not import ($(tail -n1 "$OUT_DIR/probe.log"))" "see $OUT_DIR/probe.log"
  fi
  echo "OpenMMLab wheels import with numpy $("$PY" -c 'import numpy; print(numpy.__version__)')" >> "$OUT_DIR/env.txt"
  # in a session of its own (setsid): it outlives this command, so a second call resumes
  setsid bash "$0" --_build "$OUT_DIR" --wheels "$WHEELS" > "$OUT_DIR/build_mmcv.log" 2>&1 < /dev/null &
elif [ "$DEVICE" = cpu ]; then
  row build_mmcv "not rehearsed" 0 "uses this environment's mmcv $("$PY" -c 'import mmcv; from mmcv.ops import get_compiling_cuda_version as v; print(mmcv.__version__, "(CUDA ops:", v() + ")")' 2>&1 | tail -n1)"
fi
# wait_mmcv KIND SECONDS: install the KIND (cpu|cuda) wheel once built; 1 if not in time
wait_mmcv() {
  local end=$((SECONDS + $2))
  while [ ! -f "$BUILD_DIR/$1.done" ] && [ $SECONDS -lt $end ]; do sleep 5; done
  [ -f "$BUILD_DIR/$1.done" ] || return 1
  "$PY" -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$SITE" \
    "$BUILD_DIR/$1"/out/mmcv-*.whl >> "$OUT_DIR/install.log" 2>&1
}

# --- (a) --------------------------------------------------------------------------------
if want a; then
  step a_test_cuda "${LIMIT_A:-90}" "tests/ops/test_cuda.py on $DEVICE" \
    "${BENCH[@]}" "$PY" -m pytest "$ROOT/tests/ops/test_cuda.py" -q -p no:cacheprovider -rs
fi

# --- (b) --------------------------------------------------------------------------------
if want b; then
  if [ "$DEVICE" = cuda ]; then
    B=(--sizes 224 512 1024 1536 2048 3072 4096 --batches 1 32 --warmup 3 --repeat 10
      --total-budget $((${LIMIT_B:-170} - 30)))
  else  # one batch, one call before the timed one: the grid's code paths, not a timing
    B=(--sizes 32 --batches 1 --depth 1 --warmup 1 --repeat 1 --compile-backend eager
      --total-budget 30)
  fi
  step b_cadeit "${LIMIT_B:-170}" "CA-DeiT-T vs DeiT-T, bf16 (flash) + fp32, eager + CUDA graphs" \
    "${BENCH[@]}" "$PY" -m mmcirc.benchmark model --device "$DEVICE" --in-process \
    --models deit_t ca_deit_t --precisions bf16 fp32 --modes eager compile \
    --compile-mode reduce-overhead --compile-max-size 2048 "${B[@]}" --out-dir "$OUT_DIR/b_cadeit"
fi

# --- (e) --------------------------------------------------------------------------------
if want e; then
  if [ "$DEVICE" = cuda ]; then
    E=(--sizes 14 32 64 --batch 32 --dim 192 --warmup 3 --repeat 10)
  else  # the kernel in Triton's interpreter: the code paths at a tiny size
    E=(--sizes 4 --batch 1 --dim 8 --warmup 1 --repeat 1)
  fi
  step e_kernel "${LIMIT_E:-150}" "Triton core vs FFT path vs SDPA (flash), bf16, tl.dot ieee + tf32" \
    "${BENCH[@]}" "$PY" -m mmcirc.benchmark layer --device "$DEVICE" --in-process \
    --methods sdpa fft kernel-ieee kernel-tf32 --precision bf16 --errors \
    "${E[@]}" --out-dir "$OUT_DIR/e_kernel"
fi

# --- (c) --------------------------------------------------------------------------------
if want c; then
  mmcv_note="the installed mmcv"
  if [ "$DEVICE" = cuda ]; then
    # the CUDA build when it is already done, else the CPU-ops one (enough for backbones)
    if wait_mmcv cuda 0; then mmcv_note="mmcv with CUDA ops"
    elif wait_mmcv cpu "$(($(left) / 3))"; then mmcv_note="CPU-ops mmcv (CUDA build at $(mmcv_objects cuda) objects)"
    else mmcv_note="no mmcv: neither build finished ($(mmcv_objects cpu) CPU objects)"; fi
    PRECS=(fp32 bf16)
    C=(--sizes 512 1024 2048 4096 --models pvt_s ca_pvt_s circ_pvt_s core_pvt_s swin_t ca_swin_t
      --timeout 60 --budget 1)
  else
    PRECS=(bf16)  # alone: the CPU suite runs fp32 (the default) all the time
    # one call, in the memory child: a first call slower than --single-run-above is the
    # measurement, so no timing child follows
    C=(--sizes 64 --models ca_swin_t --timeout 120 --single-run-above 0.001)
  fi
  step c_backbones "${LIMIT_C:-150}" "backbone forward, ${PRECS[*]}, with $mmcv_note" \
    "${BENCH[@]}" "$PY" -m mmcirc.benchmark model --device "$DEVICE" \
    --precisions "${PRECS[@]}" "${C[@]}" --out-dir "$OUT_DIR/c_backbones"
fi

# --- (d) --------------------------------------------------------------------------------
if want d; then
  D="$OUT_DIR/d_detectors"
  mkdir -p "$D"
  ITERS=20 SCALE="(512, 384)" NTRAIN=32 NVAL=16 LOADERS=()
  if [ "$DEVICE" = cpu ]; then  # no loader worker processes: they cost more than 2 steps here
    ITERS=2 SCALE="(64, 48)" NTRAIN=8 NVAL=4
    LOADERS=(train_dataloader.num_workers=0 train_dataloader.persistent_workers=False
      val_dataloader.num_workers=0 val_dataloader.persistent_workers=False
      test_dataloader.num_workers=0 test_dataloader.persistent_workers=False)
  fi
  ready=1
  if [ "$DEVICE" = cuda ] && ! wait_mmcv cuda "$(($(left) - 150))"; then
    ready=0
    row d_detectors "NOT RUN: mmcv CUDA build unfinished ($(mmcv_objects cuda) objects; build_mmcv.log); rerun --steps d on the warm machine" 0 "toy RetinaNet, test, Mask R-CNN step"
    failed=$((failed + 1))
  fi
  if [ $ready = 1 ]; then
    [ "$DEVICE" = cuda ] && step d0_mmcv_ops 60 "mmcv nms / roi_align / sigmoid_focal_loss, CUDA vs CPU" \
      "$PY" "$ROOT/tools/misc/check_mmcv_cuda.py"
    "$PY" "$ROOT/tools/dataset_converters/make_toy_data.py" coco --out "$D/data" \
      --num-train $NTRAIN --num-val $NVAL > "$D/make_toy_data.log" 2>&1
    # mmengine's deterministic=True (the toy config's) needs cuBLAS's fixed workspace on CUDA
    export CUBLAS_WORKSPACE_CONFIG=:4096:8
    cd "$D"  # the toy configs read data/toy_coco from the working directory
    TRAIN=("$PY" "$ROOT/tools/train.py" "$ROOT/configs/toy/ca_pvt_t_retinanet_toy.py"
      --work-dir "$D/retinanet" --cfg-options "train_cfg.max_iters=$ITERS"
      "train_cfg.val_interval=$ITERS" "default_hooks.checkpoint.interval=$ITERS" "${LOADERS[@]}")
    if ! step d1_retinanet_train 150 "toy CA-PVT-T RetinaNet, $ITERS iterations on $DEVICE" "${TRAIN[@]}" \
      && grep -q -i 'deterministic' "$OUT_DIR/d1_retinanet_train.log"; then
      # the toy config's randomness.deterministic=True refused a CUDA op (the row above says
      # which): the same run without it, so that the mmcv kernels are still exercised
      step d1b_retinanet_train_nondeterministic 150 "the same with randomness.deterministic=False" \
        "${TRAIN[@]}" randomness.deterministic=False
    fi
    step d2_retinanet_test 90 "tools/test.py on the toy RetinaNet (bbox mAP)" \
      "$PY" "$ROOT/tools/test.py" "$ROOT/configs/toy/ca_pvt_t_retinanet_toy.py" \
      "$D/retinanet/iter_$ITERS.pth" --work-dir "$D/retinanet_test" \
      --cfg-options model.test_cfg.score_thr=0.0 "${LOADERS[@]}"  # no box clears 0.05 yet
    cat > "$D/ca_swin_t_mask-rcnn_toy.py" << EOF
# configs/ca_swin_t_mask-rcnn_1x_coco.py (full CA-Swin-T) on the toy shapes, one step
_base_ = '$ROOT/configs/ca_swin_t_mask-rcnn_1x_coco.py'
data_root = 'data/toy_coco/'
metainfo = dict(classes=('circle', 'square', 'triangle'))
model = dict(
    backbone=dict(init_cfg=None),
    roi_head=dict(bbox_head=dict(num_classes=3), mask_head=dict(num_classes=3)),
)
pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='Resize', scale=$SCALE, keep_ratio=True),
    dict(type='PackDetInputs'),
]
train_dataloader = dict(batch_size=2, num_workers=0, persistent_workers=False,
    dataset=dict(data_root=data_root, metainfo=metainfo, pipeline=pipeline))
train_cfg = dict(_delete_=True, type='IterBasedTrainLoop', max_iters=1, val_interval=100)
val_dataloader = None
val_cfg = None
val_evaluator = None
test_dataloader = None
test_cfg = None
test_evaluator = None
param_scheduler = []
default_hooks = dict(checkpoint=dict(by_epoch=False, interval=100), logger=dict(interval=1))
log_processor = dict(by_epoch=False)
EOF
    step d3_mask_rcnn_step 120 "one training step of CA-Swin-T Mask R-CNN on $DEVICE" \
      "$PY" "$ROOT/tools/train.py" "$D/ca_swin_t_mask-rcnn_toy.py" --work-dir "$D/mask_rcnn"
    # the compiled training step (--compile: backbone and neck, the heads eager) against eager;
    # its toy data: data/toy_coco above, toy_ade made by the tool
    CT=(--jobs det seg --iters $ITERS --warmup 2) CT_WHAT="RetinaNet + Semantic FPN"
    [ "$DEVICE" = cpu ] && CT=(--jobs det --iters $ITERS --warmup 1 --backend eager) CT_WHAT=RetinaNet
    step d4_compile_train 240 "toy $CT_WHAT, $ITERS iterations, eager vs compiled backbone and neck" \
      "$PY" -m mmcirc.benchmark compile_train "${CT[@]}" --data-root "$D" \
      --out "$D/compile_train/results.json"
    cd "$ROOT"
    # what the JSON files say: the mAP, the losses, and that CUDA memory was logged (on CUDA)
    "$PY" - "$D" >> "$SUMMARY" << 'EOF'
import glob, json, os.path as osp, sys
d = sys.argv[1]
def rows(pattern):
    out = []
    for path in sorted(glob.glob(osp.join(d, pattern))):
        out += [json.loads(line) for line in open(path) if line.strip()]
    return out
train = [r for r in rows('retinanet/*/vis_data/scalars.json') if 'loss' in r]
test = [r for r in rows('retinanet_test/*/*.json') if 'coco/bbox_mAP' in r]
mask = [r for r in rows('mask_rcnn/*/vis_data/scalars.json') if 'loss' in r]
print()
if train:
    print(f'- toy RetinaNet: {len(train)} logged iterations, loss {train[0]["loss"]:.3f} -> '
          f'{train[-1]["loss"]:.3f}, GPU memory logged: {"memory" in train[-1]}')
if test:
    print(f'- toy RetinaNet test: coco/bbox_mAP = {test[-1]["coco/bbox_mAP"]}')
if mask:
    print(f'- CA-Swin-T Mask R-CNN step: loss {mask[-1]["loss"]:.3f} '
          f'(mask loss {mask[-1].get("loss_mask", float("nan")):.3f}), GPU memory logged: '
          f'{"memory" in mask[-1]}')
EOF
    pack
  fi
fi
say "done in $((SECONDS - T0)) s: $failed failed step(s); $SUMMARY"
exit "$failed"
