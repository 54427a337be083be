#!/usr/bin/env bash
# Launch `xlgen train` on a Cloud TPU VM (single host or pod), with the workdir on GCS.
#
#   launch/tpu_vm.sh --name=xlnet-large --zone=europe-west4-a --accelerator-type=v3-1024 \
#       --config=configs/pretrain/xlnet_large.py --workdir=gs://my-bucket/xlnet_large \
#       [--project=P] [--runtime-version=tpu-ubuntu2204-base] [--spot] [--plan] [--dry-run] \
#       [--gcsfuse=BUCKET[,BUCKET...]] [--max-restarts=N] [--watch[=SECONDS]] [--config.KEY=VALUE ...]
#
# Steps (each printed before it runs; --dry-run prints them and runs nothing):
#   1. reuse the TPU VM `--name` if it exists, otherwise request it as a queued resource and wait until ACTIVE;
#   2. pack this checkout (git ls-files, so your local edits are included) and copy it to every worker;
#   3. on every worker (`--worker=all`): create a venv and `pip install -e '.[tpu,gcs]'` with constraints.txt;
#   4. on every worker: start `xlgen train` in the background (logs in ~/xlgen-train.log). All workers run the same
#      command; the trainer calls `jax.distributed.initialize()`, which discovers the pod from the TPU metadata.
#      Re-running this script with the same --workdir resumes from the latest checkpoint (e.g. after preemption).
# --plan first runs `xlgen plan` locally for the pod's topology (needs the `tpu` extra) and stops if it does not fit.
# --gcsfuse mounts each bucket at /gcs/BUCKET on every worker (installs gcsfuse) so that code reading plain paths
#   (e.g. --config.data.source=/gcs/my-bucket/xlnet_data) sees GCS objects.
# --max-restarts=N runs `xlgen train --max_restarts=N` on every worker: a hung or crashed run restarts in place.
# --watch[=SECONDS] (default 300) stays in the foreground after step 4 and, every SECONDS, until summary.json in the
#   workdir reports total_steps: 5. reads the queued resource's state; PREEMPTED / SUSPENDED / FAILED (or gone):
#   deletes it, requests it again, waits until ACTIVE and repeats steps 2-4 (the run resumes from its latest
#   checkpoint); ACTIVE but no `xlgen train` on worker 0 (it ended or exhausted its restarts): repeats step 4.
#   With --dry-run one round of the watch is printed, recovery included.
set -euo pipefail

usage() { sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }

NAME="" ZONE="" PROJECT="" ACCEL="" RUNTIME="" CONFIG="" WORKDIR="" TOPOLOGY=""
SPOT=0 DRY_RUN=0 PLAN=0 GCSFUSE="" MAX_RESTARTS="" WATCH=0
OVERRIDES=()
for arg in "$@"; do
  case "$arg" in
    --name=*) NAME="${arg#*=}" ;;
    --zone=*) ZONE="${arg#*=}" ;;
    --project=*) PROJECT="${arg#*=}" ;;
    --accelerator-type=*) ACCEL="${arg#*=}" ;;
    --runtime-version=*) RUNTIME="${arg#*=}" ;;
    --topology=*) TOPOLOGY="${arg#*=}" ;;
    --config=*) CONFIG="${arg#*=}" ;;
    --workdir=*) WORKDIR="${arg#*=}" ;;
    --gcsfuse=*) GCSFUSE="${arg#*=}" ;;
    --max-restarts=*) MAX_RESTARTS="${arg#*=}" ;;
    --watch) WATCH=300 ;;
    --watch=*) WATCH="${arg#*=}" ;;
    --spot) SPOT=1 ;;
    --plan) PLAN=1 ;;
    --dry-run) DRY_RUN=1 ;;
    --config.*=*) OVERRIDES+=("$arg") ;;
    -h|--help) usage 0 ;;
    *) echo "tpu_vm.sh: unknown argument: $arg" >&2; usage 2 ;;
  esac
done

