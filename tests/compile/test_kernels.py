"""Compile tier: every shipped and example kernel builds for sm_80 and sm_90 within budget."""

import importlib
import pkgutil
from pathlib import Path

import pytest
from cases import CASES
from helpers import ROOT, load_example
from numba.cuda.dispatcher import CUDADispatcher

import tessera_tile
from tessera_tile import inspect

ARCHS = ("sm_80", "sm_90")


def resolve(source: str):
    if source.startswith("examples/"):
        return load_example(source.removeprefix("examples/"))
    return importlib.import_module(source)


def kernels_in(module) -> set[str]:
    return {
        name
        for name, obj in vars(module).items()
        if isinstance(obj, CUDADispatcher)
        and not obj.targetoptions.get("device")
        and getattr(obj.py_func, "__module__", None) == module.__name__
    }


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_kernel_compiles_within_budget(case, arch, record_property):
    kernel = getattr(resolve(case.source), case.kernel)
    report = inspect.compile(
        kernel, case.signature, arch=arch, block=case.block, dynamic_shared=case.dynamic_shared
    )
    record_property(
        "resources",
        f"{case.id:45} {arch}  regs {report.registers:3} (budget {case.budget[arch]:3})  "
        f"spills {report.spill_stores + report.spill_loads}  stack {report.stack_bytes}  "
        f"smem {report.shared_bytes:5} B + {report.dynamic_shared_bytes:6} B dynamic  "
        f"instr {report.instructions:5}  "
        f"occupancy {report.occupancy:4.0%}",
    )
    assert report.spill_stores == 0 and report.spill_loads == 0, report
    assert not report.uses_local_memory, report
    assert report.registers <= case.budget[arch], (
        f"{case.id} uses {report.registers} registers on {arch}, budget {case.budget[arch]}"
    )
    for opcode, minimum in case.opcodes.items():
        assert report.count(opcode) >= minimum, f"expected {opcode} in SASS:\n{report}"


def test_every_kernel_has_a_case():
    listed = {c.id for c in CASES}
    found = set()
    for info in pkgutil.walk_packages(tessera_tile.__path__, "tessera_tile."):
        module = importlib.import_module(info.name)
        named = getattr(module, "NAMED", ())  # built on first use (kernels/_named.py)
        found |= {f"{info.name}:{k}" for k in (*kernels_in(module), *named)}
    for path in sorted(Path(ROOT, "examples").glob("*.py")):
        module = load_example(path.stem)
        found |= {f"examples/{path.stem}:{k}" for k in kernels_in(module)}
    missing = found - listed
    assert not missing, f"kernels without a compile case in tests/compile/cases.py: {missing}"
    assert listed <= found, f"cases naming no kernel: {listed - found}"
