#!/usr/bin/env bash
# Where the gateway's CPU goes, below Python: `perf record` (the kernel's cpu-clock sampling, so it
# works where a VM offers no hardware counters) on the gateway of a `shoal serve` under perf_analyzer
# load, reported by shared object (libpython, the mypyc-compiled modules, the kernel, uvloop, ...) and
# by symbol. py-spy cannot tell these apart: on Python 3.11 it charges time spent in C below the last
# Python frame it saw (docs/performance.md, "What stands between Shoal and Triton").
#
# usage: benchmarks/perf_gateway.sh SHOAL_BIN REPO MODEL CONCURRENCY SECONDS OUT_DIR
#   SHOAL_BIN: the `shoal` of the build to profile (a compiled `pip install .` or an editable one)
#   needs: perf (Debian's linux-perf), perf_analyzer at $PA (default /tmp/anchor-venv/bin/pa,
#   made by benchmarks/vs_triton.py's setup), curl
set -eu
SHOAL=$1; REPO=$2; MODEL=$3; CONC=$4; SECS=$5; OUT=$6
PA=${PA:-/tmp/anchor-venv/bin/pa}
mkdir -p "$OUT"
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
cd /tmp  # `python -m` puts the working directory first: a checkout here would shadow the build
"$SHOAL" serve --model-repository "$REPO" --http-address 127.0.0.1 --http-port "$port" --metrics-port 0 \
    --grpc-port 0 --nats-monitor-port 0 > "$OUT/serve.log" 2>&1 &
serve=$!
trap 'kill -INT $serve 2>/dev/null || true; wait $serve 2>/dev/null || true' EXIT
for _ in $(seq 1 240); do curl -sf "http://127.0.0.1:$port/v2/models/$MODEL/ready" && break; sleep 0.5; done
gateway=$(ps -o pid,args --ppid "$serve" | awk '/gateway/ {print $1; exit}')
"$PA" -m "$MODEL" -u "127.0.0.1:$port" --concurrency-range "$CONC" --measurement-interval 4000 -p 4000 \
    > "$OUT/perf_analyzer.txt" 2>&1 &
load=$!
sleep 3  # past perf_analyzer's warm-up
perf record -F 999 -e cpu-clock -g -p "$gateway" -o "$OUT/perf.data" -- sleep "$SECS" > /dev/null 2>&1
wait $load
perf report -i "$OUT/perf.data" --no-children --sort dso --stdio -g none 2>/dev/null | grep -v '^#' | grep -v '^$' > "$OUT/by_dso.txt"
perf report -i "$OUT/perf.data" --no-children --sort dso,sym --stdio -g none 2>/dev/null | grep -v '^#' | grep -v '^$' | head -60 > "$OUT/by_symbol.txt"
head -12 "$OUT/by_dso.txt"
