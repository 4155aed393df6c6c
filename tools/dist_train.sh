#!/usr/bin/env bash
# Distributed training with torchrun: tools/dist_train.sh CONFIG NPROC [train.py args]
#   NPROC processes on this node; on a machine without GPUs they talk over gloo.
#   Several nodes: the same command on each, with NNODES, NODE_RANK (0 .. NNODES-1),
#   MASTER_ADDR (node 0's address) and PORT (a free port there) set alike.
#   MAX_RESTARTS (default 0): torchrun restarts the processes of every node up to this many
#   times after one of them fails; add --resume so that they continue from the last
#   checkpoint of the work dir (and start from scratch when it holds none). Restarts
#   rendezvous through torchrun's c10d backend at MASTER_ADDR:PORT, which numbers the nodes
#   itself (NODE_RANK is not used), with a new store for every round.
# A process exits when its node's torchrun agent dies (util-linux's setpriv), so the other
# nodes fail instead of waiting for it.
CONFIG=$1
NPROC=$2
NNODES=${NNODES:-1}
NODE_RANK=${NODE_RANK:-0}
PORT=${PORT:-29500}
MASTER_ADDR=${MASTER_ADDR:-"127.0.0.1"}
MAX_RESTARTS=${MAX_RESTARTS:-0}
DIR="$(cd "$(dirname "$0")" && pwd)"
LAUNCH=(--no-python)  # each process under setpriv where util-linux has it, then Python
if setpriv --pdeathsig KILL true 2>/dev/null; then LAUNCH+=(setpriv --pdeathsig KILL --); fi
if [ "$MAX_RESTARTS" -gt 0 ]; then
    # static rendezvous keeps one store for all rounds: restarted processes would read the
    # previous round's addresses
    export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1
    RDZV=(--rdzv-backend=c10d --rdzv-endpoint="$MASTER_ADDR:$PORT" --rdzv-id="${RDZV_ID:-mmcirc}")
else
    RDZV=(--node-rank="$NODE_RANK" --master-addr="$MASTER_ADDR" --master-port="$PORT")
fi
PYTHONPATH="$DIR/..":${PYTHONPATH:-} \
exec "${PYTHON:-python}" -m torch.distributed.run \
    --nnodes="$NNODES" --nproc-per-node="$NPROC" --max-restarts="$MAX_RESTARTS" "${RDZV[@]}" \
    "${LAUNCH[@]}" "${PYTHON:-python}" -u "$DIR/train.py" "$CONFIG" --launcher pytorch "${@:3}"
