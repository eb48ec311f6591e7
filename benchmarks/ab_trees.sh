#!/usr/bin/env bash
# A/B two source trees of Shoal in one run: CPU µs per request per process, NATS messages per
# request and throughput under perf_analyzer, alternating A, B, A, B so the machine's drift hits
# both alike (benchmarks/profile_shoal.py --no-pyspy for each side).
#
# usage: benchmarks/ab_trees.sh TREE_A TREE_B OUT ROUNDS MODEL [MODEL...]
#   e.g. git worktree add --detach /tmp/base main~3
#        benchmarks/ab_trees.sh /tmp/base . bench-out/ab 2 simple identity_fp32
# env: REPO (model repository, default /tmp/perf-models/repo from ../shared/bench/models.py),
#      SECS (seconds per measurement, default 10), PYTHON (default: this venv's python).
#
# Each side runs from its own tree (`env -C TREE PYTHONPATH=TREE python -m shoal.cli`): run
# from one checkout, `python -m` puts the current directory first on sys.path and both sides
# would run that checkout's code.
set -euo pipefail
A=$(realpath "$1"); B=$(realpath "$2"); OUT=$3; ROUNDS=$4; shift 4
PY=${PYTHON:-$(command -v python)}
HERE=$(dirname "$(realpath "$0")")
MODELS=(); for m in "$@"; do MODELS+=(--model "$m"); done
mkdir -p "$OUT"
for round in $(seq 1 "$ROUNDS"); do
  for side in A B; do
    tree=$A; [ "$side" = B ] && tree=$B
    dir="$OUT/$side-$round"
    timeout 300 "$PY" "$HERE/profile_shoal.py" "${REPO:-/tmp/perf-models/repo}" --out "$dir" "${MODELS[@]}" \
      --no-pyspy --seconds "${SECS:-10}" --shoal-cmd "env -C $tree PYTHONPATH=$tree $PY -m shoal.cli" \
      > "$dir.log" 2>&1 || { echo "side $side round $round failed: $dir.log"; continue; }
    "$PY" - "$dir/profile.json" "$side" <<'EOF'
import json, sys
for model, v in json.load(open(sys.argv[1])).items():
    cpu = {k: round(x) for k, x in v["cpu_us_per_request"].items() if x > 2}
    print(sys.argv[2], model, "req/s", v["throughput"], "batch", v["mean_batch"],
          "msgs/req", v["nats_in_msgs_per_request"], "cpu us/req", cpu, "sum", round(sum(cpu.values())))
EOF
  done
done
