#!/usr/bin/env bash
# Train on a Slurm cluster: tools/slurm_train.sh PARTITION JOB_NAME CONFIG WORK_DIR [train.py args]
# GPUS (tasks in all), GPUS_PER_NODE, CPUS_PER_TASK and SRUN_ARGS come from the environment.
# GPUS_PER_NODE=0: a partition without GPUs; GPUS tasks, no --gres (gloo; Slurm places them).
set -x
PARTITION=$1
JOB_NAME=$2
CONFIG=$3
WORK_DIR=$4
GPUS=${GPUS:-8}
GPUS_PER_NODE=${GPUS_PER_NODE:-8}
CPUS_PER_TASK=${CPUS_PER_TASK:-5}
SRUN_ARGS=${SRUN_ARGS:-""}
PER_NODE=""
if [ "$GPUS_PER_NODE" != 0 ]; then
    PER_NODE="--gres=gpu:$GPUS_PER_NODE --ntasks-per-node=$GPUS_PER_NODE"
fi
DIR="$(cd "$(dirname "$0")" && pwd)"
PYTHONPATH="$DIR/..":${PYTHONPATH:-} \
srun -p "$PARTITION" --job-name="$JOB_NAME" $PER_NODE \
    --ntasks=$GPUS --cpus-per-task=$CPUS_PER_TASK \
    --kill-on-bad-exit=1 $SRUN_ARGS \
    "${PYTHON:-python}" -u "$DIR/train.py" "$CONFIG" --work-dir="$WORK_DIR" --launcher="slurm" "${@:5}"
