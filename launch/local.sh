#!/usr/bin/env bash
# One host: run `xlgen train` (or any xlgen subcommand) with this repo's virtualenv.
#
#   launch/local.sh train --config=configs/pretrain/txl_tiny.py --workdir=workdirs/txl_tiny
#   launch/local.sh eval  --config=configs/pretrain/txl_tiny.py --workdir=workdirs/txl_tiny
#
# Environment: XLGEN_DEVICES=N simulates N CPU devices (XLA host platform) for trying sharded meshes on a laptop;
# JAX_PLATFORMS=cpu|tpu|gpu overrides the platform autodetection of `xlgen`.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${XLGEN_PYTHON:-$ROOT/.venv/bin/python}"
[[ -x "$PY" ]] || PY="$(command -v python3)"
if [[ -n "${XLGEN_DEVICES:-}" ]]; then
  export XLA_FLAGS="${XLA_FLAGS:-} --xla_force_host_platform_device_count=${XLGEN_DEVICES}"
fi
[[ $# -ge 1 ]] || { echo "usage: $0 train|eval|finetune|plan|prepare ARGS..." >&2; exit 2; }
exec "$PY" -m xlgen.cli "$@"
