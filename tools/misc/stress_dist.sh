#!/usr/bin/env bash
# Stress test for clean exits of distributed runs (not part of CI): N times, train the
# tiny RetinaNet on the toy data with tools/dist_train.sh on 2 processes (gloo, CPU),
# then print how many runs exited 0 with both ranks done. Logs of failed runs are kept.
#   bash tools/misc/stress_dist.sh 20
set -uo pipefail
N=${1:-20}
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
OUT="${STRESS_DIR:-$ROOT/work_dirs/stress_dist}"
mkdir -p "$OUT"
if [ ! -f "$OUT/data/toy_coco/annotations/instances_val2017.json" ]; then
  "$PY" "$ROOT/tools/dataset_converters/make_toy_data.py" coco --out "$OUT/data" \
    --num-train 24 --num-val 8 >/dev/null || exit 1
fi
passed=0
for i in $(seq 1 "$N"); do
  log="$OUT/run_$i.log"
  (cd "$OUT" && PYTHON="$PY" PORT=$((29600 + i % 50)) bash "$ROOT/tools/dist_train.sh" \
     "$ROOT/tests/fixtures/configs/retinanet_r18_tiny_toy.py" 2 --work-dir "$OUT/work_$i" \
     --cfg-options train_cfg.max_iters=2 train_cfg.val_interval=2) > "$log" 2>&1
  rc=$?
  if [ "$rc" -eq 0 ] && [ -f "$OUT/work_$i/iter_2.pth" ]; then
    passed=$((passed + 1)); rm -rf "$log" "$OUT/work_$i"
    echo "run $i: ok"
  else
    echo "run $i: FAILED (exit $rc), log: $log"
  fi
done
echo "stress_dist: $passed of $N runs exited cleanly"
[ "$passed" -eq "$N" ]
