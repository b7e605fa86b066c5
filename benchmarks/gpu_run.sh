#!/usr/bin/env bash
# The prepared GPU session (issues 33/34): one command on a lent GPU machine.
#   bash benchmarks/gpu_run.sh [extra args for `benchmarks.device --check`]
# Installs the carried peer wheels (.whl/, e.g. warprnnt-numba) if present, then runs the
# one-shot check with its rows rewritten to $OUT/device-check.json after every row (a run
# killed at its limit keeps what it measured) and the log to $OUT/device-check.log.
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
timeout "${CHECK_TIMEOUT:-480}" python3 -m benchmarks.device --check \
  --json "$OUT/device-check.json" "$@" 2>&1 | tee "$OUT/device-check.log"
echo "exit ${PIPESTATUS[0]}"
