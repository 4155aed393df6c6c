#!/usr/bin/env bash
# Distributed testing with torchrun: tools/dist_test.sh CONFIG CHECKPOINT NPROC [test.py args]
#   Several nodes: the same command on each, with NNODES, NODE_RANK (0 .. NNODES-1),
#   MASTER_ADDR (node 0's address) and PORT (a free port there) set alike.
# A process exits when its node's torchrun agent dies (util-linux's setpriv).
CONFIG=$1
CHECKPOINT=$2
NPROC=$3
NNODES=${NNODES:-1}
NODE_RANK=${NODE_RANK:-0}
PORT=${PORT:-29500}
MASTER_ADDR=${MASTER_ADDR:-"127.0.0.1"}
DIR="$(cd "$(dirname "$0")" && pwd)"
LAUNCH=(--no-python)  # each process under setpriv where util-linux has it, then Python
if setpriv --pdeathsig KILL true 2>/dev/null; then LAUNCH+=(setpriv --pdeathsig KILL --); fi
PYTHONPATH="$DIR/..":${PYTHONPATH:-} \
exec "${PYTHON:-python}" -m torch.distributed.run \
    --nnodes="$NNODES" --node-rank="$NODE_RANK" --master-addr="$MASTER_ADDR" \
    --nproc-per-node="$NPROC" --master-port="$PORT" \
    "${LAUNCH[@]}" "${PYTHON:-python}" -u "$DIR/test.py" "$CONFIG" "$CHECKPOINT" --launcher pytorch "${@:4}"
