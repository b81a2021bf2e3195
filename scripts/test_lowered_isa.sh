#!/usr/bin/env bash
# The scoring, kernel, model and search tests again with the instruction sets lowered, so that an assertion that
# holds only on this CPU's fastest paths (AMX, AVX-512, oneDNN's bf16) shows on any machine: CI runs on whichever
# CPU the submitting machine has (Sapphire Rapids with AMX, Zen 4/5 with AVX-512, Zen 3 with AVX2 only have all
# been seen). Two levels, each a fresh process (the variables are read at start-up):
#   avx2      torch's kernels at AVX2, oneDNN and MKL at AVX2, no AMX, dab's compiled kernels built for x86-64-v3
#   baseline  torch's default (no AVX) kernels, oneDNN at SSE4.1, MKL at SSE4.2, dab's compiled kernels off
# Usage: scripts/test_lowered_isa.sh [PYTHON] [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${1:-.venv/bin/python}
shift || true
TESTS=(tests/scoring tests/model tests/search)
run() {
    echo "== lowered instruction sets: $1"
    shift
    env "$@" "$PY" -m pytest -q -p no:cacheprovider -m "not slow and not distributed" "${TESTS[@]}" ${EXTRA[@]+"${EXTRA[@]}"}
}
EXTRA=("$@")
march=()
if [[ "$(uname -m)" == x86_64 ]]; then
    march=(DAB_KERNEL_MARCH=x86-64-v3)
fi
run avx2 ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 DAB_AMX=0 ${march[@]+"${march[@]}"}
run baseline ATEN_CPU_CAPABILITY=default ONEDNN_MAX_CPU_ISA=SSE41 MKL_ENABLE_INSTRUCTIONS=SSE4_2 DAB_AMX=0 \
    DAB_CPU_KERNELS=0
