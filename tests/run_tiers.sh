#!/usr/bin/env bash
# Runs the three test tiers, each in its own process (the simulator and real compilation cannot
# share one). Fails if any tier fails. PYTHON selects the interpreter (default: python).
set -u
PY=${PYTHON:-python}
JOBS=${JOBS:-2}
cd "$(dirname "$0")/.."
rc=0
echo "=== GPU tier: correctness tests on a real device"
TESSERA_TIER=gpu "$PY" -m pytest tests/sim -q || rc=1
echo "=== compile tier: every kernel for sm_80 and sm_90, resources and SASS"
TESSERA_TIER=compile "$PY" -m pytest tests/compile -q -n "$JOBS" || rc=1
echo "=== simulator tier: correctness against NumPy in the warp-aware simulator"
NUMBA_ENABLE_CUDASIM=1 TESSERA_TIER=sim "$PY" -m pytest tests/sim -q -n "$JOBS" || rc=1
exit $rc
