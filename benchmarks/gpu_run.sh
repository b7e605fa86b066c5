#!/usr/bin/env bash
# The prepared GPU session (issues 33/34): one command on a lent GPU machine.
#   bash benchmarks/gpu_run.sh [extra args for `benchmarks.device --check`]
# The wheel folder is not in git; make it here first (then pass carry: [".whl"]):
#   echo /.whl/ >> .git/info/exclude; python3 -m pip download --no-deps --only-binary=:all: \
#     --python-version 3.12 --implementation cp -d .whl warprnnt-numba==0.4.1
# A session's 15 device minutes, as two calls (each `run` at most 600 s):
#   1. DUOLOSS_COMMIT=<c> SWEEPS=0 bash benchmarks/gpu_run.sh      timeout_s 480 (~400 s)
#   2. (at once, warm) ONLY_SWEEPS=1 SWEEP_TIMEOUT=100 bash benchmarks/gpu_run.sh
# or all in one call (about 400 s on an H200; timeout_s 590):
#   CTC_SWEEP=0 SPEED_TIMEOUT=180 CHECK_TIMEOUT=240 PROFILE_TIMEOUT=70 SWEEP_TIMEOUT=90 \
#     bash benchmarks/gpu_run.sh
# (CTC_SWEEP=0: the speed rows already time both CTC forms side by side)
# Installs the carried peer wheels (.whl/, e.g. warprnnt-numba) if present, then runs the
# one-shot check in two processes, speed first, their rows rewritten to
# $OUT/device-speed.json and $OUT/device-check.json after every row (a run killed at its
# limit keeps what it measured), the logs beside them.
# DUOLOSS_COMMIT names the commit measured (the copy there has no .git).
set -uo pipefail
OUT=${OUT:-/tmp/duoloss-gpu}
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=.:${PYTHONPATH:-} PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
# ONLY_SWEEPS=1: the knob sweeps alone (a second call while the machine is warm: one
# `run` may take at most 600 s, and speed + check + profile take about 400)
if [ "${ONLY_SWEEPS:-0}" = 0 ]; then
# speed first (the measurements the issues ask for), then validation, syncs, graphs and
# memory in a second process (Triton's disk cache keeps the kernels compiled by the first)
timeout "${SPEED_TIMEOUT:-270}" python3 -m benchmarks.device --check --skip validate \
  --skip sync --skip graph --skip memory --json "$OUT/device-speed.json" "$@" 2>&1 \
  | tee "$OUT/device-speed.log"
echo "speed exit ${PIPESTATUS[0]}"
# CHECK_ARGS: more for the second process (e.g. "--skip jax" when the JAX kernels were
# validated at an earlier commit and are unchanged)
timeout "${CHECK_TIMEOUT:-240}" python3 -m benchmarks.device --check --skip speed \
  ${CHECK_ARGS:-} --json "$OUT/device-check.json" "$@" 2>&1 | tee "$OUT/device-check.log"
echo "check exit ${PIPESTATUS[0]}"
# where each step's time goes (torch.profiler, per kernel); PROFILE_TIMEOUT=0 skips it
if [ "${PROFILE_TIMEOUT:-90}" != 0 ]; then
  timeout "${PROFILE_TIMEOUT:-90}" python3 -m benchmarks.device_profile \
    --json "$OUT/device-profile.json" > "$OUT/device-profile.log" 2>&1
  echo "profile exit $?"; grep -v "^USDT\|^STAGE" "$OUT/device-profile.log" | head -80
fi
fi
# then the kernels' knobs, each bounded (SWEEPS=0 skips them): the torch CTC kernel's
# launch configurations, the fused transducer kernels' tiles and warps, and the Pallas
# CTC's num_warps / posterior placement
if [ "${SWEEPS:-1}" != 0 ]; then
  if [ "${CTC_SWEEP:-1}" != 0 ]; then
    timeout "${SWEEP_TIMEOUT:-120}" python3 -m benchmarks.ctc_device_sweep --quick --reps 20 \
      > "$OUT/ctc-device-sweep.json" 2> "$OUT/ctc-device-sweep.log"; echo "ctc sweep exit $?"
  fi
  timeout "${SWEEP_TIMEOUT:-120}" python3 -m benchmarks.transducer_fused_sweep \
    > "$OUT/transducer-fused-sweep.jsonl" 2> "$OUT/transducer-fused-sweep.log"
  echo "transducer sweep exit $?"; cat "$OUT/transducer-fused-sweep.jsonl"
  if [ "${PALLAS_SWEEP:-0}" != 0 ]; then
    timeout "${SWEEP_TIMEOUT:-120}" python3 -m benchmarks.pallas_ctc_sweep \
      > "$OUT/pallas-ctc-sweep.txt" 2>&1; echo "pallas sweep exit $?"
  fi
  [ "${CTC_SWEEP:-1}" = 0 ] || python3 -c "import json; d=json.load(open('$OUT/ctc-device-sweep.json')); print(json.dumps(d)[:6000])" || true
fi
