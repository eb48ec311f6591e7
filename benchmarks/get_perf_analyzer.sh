#!/usr/bin/env bash
# Fetch Triton's perf_analyzer (from the tritonclient 2.41.0 manylinux wheel) and the CUDA
# runtime library it links against (it runs on a CPU-only host). Installs into
# benchmarks/.tools/; prints the path of a wrapper script that sets LD_LIBRARY_PATH.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
tools="$here/.tools"
mkdir -p "$tools/wheels"
if [ ! -x "$tools/perf_analyzer.bin" ]; then
  python3 -m pip download -q --no-deps --only-binary=:all: --platform manylinux1_x86_64 \
    tritonclient==2.41.0 -d "$tools/wheels"
  python3 -m pip download -q --no-deps nvidia-cuda-runtime-cu12 -d "$tools/wheels"
  python3 -m zipfile -e "$tools"/wheels/tritonclient-2.41.0-*.whl "$tools/tc"
  python3 -m zipfile -e "$tools"/wheels/nvidia_cuda_runtime_cu12-*.whl "$tools/cuda"
  cp "$tools/tc/tritonclient-2.41.0.data/data/bin/perf_analyzer" "$tools/perf_analyzer.bin"
  chmod +x "$tools/perf_analyzer.bin"
fi
if ! ldconfig -p | grep -q libb64.so.0d; then
  (apt-get install -y -q libb64-0d || (apt-get update -q && apt-get install -y -q libb64-0d)) >/dev/null
fi
cat > "$tools/perf_analyzer" <<WRAP
#!/usr/bin/env bash
export LD_LIBRARY_PATH="$tools/cuda/nvidia/cuda_runtime/lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
exec "$tools/perf_analyzer.bin" "\$@"
WRAP
chmod +x "$tools/perf_analyzer"
echo "$tools/perf_analyzer"
