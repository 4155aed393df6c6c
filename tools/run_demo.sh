#!/usr/bin/env bash
# The README's main job: train CA-PVT-T RetinaNet on the generated shapes data with the
# same tools/train.py users run on COCO, evaluate COCO mAP with tools/test.py and paint
# detections on validation images; then the same for CA-PVT-T Semantic FPN on the
# generated ADE20K-format data (mIoU). Installs what is missing first.
#   bash tools/run_demo.sh            # both jobs
#   bash tools/run_demo.sh det        # detection only (seg: segmentation only)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash tools/setup_env.sh
PY=.venv/bin/python
JOBS="${1:-all}"

if [ ! -f data/toy_coco/annotations/instances_val2017.json ] || [ ! -d data/toy_ade ]; then
  echo "[demo] generating the toy datasets into data/"
  $PY tools/dataset_converters/make_toy_data.py coco ade
fi

if [ "$JOBS" = all ] || [ "$JOBS" = det ]; then
  CFG=configs/toy/ca_pvt_t_retinanet_toy.py
  WORK=work_dirs/demo_det
  echo "[demo] training $CFG (progress every 20 iterations) -> $WORK"
  $PY tools/train.py "$CFG" --work-dir "$WORK"
  CKPT="$WORK/$(cat "$WORK/last_checkpoint" | xargs basename)"
  echo "[demo] evaluating $CKPT (COCO bbox mAP); painted detections -> $WORK/test/*/vis"
  $PY tools/test.py "$CFG" "$CKPT" --work-dir "$WORK/test" --show-dir vis
fi

if [ "$JOBS" = all ] || [ "$JOBS" = seg ]; then
  CFG=configs/toy/ca_pvt_t_fpn_toy_ade.py
  WORK=work_dirs/demo_seg
  echo "[demo] training $CFG -> $WORK"
  $PY tools/train.py "$CFG" --work-dir "$WORK"
  CKPT="$WORK/$(cat "$WORK/last_checkpoint" | xargs basename)"
  echo "[demo] evaluating $CKPT (mIoU); painted predictions -> $WORK/test/vis"
  $PY tools/test.py "$CFG" "$CKPT" --work-dir "$WORK/test" --show-dir "$WORK/test/vis"
fi
echo "[demo] done: metrics in work_dirs/demo_*/test/*/*.json"
