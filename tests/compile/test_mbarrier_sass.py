"""mbarrier intrinsics compile on sm_80 (test_wait, ATOMS.ARRIVE, ARRIVES.LDGSTSBAR) and sm_90
(try_wait, SYNCS), in the producer/consumer hand-off of tests/primitives/test_mbarrier.py, with 0
spills and no local memory."""

import importlib.util
from pathlib import Path

import pytest

from tessera_tile import inspect

_SPEC = importlib.util.spec_from_file_location(
    "compiled_test_mbarrier", Path(__file__).parents[1] / "primitives" / "test_mbarrier.py"
)
_MODULE = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(_MODULE)
HANDOFF = _MODULE.handoff
SIG = "void(float32[::1], float32[::1])"
EXPECTED = {  # arch -> (PTX wait, SASS of an arrival, of a copy's arrival, of a wait)
    "sm_80": ("mbarrier.test_wait.parity", "ATOMS.ARRIVE.64", "ARRIVES.LDGSTSBAR.64", None),
    "sm_90": (
        "mbarrier.try_wait.parity",
        "SYNCS.ARRIVE.TRANS64",
        "ARRIVES.LDGSTSBAR.64",
        "SYNCS.PHASECHK.TRANS64.TRYWAIT",
    ),
}


@pytest.mark.parametrize("arch", sorted(EXPECTED))
def test_handoff_compiles_to_the_barrier_instructions(arch, record_property):
    report = inspect.compile(HANDOFF, SIG, arch=arch, block=64)
    assert report.spill_stores == report.spill_loads == 0 and not report.uses_local_memory
    wait, arrive, copy_arrive, sass_wait = EXPECTED[arch]
    for ptx in ("mbarrier.init.shared.b64", "mbarrier.arrive.shared.b64", wait,
                "cp.async.mbarrier.arrive.noinc.shared.b64"):  # fmt: skip
        assert ptx in report.ptx, ptx
    opcodes = [op for op in (arrive, copy_arrive, sass_wait) if op is not None]
    for opcode in opcodes:
        assert report.count(opcode) > 0, (opcode, report.histogram)
    counts = ", ".join(f"{op} {report.count(op)}" for op in opcodes)
    record_property("resources", f"mbarrier hand-off {arch}: {counts}")
