#!/usr/bin/env bash
# MLServer's own venv for benchmarks/vs_triton.py (it pins many packages: never Shoal's venv), and wrk,
# the load generator the three servers share there (benchmarks/mlserver_peer.py says why).
#
# usage: bash benchmarks/setup_mlserver.sh      (idempotent; a re-run is cheap)
# env:   MLSERVER_VENV (default /tmp/mlserver-venv), MLSERVER_PYTHON (default python3, CPython >= 3.9)
set -euo pipefail
VENV=${MLSERVER_VENV:-/tmp/mlserver-venv}
PY=${MLSERVER_PYTHON:-python3}

if [ ! -x "$VENV/bin/mlserver" ]; then
  "$PY" -m venv "$VENV"
  # uvloop < 0.22: MLServer 1.7.1's inference worker calls asyncio.get_event_loop() before it sets a
  # loop, which uvloop 0.22 turns into "There is no current event loop" (the worker dies at start)
  "$VENV/bin/pip" install -q "mlserver==1.7.1" "uvloop<0.22" onnxruntime
fi
if ! command -v wrk >/dev/null; then
  (apt-get update -qq || true) && apt-get install -y -qq wrk
fi
"$VENV/bin/mlserver" --version
echo "mlserver env ready in $VENV"