missing=()
for var in NAME ZONE ACCEL CONFIG WORKDIR; do [[ -n "${!var}" ]] || missing+=("$var"); done
if ((${#missing[@]})); then
  echo "tpu_vm.sh: missing required: ${missing[*]} (see --help)" >&2
  exit 2
fi
if [[ "$WORKDIR" != gs://* ]]; then
  echo "tpu_vm.sh: --workdir must be a gs:// path (every worker writes checkpoints there), got: $WORKDIR" >&2
  exit 2
fi
[[ -f "$CONFIG" ]] || { echo "tpu_vm.sh: config file not found: $CONFIG" >&2; exit 2; }
if [[ -n "$MAX_RESTARTS" && ! "$MAX_RESTARTS" =~ ^[0-9]+$ ]]; then
  echo "tpu_vm.sh: --max-restarts must be a number >= 0, got: $MAX_RESTARTS" >&2
  exit 2
fi
if [[ ! "$WATCH" =~ ^[0-9]+$ ]]; then
  echo "tpu_vm.sh: --watch takes a number of seconds, got: $WATCH" >&2
  exit 2
fi
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CONFIG_ABS="$(cd "$(dirname "$CONFIG")" && pwd)/$(basename "$CONFIG")"
if [[ "$CONFIG_ABS" != "$REPO_ROOT"/* ]]; then
  echo "tpu_vm.sh: --config must be inside this checkout ($REPO_ROOT) so it is copied to the workers: $CONFIG" >&2
  exit 2
fi
CONFIG="${CONFIG_ABS#"$REPO_ROOT"/}"  # relative: the same path on every worker
cd "$REPO_ROOT"
XLGEN_BIN=xlgen
[[ -x .venv/bin/xlgen ]] && XLGEN_BIN=.venv/bin/xlgen

# accelerator type (v3-32, v4-64, v5litepod-16, v5p-128, v6e-64) -> libtpu topology for `xlgen plan`
accelerator_topology() {
  local gen="${1%-*}" n="${1##*-}" chips dims a b c
  case "$gen" in
    v2|v3|v4|v5p) chips=$((n / 2)) ;;       # these count TensorCores (2 per chip)
    v5litepod|v5e|v6e) chips=$n ;;          # these count chips
    *) echo "unknown accelerator type $1" >&2; return 1 ;;
  esac
  case "$gen" in
    v4|v5p)  # 3D torus: a x b x c, a <= b <= c, powers of two, as square as possible
      a=1 b=1 c=1
      while ((a * b * c < chips)); do
        if ((c == b && b == a)); then c=$((c * 2)); elif ((b < c)); then b=$((b * 2)); else a=$((a * 2)); fi
      done
      if ((chips == 4)); then dims="2x2x1"; else dims="${a}x${b}x${c}"; fi ;;
    *)       # 2D: a x b, a <= b
      a=1 b=1
      while ((a * b < chips)); do if ((a < b)); then a=$((a * 2)); else b=$((b * 2)); fi; done
      dims="${a}x${b}" ;;
  esac
  [[ "$gen" == v5litepod ]] && gen=v5e
  echo "${gen}:${dims}"
}
[[ -n "$TOPOLOGY" ]] || TOPOLOGY="$(accelerator_topology "$ACCEL")"
if [[ -z "$RUNTIME" ]]; then
  case "$ACCEL" in
    v5litepod-*) RUNTIME="v2-alpha-tpuv5-lite" ;;
    v5p-*) RUNTIME="v2-alpha-tpuv5" ;;
    v6e-*) RUNTIME="v2-alpha-tpuv6e" ;;
    *) RUNTIME="tpu-ubuntu2204-base" ;;
  esac
fi

GCLOUD=(gcloud compute tpus)
LOC=(--zone="$ZONE")
[[ -n "$PROJECT" ]] && LOC+=(--project="$PROJECT")

run() {  # print a command (shell-quoted) and run it unless --dry-run
  printf '+'; printf ' %q' "$@"; printf '\n'
  if ((DRY_RUN == 0)); then "$@"; fi
}

REMOTE_DIR="xlgen"
TARBALL="${TMPDIR:-/tmp}/xlgen-${NAME}.tar.gz"
# --distributed=on: jax.distributed.initialize() finds the pod's workers from the TPU VM metadata
TRAIN=(xlgen train "--config=$CONFIG" "--workdir=$WORKDIR" --distributed=on "${OVERRIDES[@]}")
[[ -n "$MAX_RESTARTS" ]] && TRAIN+=("--max_restarts=$MAX_RESTARTS")
printf -v TRAIN_Q ' %q' "${TRAIN[@]}"

echo "# xlgen on TPU VM: name=$NAME zone=$ZONE accelerator=$ACCEL topology=$TOPOLOGY runtime=$RUNTIME"
echo "# workdir=$WORKDIR config=$CONFIG${OVERRIDES[*]:+ overrides: ${OVERRIDES[*]}}"

# 0. optional: will it fit? (compiles the real train step for the pod's topology on the host running this script)
PLAN_CMD=("$XLGEN_BIN" plan "--config=$CONFIG" "--topology=$TOPOLOGY" "${OVERRIDES[@]}")
if ((PLAN)) || ((DRY_RUN)); then
  echo "# plan: per-device HBM, FLOPs and step time for $TOPOLOGY"
  run "${PLAN_CMD[@]}"
fi

# 1. the TPU VM: request it as a queued resource and wait until it is ACTIVE
request_tpu() {
  echo "# requesting $ACCEL as queued resource $NAME"
  local qr=("${GCLOUD[@]}" queued-resources create "$NAME" --node-id="$NAME" "${LOC[@]}"
      --accelerator-type="$ACCEL" --runtime-version="$RUNTIME")
  ((SPOT)) && qr+=(--spot)
  run "${qr[@]}"
  echo "# waiting for queued resource $NAME to become ACTIVE"
  if ((DRY_RUN == 0)); then
    while true; do
      state="$("${GCLOUD[@]}" queued-resources describe "$NAME" "${LOC[@]}" --format='value(state.state)')"
      echo "#   state: $state"
      case "$state" in
        ACTIVE) break ;;
        FAILED|SUSPENDED) echo "tpu_vm.sh: queued resource $NAME is $state" >&2; exit 1 ;;
      esac
      sleep 30
    done
  fi
}

# 2. copy this checkout to every worker
copy_checkout() {
  echo "# packing $REPO_ROOT (tracked files + local edits) -> $TARBALL"
  if ((DRY_RUN == 0)); then
    (cd "$REPO_ROOT" && git ls-files -z --cached --others --exclude-standard | tar czf "$TARBALL" --null -T -)
  fi
  run "${GCLOUD[@]}" tpu-vm scp "$TARBALL" "$NAME:xlgen.tar.gz" --worker=all "${LOC[@]}"
}

# 3. install on every worker
install_workers() {
  local install="set -e; mkdir -p $REMOTE_DIR && tar xzf xlgen.tar.gz -C $REMOTE_DIR && cd $REMOTE_DIR \
&& (test -x .venv/bin/python || python3 -m venv .venv) \
&& .venv/bin/pip install -q -c constraints.txt -e '.[tpu,gcs]'"  # gcs extra: gcsfs, gs:// for etils.epath
  run "${GCLOUD[@]}" tpu-vm ssh "$NAME" --worker=all "${LOC[@]}" --command="$install"

  # 3b. optional: mount buckets with gcsfuse on every worker
  if [[ -n "$GCSFUSE" ]]; then
    local mount="set -e; if ! command -v gcsfuse >/dev/null; then \
echo \"deb https://packages.cloud.google.com/apt gcsfuse-\$(lsb_release -cs) main\" | sudo tee /etc/apt/sources.list.d/gcsfuse.list \
&& curl -fsSL https://packages.cloud.google.com/apt/doc/apt-key.gpg | sudo apt-key add - \
&& sudo apt-get update -q && sudo apt-get install -y -q gcsfuse; fi"
    for bucket in ${GCSFUSE//,/ }; do
      mount+="; sudo mkdir -p /gcs/$bucket && sudo chown \$USER /gcs/$bucket \
&& (mountpoint -q /gcs/$bucket || gcsfuse --implicit-dirs $bucket /gcs/$bucket)"
    done
    run "${GCLOUD[@]}" tpu-vm ssh "$NAME" --worker=all "${LOC[@]}" --command="$mount"
  fi
}

# 4. train on every worker (background; re-running resumes from the latest checkpoint in $WORKDIR)
START="cd $REMOTE_DIR && nohup .venv/bin/${TRAIN_Q# } > ~/xlgen-train.log 2>&1 < /dev/null &"
start_training() {
  run "${GCLOUD[@]}" tpu-vm ssh "$NAME" --worker=all "${LOC[@]}" --command="$START"
}

if ((DRY_RUN == 0)) && "${GCLOUD[@]}" tpu-vm describe "$NAME" "${LOC[@]}" --format='value(state)' >/dev/null 2>&1; then
  echo "# reusing existing TPU VM $NAME"
else
  request_tpu
fi
copy_checkout
install_workers
start_training

# 5. --watch: keep the run going through preemptions until summary.json reports total_steps
DONE_CHECK="import json, sys; s = json.load(sys.stdin); sys.exit(0 if s.get('steps') == s.get('total_steps') else 1)"
run_finished() {  # summary.json of the workdir says steps == total_steps
  run_query gcloud storage cat "$WORKDIR/summary.json" | python3 -c "$DONE_CHECK" 2>/dev/null
}
run_query() {  # like run (the command printed on stderr), its output is the result; dry-run: no output
  { printf '+'; printf ' %q' "$@"; printf '\n'; } >&2
  if ((DRY_RUN == 0)); then "$@" 2>/dev/null; fi
}
if ((WATCH)); then
  echo "# watching $NAME every ${WATCH}s until $WORKDIR/summary.json reports total_steps"
  while true; do
    if ((DRY_RUN == 0)); then sleep "$WATCH"; fi
    if ((DRY_RUN == 0)) && run_finished; then
      echo "# $WORKDIR finished: total_steps reached"
      break
    elif ((DRY_RUN)); then
      run_finished >/dev/null || true
    fi
    state="$(run_query "${GCLOUD[@]}" queued-resources describe "$NAME" "${LOC[@]}" --format='value(state.state)')"
    ((DRY_RUN)) && state=PREEMPTED  # the dry run shows the recovery
    case "$state" in
      ACTIVE)
        if ! run_query "${GCLOUD[@]}" tpu-vm ssh "$NAME" --worker=0 "${LOC[@]}" --command="pgrep -f 'xlgen train'" >/dev/null; then
          echo "# $NAME is ACTIVE but xlgen train is not running on worker 0: starting it again"
          start_training
        fi ;;
      WAITING_FOR_RESOURCES|PROVISIONING|CREATING|ACCEPTED) echo "# $NAME is $state" ;;
      *)
        echo "# $NAME is ${state:-gone} (preempted): requesting it again and relaunching"
        run "${GCLOUD[@]}" queued-resources delete "$NAME" "${LOC[@]}" --force --quiet
        request_tpu
        copy_checkout
        install_workers
        start_training ;;
    esac
    ((DRY_RUN)) && break
  done
fi

cat <<EOF
# started. Follow worker 0:   gcloud compute tpus tpu-vm ssh $NAME --worker=0 ${LOC[*]} --command='tail -f ~/xlgen-train.log'
# metrics:                     gsutil cat $WORKDIR/metrics.jsonl | tail
# tensorboard:                 tensorboard --logdir $WORKDIR/tensorboard
# delete the pod when done:    gcloud compute tpus queued-resources delete $NAME ${LOC[*]} --force
EOF
