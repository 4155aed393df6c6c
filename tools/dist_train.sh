#!/usr/bin/env bash
# Distributed training with torchrun: tools/dist_train.sh CONFIG NPROC [train.py args]
# On a machine without GPUs the processes talk over gloo (tools/train.py sets it).
CONFIG=$1
NPROC=$2
NNODES=${NNODES:-1}
NODE_RANK=${NODE_RANK:-0}
PORT=${PORT:-29500}
MASTER_ADDR=${MASTER_ADDR:-"127.0.0.1"}
DIR="$(cd "$(dirname "$0")" && pwd)"
PYTHONPATH="$DIR/..":${PYTHONPATH:-} \
"${PYTHON:-python}" -m torch.distributed.run \
    --nnodes=$NNODES --node_rank=$NODE_RANK --master_addr=$MASTER_ADDR \
    --nproc_per_node=$NPROC --master_port=$PORT \
    "$DIR/train.py" "$CONFIG" --launcher pytorch "${@:3}"
