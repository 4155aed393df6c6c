#!/usr/bin/env bash
# The README's main job: train CA-PVT-T RetinaNet on the generated shapes data with the
# same tools/train.py users run on COCO, evaluate COCO mAP with tools/test.py and paint
# detections on validation images; then the same for CA-PVT-T Semantic FPN on the
# generated ADE20K-format data (mIoU).
#   bash tools/run_demo.sh            # both jobs
#   bash tools/run_demo.sh det        # detection only (seg: segmentation only)
# In a checkout it installs what is missing first (tools/setup_env.sh: .venv/) and runs in
# the repository root. From a wheel (mmcirc/.mim/tools/run_demo.sh, no setup_env.sh there)
# it runs with $PYTHON (default: python3, the one mmcirc is installed in) and writes data/
# and work_dirs/ in the current folder.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
JOBS="${1:-all}"
case "$JOBS" in
  all|det|seg) ;;
  *) echo "error: job must be all, det or seg, got '$JOBS'" >&2; exit 2 ;;
esac
if [ -f "$ROOT/tools/setup_env.sh" ]; then
  cd "$ROOT"
  bash tools/setup_env.sh
  PY=.venv/bin/python
else
  PY="${PYTHON:-python3}"
fi

if [ ! -f data/toy_coco/annotations/instances_val2017.json ] || [ ! -d data/toy_ade ]; then
  echo "[demo] generating the toy datasets into data/"
  "$PY" "$ROOT/tools/dataset_converters/make_toy_data.py" coco ade
fi

# train_then_test CONFIG WORK_DIR METRIC SHOW_DIR THREADS (mmdet reads --show-dir below
# the test run's timestamped folder, mmseg takes it as a path; THREADS: OMP_NUM_THREADS
# for both steps, empty for torch's default)
train_then_test() {
  local cfg=$1 work=$2 metric=$3 show=$4 threads=$5
  local env=()
  [ -n "$threads" ] && env=(env OMP_NUM_THREADS="$threads")
  echo "[demo] training $cfg -> $work${threads:+ ($threads thread(s))}"
  "${env[@]}" "$PY" "$ROOT/tools/train.py" "$ROOT/$cfg" --work-dir "$work"
  local ckpt="$work/$(xargs basename < "$work/last_checkpoint")"
  echo "[demo] evaluating $ckpt ($metric); painted predictions under $work/test"
  "${env[@]}" "$PY" "$ROOT/tools/test.py" "$ROOT/$cfg" "$ckpt" --work-dir "$work/test" --show-dir "$show"
}

if [ "$JOBS" = all ] || [ "$JOBS" = det ]; then
  train_then_test configs/toy/ca_pvt_t_retinanet_toy.py work_dirs/demo_det 'COCO bbox mAP' vis ''
fi
if [ "$JOBS" = all ] || [ "$JOBS" = seg ]; then
  # One thread: with two, the summation order of the multi-threaded CPU kernels varies
  # from run to run and so does the last digit of mIoU; with one the job repeats exactly.
  train_then_test configs/toy/ca_pvt_t_fpn_toy_ade.py work_dirs/demo_seg mIoU work_dirs/demo_seg/test/vis 1
fi
echo "[demo] done: metrics in work_dirs/demo_*/test/*/*.json"
