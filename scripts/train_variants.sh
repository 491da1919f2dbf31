#!/usr/bin/env bash
# Train several variants of one flagfile side by side, each pinned to its own cores, within a time box.
#
#     scripts/train_variants.sh FLAGFILE VARIANTS_FILE OUT_DIR TIME_BOX_S [CORES_PER_RUN] [-- FLAGS FOR EVERY RUN]
#
# VARIANTS_FILE holds one variant per line: its name, then the launch.train flags it adds to FLAGFILE (blank lines
# and lines starting with # are skipped). Run i gets cores i*CORES_PER_RUN .. (i+1)*CORES_PER_RUN-1 and writes
# OUT_DIR/NAME (its logdir) and OUT_DIR/NAME.log (its console). Runs still going when TIME_BOX_S has passed are
# stopped (SIGTERM, then SIGKILL), so a lent machine's call ends on time; `python scripts/train_variants_report.py
# OUT_DIR` then tabulates what each run reached. `launch.compare` is the tool for one flag over seeds; this is for
# exploring several unrelated changes at once.
set -euo pipefail

if [[ $# -lt 4 ]]; then
  sed -n '2,11p' "$0" >&2
  exit 2
fi
flagfile=$1 variants=$2 out=$3 time_box=$4
cores_per_run=${5:-1}
shift $(( $# < 5 ? $# : 5 ))
[[ ${1:-} == "--" ]] && shift
common=("$@")

mkdir -p "$out"
pids=()
index=0
while read -r name extra; do
  [[ -z $name || $name == \#* ]] && continue
  first=$((index * cores_per_run))
  cores=$first-$((first + cores_per_run - 1))
  # shellcheck disable=SC2086  # a variant's flags are split on purpose
  taskset -c "$cores" python3 -m launch.train --flagfile="$flagfile" --logdir="$out/$name" "${common[@]}" $extra \
    >"$out/$name.log" 2>&1 &
  pids+=($!)
  echo "started $name on cores $cores: ${common[*]} $extra"
  index=$((index + 1))
done <"$variants"

deadline=$((SECONDS + time_box))
while ((SECONDS < deadline)); do
  running=0
  for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && running=$((running + 1)); done
  ((running == 0)) && break
  sleep 5
done
for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
sleep 5
for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
wait || true
echo "variants done after ${SECONDS}s"
