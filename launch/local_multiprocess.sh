#!/usr/bin/env bash
# N JAX processes on the local host, joined by jax.distributed over localhost with CPU (gloo) collectives: the same
# code path as a multi-host TPU pod, on one box. Each process gets DEVICES_PER_PROCESS simulated CPU devices.
#
#   launch/local_multiprocess.sh 2 train --config=configs/pretrain/txl_tiny.py \
#       --config.mesh.data=2 --config.mesh.fsdp=2 --config.mesh.tensor=2 --workdir=workdirs/mp
#
# Environment: DEVICES_PER_PROCESS (default 4), XLGEN_PORT (coordinator port; default a free one), XLGEN_LOG_DIR
# (per-process logs process_<i>.log; default a new temp dir, printed), XLGEN_XLA_FLAGS (extra XLA flags).
# Process 0 alone writes metrics.jsonl / tensorboard; every process writes its shards of each checkpoint.
# Process 0's log is printed at the end. Exit status: the first non-zero status of any process.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${XLGEN_PYTHON:-$ROOT/.venv/bin/python}"
[[ -x "$PY" ]] || PY="$(command -v python3)"
[[ $# -ge 2 ]] || { echo "usage: $0 NUM_PROCESSES train|eval ARGS..." >&2; exit 2; }
[[ "$2" != -* ]] || { echo "usage: $0 NUM_PROCESSES train|eval ARGS... (the xlgen command comes before its options: $0 $1 train $2 ...)" >&2; exit 2; }
N="$1"; shift
DPP="${DEVICES_PER_PROCESS:-4}"
PORT="${XLGEN_PORT:-$("$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')}"
LOG_DIR="${XLGEN_LOG_DIR:-$(mktemp -d -t xlgen-mp-XXXXXX)}"
mkdir -p "$LOG_DIR"

pids=()
cleanup() { for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done; }
trap cleanup INT TERM

for ((i = 0; i < N; i++)); do
  env XLGEN_COORDINATOR="127.0.0.1:$PORT" XLGEN_NUM_PROCESSES="$N" XLGEN_PROCESS_ID="$i" JAX_PLATFORMS=cpu \
      XLA_FLAGS="--xla_force_host_platform_device_count=$DPP ${XLGEN_XLA_FLAGS:-}" \
      "$PY" -m xlgen.cli "$@" --distributed=on >"$LOG_DIR/process_$i.log" 2>&1 &
  pids+=("$!")
done
echo "launched $N processes (coordinator 127.0.0.1:$PORT); logs: $LOG_DIR/process_*.log" >&2

status=0
for i in "${!pids[@]}"; do
  s=0; wait "${pids[$i]}" || s=$?
  if [[ $s -ne 0 ]]; then
    [[ $status -ne 0 ]] || status=$s
    echo "process $i exited with status $s (log: $LOG_DIR/process_$i.log)" >&2
    cleanup
  fi
done
cat "$LOG_DIR/process_0.log"
exit "$status"
