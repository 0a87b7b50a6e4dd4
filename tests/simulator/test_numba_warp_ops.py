"""External check: numba-cuda's own warp-operation tests, with their simulator skip bypassed.

Every case that does not need the compiler must pass, including ``test_match_any_sync`` and
``test_match_all_sync``, which launch 10 threads with a full mask (PTX waits only for the lanes
that exist). The cases below read the compiler's output or its typing errors, which no simulator
has; each is run and must fail (strict xfail), so the list stays true.
"""

import functools
import importlib
import unittest

import pytest
from helpers import SIMULATED

import tessera_tile  # noqa: F401 - importing it installs the warp-aware simulator

pytestmark = pytest.mark.sim_only(reason="numba-cuda's cases are run against the simulator")
if not SIMULATED:
    pytest.skip("numba-cuda's warp tests are run against the simulator", allow_module_level=True)

CANNOT_PASS = {
    "test_shfl_sync_const_mode_val": "reads the LLVM IR (inspect_llvm): needs the compiler",
    "test_shfl_sync_const_mode_val_sm100": "calls compile_ptx: needs the compiler",
    "test_vote_sync_const_mode_val": "reads the LLVM IR (inspect_llvm): needs the compiler",
    "test_vote_sync_const_mode_val_sm100": "calls compile_ptx: needs the compiler",
    "test_vote_sync_type_validation": "expects Numba's TypingError: the simulator does not type",
}
FUNCTIONAL = 15  # the cases that run kernels and check their results: every one must pass


@functools.cache
def numba_case():
    """The TestCase class (not kept at module level, or pytest would collect it itself)."""
    module = importlib.import_module("numba.cuda.tests.cudapy.test_warp_ops")
    case = module.TestCudaWarpOperations
    case.__unittest_skip__ = False  # bypass @skip_on_cudasim
    return case


NAMES = sorted(n for n in dir(numba_case()) if n.startswith("test_"))
PARAMS = [
    pytest.param(name, id=name, marks=[pytest.mark.xfail(strict=True, reason=CANNOT_PASS[name])])
    if name in CANNOT_PASS
    else pytest.param(name, id=name)
    for name in NAMES
]


@pytest.mark.parametrize("name", PARAMS)
def test_numba_cuda_warp_op_case(name):
    result = unittest.TestResult()
    numba_case()(name).run(result)
    problems = result.errors + result.failures
    assert result.testsRun == 1 and not result.skipped, result.skipped
    assert not problems, problems[0][1]


def test_every_listed_case_exists():
    assert set(CANNOT_PASS) <= set(NAMES)
    assert len(NAMES) - len(CANNOT_PASS) == FUNCTIONAL
    assert {"test_match_any_sync", "test_match_all_sync"} <= set(NAMES) - set(CANNOT_PASS)
