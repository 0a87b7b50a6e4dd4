#!/usr/bin/env bash
# Runs the three test tiers, each in its own process (the simulator and real compilation cannot
# share one), and prints each tier's time. Fails if any tier fails. PYTHON selects the
# interpreter (default: python). Which tier runs what: tests/conftest.py.
set -u
PY=${PYTHON:-python}
JOBS=${JOBS:-2}
cd "$(dirname "$0")/.."
rc=0
tier() {  # name, then the command
    local name=$1 start=$SECONDS
    shift
    echo "=== $name"
    "$@" || rc=1
    echo "=== $name: $((SECONDS - start)) s"
}
tier "GPU tier: correctness tests on a real device" \
    env TESSERA_TIER=gpu "$PY" -m pytest tests --ignore=tests/compile -q
tier "compile tier: every kernel for sm_80 and sm_90, resources and SASS" \
    env TESSERA_TIER=compile "$PY" -m pytest tests/compile -q -n "$JOBS"
tier "simulator tier: correctness against NumPy in the warp-aware simulator" \
    env NUMBA_ENABLE_CUDASIM=1 TESSERA_TIER=sim "$PY" -m pytest tests --ignore=tests/compile -q -n "$JOBS"
exit $rc
