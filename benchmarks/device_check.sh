#!/usr/bin/env bash
# Every GPU check of dab in one prepared run, for a machine with a CUDA device (issue 28; docs/performance.md).
# For the `device` tool:
#   run(command="bash benchmarks/device_check.sh", carry=[".whl"], timeout_s=540)
# Its steps are capped at 480 s together (each under `timeout`), inside the 8 minutes it may take.
#
#   0. the device, torch, and the plain matrix-product rate (benchmarks/device_peak.py): every figure
#      below is also read as a share of it;
#   1. the CUDA tests: the scoring engine, the model against the engine under bf16 autocast, a training
#      run on CUDA in float32 and under bf16 autocast (tests/*: -k cuda);
#   2. scoring 1000 x 1000 pairs at T' = 32 with the paper-size model (benchmarks/scoring.py): time, peak
#      device memory, max relative error and top-1 agreement against float32, for float32, TF32 and bf16;
#   3. training throughput on a store of MSR-VTT's shape made on the device (benchmarks/train_speed.py):
#      CLIP frozen, and every block of ViT-B-32's shape trained from token states; float32 and bf16
#      autocast; one MSR-VTT-9k epoch's time for each;
#   4. stage one's encoder: ViT-B-32 videos/s with bf16 autocast (benchmarks/encode_speed.py);
#   5. DDP over NCCL: a 1-process torchrun of `dab train` against the plain run (benchmarks/ddp_check.py).
#
# The machine has torch, numpy, h5py, click, rich, pytest, matplotlib and Triton, but not open_clip (nor
# zarr, decord, PyAV) and no network: the package is used from this tree (PYTHONPATH), and open_clip comes
# as wheels in .whl/ (carried; fetch them here first with `bash benchmarks/device_check.sh --fetch-wheels`).
# Logs go to $OUT (the device tool brings that folder back), else ./device_check_out. Exit status: 0 all
# passed, 1 a step failed, 3 no CUDA device. DEVICE_CHECK_ON_CPU=1 runs every step on the CPU at a tiny
# size (tests/benchmarks/test_device_check.py does, as a slow test), so the GPU run cannot fail on a typo.
set -uo pipefail

if [ "${1:-}" = "--fetch-wheels" ]; then  # here, before a device run: the wheels the device lacks
  python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .whl open_clip_torch==3.3.0 ftfy==6.3.1 wcwidth
  exit $?
fi

OUT="${OUT:-device_check_out}"
PY="${PYTHON:-python3}"
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
if ! "$PY" -c "import open_clip" 2>/dev/null; then
  if ls .whl/*.whl >/dev/null 2>&1; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/dab-site .whl/*.whl \
      && export PYTHONPATH="$PYTHONPATH:/tmp/dab-site"
  fi
fi

on_cpu="${DEVICE_CHECK_ON_CPU:-0}"
if [ "$on_cpu" = 1 ]; then
  dev=cpu
  tests_filter="autocast or memory_budget"
  peak_args=(--n 256 --repeats 2)
  scoring_args=(--device cpu --pairs 24 24 --steps 2 --repeats 1 --dtypes float32 tfloat32 bfloat16 --shortlist 0)
  train_args=(--device cpu --tiny)
  encode_args=(--device cpu --clip dab-tiny --batch 2 --batches 2 --dtypes float32 bfloat16 --states -1 1)
else
  dev=cuda
  tests_filter="cuda"
  peak_args=(--n 8192 --repeats 10)
  scoring_args=(--device cuda --pairs 1000 1000 --steps 32 --repeats 2 --dtypes float32 tfloat32 bfloat16)
  train_args=(--device cuda --steps 40)
  encode_args=(--device cuda --clip ViT-B-32 --batch 16 --batches 10 --dtypes float32 autocast-bf16)
fi

{
  nvidia-smi 2>/dev/null || echo "nvidia-smi: not available"
  "$PY" -c "import torch; print('torch', torch.__version__, '| CUDA', torch.version.cuda, '| device:',
            torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)"
  "$PY" -c "import open_clip; print('open_clip', open_clip.__version__)" 2>&1 | tail -1
} 2>&1 | tee "$OUT/device.txt"
if [ "$on_cpu" != 1 ] && ! "$PY" -c "import sys, torch; sys.exit(not torch.cuda.is_available())"; then
  echo "no CUDA device here: nothing to check" | tee -a "$OUT/device.txt"
  exit 3
fi

status=0
step() {  # step NAME SECONDS LOG COMMAND...: run one step under a time limit; a failure marks the run failed
  local name="$1" limit="$2" log="$3"
  shift 3
  # the limits fit the GPU run's 8 minutes; the CPU rehearsal (a test, maybe on a loaded machine) checks that
  # every step runs, not how fast, so it gets 4x the time (the test's own timeout covers the sum)
  [ "$on_cpu" = 1 ] && limit=$((limit * 4))
  echo "== $name ($(date +%T), at most ${limit} s)"
  local t0=$SECONDS
  timeout "$limit" "$@" 2>&1 | tee "$OUT/$log"
  local rc=${PIPESTATUS[0]}
  echo "== $name: exit $rc after $((SECONDS - t0)) s" | tee -a "$OUT/steps.txt"
  [ "$rc" = 0 ] || status=1
}

step "matrix-product peak" 45 peak.txt "$PY" benchmarks/device_peak.py --device "$dev" "${peak_args[@]}"
step "tests ($tests_filter)" 90 tests.txt "$PY" -m pytest -q -p no:cacheprovider \
  tests/scoring/test_scoring_engine.py tests/model/test_model.py tests/stages/test_train.py -k "$tests_filter"
step "scoring 1000 x 1000, T'=32" 120 scoring.txt "$PY" benchmarks/scoring.py "${scoring_args[@]}"
step "training throughput" 150 train.txt "$PY" benchmarks/train_speed.py "${train_args[@]}"
step "encoder throughput" 30 encode.txt "$PY" benchmarks/encode_speed.py "${encode_args[@]}"
step "DDP, 1-process torchrun" 45 ddp.txt "$PY" benchmarks/ddp_check.py --device "$dev"
echo "device check finished with status $status; logs in $OUT"
exit $status
