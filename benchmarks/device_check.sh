#!/usr/bin/env bash
# The GPU checks of the scoring engine in one prepared run, for a machine with a CUDA device
# (for the `device` tool: run(command="bash benchmarks/device_check.sh", timeout_s=580)).
#
#   1. the device and torch versions;
#   2. the CUDA tests of the engine (tests/test_scoring_engine.py -k cuda: float32 on CUDA equals
#      the CPU reference, bf16 keeps >= 90% of the top-1);
#   3. benchmarks/scoring.py on CUDA: 1000 x 1000 pairs at T' = 32, reference / float32 / bf16,
#      pairs/s, peak device memory and errors (the target: bf16 under 1 s and 8 GB on an H200).
#
# It needs only torch, numpy and pytest: the package is used from this tree (PYTHONPATH), with no
# install step, so it runs on a bare machine with a CUDA build of torch.  Logs go to $OUT (the
# device tool brings that folder back), else ./device_check_out.  Exit status: 0 all passed,
# 1 a step failed, 3 no CUDA device.  DEVICE_CHECK_ON_CPU=1 runs the same steps on the CPU at a
# tiny size, to check the script itself on a machine without a GPU.
set -uo pipefail

OUT="${OUT:-device_check_out}"
PY="${PYTHON:-python3}"
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
if [ "${DEVICE_CHECK_ON_CPU:-0}" = 1 ]; then
  tests_filter="memory_budget"
  bench_args=(--device cpu --pairs 24 24 --steps 2 --repeats 1)
else
  tests_filter="cuda"
  bench_args=(--device cuda --repeats 2)
fi

{
  nvidia-smi 2>/dev/null || echo "nvidia-smi: not available"
  "$PY" -c "import torch; print('torch', torch.__version__, '| CUDA', torch.version.cuda, '| device:',
            torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)"
} 2>&1 | tee "$OUT/device.txt"
if [ "${DEVICE_CHECK_ON_CPU:-0}" != 1 ] && ! "$PY" -c "import sys, torch; sys.exit(not torch.cuda.is_available())"; then
  echo "no CUDA device here: nothing to check" | tee -a "$OUT/device.txt"
  exit 3
fi

status=0
echo "== tests ($tests_filter)"
timeout 150 "$PY" -m pytest -q -p no:cacheprovider tests/test_scoring_engine.py -k "$tests_filter" 2>&1 \
  | tee "$OUT/tests.txt" || status=1
echo "== benchmarks/scoring.py ${bench_args[*]}"
timeout 400 "$PY" benchmarks/scoring.py "${bench_args[@]}" 2>&1 | tee "$OUT/scoring.txt" || status=1
echo "device check finished with status $status; logs in $OUT"
exit $status
