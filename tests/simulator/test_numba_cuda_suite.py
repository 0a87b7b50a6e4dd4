"""External check: numba-cuda's own tests (they ship in its wheel), each run twice in this process,
under numba-cuda's simulator (``tessera_tile.sim.stock()``) and under tessera_tile's. Every case
that the stock simulator passes (or fails as numba-cuda expects) must do the same with ours
(issue 20).

The modules are those whose kernels reach what tessera_tile's simulator replaces: the launch
path and its arguments, thread identity and bit intrinsics, shared and local arrays, barriers,
atomics, integer typing, device functions and exceptions, and the host-side indexing of device
arrays. Cases that numba-cuda skips under its
simulator are not collected; those it skips at run time, or that the stock simulator fails, are
skipped here with its reason. :data:`DIFFERENCES` lists where ours departs from the stock
simulator on purpose; each must still depart, so the list stays true.
"""

import functools
import importlib
import unittest

import pytest
from helpers import SIMULATED

from tessera_tile import sim

pytestmark = pytest.mark.sim_only(reason="numba-cuda's cases are run against the simulator")
if not SIMULATED:
    pytest.skip("numba-cuda's tests are run against the simulator", allow_module_level=True)

MODULES = tuple(
    f"numba.cuda.tests.{name}"
    for name in (
        "cudapy.test_intrinsics",
        "cudapy.test_array_alignment",
        "cudapy.test_exception",
        "cudapy.test_userexc",
        "cudapy.test_recursion",
        "cudapy.test_sm",
        "cudapy.test_sm_creation",
        "cudapy.test_localmem",
        "cudapy.test_sync",
        "cudapy.test_atomics",
        "cudapy.test_array_args",
        "cudapy.test_retrieve_autoconverted_arrays",
        "cudapy.test_record_dtype",
        "cudapy.test_idiv",
        "cudapy.test_operator",
        "cudapy.test_casting",
        "cudapy.test_frexp_ldexp",
        "cudapy.test_math",
        "cudapy.test_forall",
        "cudapy.test_dispatcher",
        "cudapy.test_device_func",
        "cudapy.test_cooperative_groups",
        "cudasim.test_cudasim_issues",
        # host-side indexing of device arrays (sim.device_arrays)
        "cudadrv.test_array_attr",
        "cudadrv.test_cuda_array_slicing",
        "cudadrv.test_cuda_ndarray",
        "cudapy.test_array",
        "cudapy.test_slicing",
    )
)
_ALIGNMENT = (
    "a GPU compiles alignment= (numba-cuda lowers it as a power of 2 and a multiple of the "
    "pointer size) and tessera_tile's kernels use it: the simulator honours it, where "
    "numba-cuda's refuses it"
)
_TRANSPOSE = (
    "a GPU's DeviceNDArray.T is a transposing copy, C-contiguous (numba-cuda's own device test "
    "test_array_like_2d_view_transpose_device expects its strides): the simulator copies too, "
    "where numba-cuda's returns a NumPy view"
)
DIFFERENCES = {
    "test_array_alignment.TestCudasimUnsupportedAlignment.test_local_unsupported": _ALIGNMENT,
    "test_array_alignment.TestCudasimUnsupportedAlignment.test_shared_unsupported": _ALIGNMENT,
    "test_array.TestCudaArray.test_array_like_2d_view_transpose_simulator": _TRANSPOSE,
}


def _load(module_name: str) -> tuple[dict, str | None]:
    """{case id: TestCase} of a module's cases that run under the simulator, or why none."""
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:  # e.g. cffi, an optional dependency of some of numba-cuda's tests
        return {}, f"{module_name} cannot be imported here: {e}"
    cases = {}
    for case in _flatten(unittest.defaultTestLoader.loadTestsFromModule(module)):
        method = getattr(case, case._testMethodName)
        if getattr(type(case), "__unittest_skip__", False) or getattr(
            method, "__unittest_skip__", False
        ):
            continue  # numba-cuda skips it under its simulator
        short = module_name.rsplit(".", 1)[1]
        cases[f"{short}.{type(case).__name__}.{case._testMethodName}"] = case
    return cases, None


def _flatten(suite):
    for item in suite:
        if isinstance(item, unittest.TestSuite):
            yield from _flatten(item)
        else:
            yield item


@functools.cache
def _collected() -> tuple[dict, dict]:
    """({case id: TestCase}, {module: why it has no cases}); not at module level, or pytest
    would collect numba-cuda's TestCase classes itself."""
    cases, unusable = {}, {}
    for name in MODULES:
        found, why = _load(name)
        cases.update(found)
        if why:
            unusable[name] = why
    return cases, unusable


def _outcome(case: unittest.TestCase) -> tuple[str, str]:
    """(outcome, details) of one run of ``case``."""
    result = unittest.TestResult()
    type(case)(case._testMethodName).run(result)
    if result.errors or result.failures:
        return "failed", (result.errors + result.failures)[0][1]
    if result.skipped:
        return "skipped", result.skipped[0][1]
    if result.expectedFailures:
        return "expected failure", ""
    if result.unexpectedSuccesses:
        return "unexpected success", ""
    return "passed", ""


CASES = sorted(_collected()[0])


@pytest.mark.parametrize("case_id", CASES)
def test_what_numba_cudas_simulator_passes_passes(case_id):
    case = _collected()[0][case_id]
    with sim.stock():
        stock, stock_details = _outcome(case)
    ours, details = _outcome(case)
    if case_id in DIFFERENCES:
        assert (stock, ours) == ("passed", "failed"), (
            f"listed as a deliberate difference ({DIFFERENCES[case_id]}), but the stock "
            f"simulator gives {stock} and ours {ours}"
        )
        return
    if stock not in ("passed", "expected failure"):
        pytest.skip(f"numba-cuda's simulator does not pass it: {stock}: {stock_details[-300:]}")
    assert ours == stock, details


def test_the_modules_and_differences_are_real():
    cases, unusable = _collected()
    for why in unusable.values():
        print(f"not run: {why}")
    assert set(DIFFERENCES) <= set(cases)
    assert len(unusable) < len(MODULES) // 4, unusable  # most of the modules run
    assert len(cases) > 250, len(cases)  # they hold the cases, not only their skips
