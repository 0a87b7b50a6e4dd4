"""Compile tier: a column reduction fills an H100 (issue "kernels at the hardware's limits").

The float32 sum and var over axis 0 of a (4096, 1024) array, for sm_80 and sm_90: the plan's
grid has 2 or more blocks per SM of a 132-SM H100; the compiled main loop reads 16 bytes of adjacent
columns per load (``LDG.E.128``) with 64 bytes or more in flight per thread; and bytes in flight
per SM (per thread x threads per block x resident blocks per SM, resident blocks from ptxas's
registers and shared memory through the occupancy model, and no more than the grid gives each
SM) reach Little's requirement of about 17 KiB per SM (3.35 TB/s at ~700 ns, see DESIGN.md).
"""

import re

import numpy as np
import pytest

from tessera_tile import inspect as offline
from tessera_tile import ops

ARCHS = ("sm_80", "sm_90")
SMS = 132  # H100 SXM
LITTLE_BYTES = 17 * 1024


def launch(x):
    """(blocks, threads per block) the plan of ``ops.sum(x, axis=0)`` launches."""
    (stage,) = ops.sum.explain(x, axis=0).stages
    found = re.search(r"(\d+) block\(s\) of (\d+) threads", stage)
    assert found, stage
    return int(found[1]), int(found[2])


@pytest.mark.parametrize("arch", ARCHS)
def test_float32_column_sum_has_littles_bytes_in_flight_per_sm(arch):
    x = np.zeros((4096, 1024), np.float32)
    blocks, threads = launch(x)
    (report,) = ops.sum.inspect(x, axis=0, arch=arch)
    assert report.spill_stores == 0 and report.spill_loads == 0
    assert not report.uses_local_memory
    loop = report.loop_with("LDG.E.128")  # the main loop: 16-byte loads along the columns
    assert loop is not None, report.key_opcodes()
    loads = loop.count("LDG.E.128")
    scalar = sum(n for op, n in loop.histogram.items() if op.startswith("LDG") and "128" not in op)
    per_thread = report.bytes_in_flight(loop)
    warps = threads // 32
    resident = round(report.occupancy * offline.ARCHS[arch].max_warps / warps)
    per_sm = per_thread * threads * min(resident, blocks // SMS)
    print(
        f"{arch}: {blocks} blocks of {threads} threads ({blocks / SMS:.1f} per SM), "
        f"{report.registers} registers, {report.shared_bytes} B shared, {resident} resident "
        f"blocks per SM; main loop {loop.instructions} instructions, {loads} x LDG.E.128, "
        f"{per_thread} B in flight per thread, {per_sm / 1024:.0f} KiB per SM "
        f"({per_thread * threads * resident / 1024:.0f} KiB at full residency)"
    )
    assert blocks >= 2 * SMS
    assert loads >= 4 and scalar == 0
    assert per_thread >= 64
    assert resident >= 2 and per_sm >= LITTLE_BYTES


@pytest.mark.parametrize("arch", ARCHS)
def test_float16_and_bfloat16_column_sums_load_8_columns_at_a_time(arch):
    import ml_dtypes

    for dtype in (np.float16, ml_dtypes.bfloat16):
        x = np.zeros((4096, 1024), dtype)
        (report,) = ops.sum.inspect(x, axis=0, arch=arch)
        loop = report.loop_with("LDG.E.128")
        assert loop is not None and loop.count("LDG.E.128") >= 4
        assert report.bytes_in_flight(loop) >= 64
        assert report.spill_stores == 0 and not report.uses_local_memory


@pytest.mark.parametrize("arch", ARCHS)
def test_float32_column_var_is_one_pass_with_littles_bytes_in_flight(arch):
    """var over axis 0 takes the split scheme too: one pass of Welford folds over 16-byte
    loads, (shift, mean, M2) partials merged by Chan's formula after the loop."""
    x = np.zeros((4096, 1024), np.float32)
    (stage,) = ops.var.explain(x, axis=0).stages
    found = re.search(r"(\d+) pass\(es\), .*?(\d+) block\(s\) of (\d+) threads", stage)
    assert found, stage
    passes, blocks, threads = (int(g) for g in found.groups())
    (report,) = ops.var.inspect(x, axis=0, arch=arch)
    assert report.spill_stores == 0 and report.spill_loads == 0
    assert not report.uses_local_memory
    loop = report.loop_with("LDG.E.128")
    assert loop is not None, report.key_opcodes()
    loads = loop.count("LDG.E.128")
    scalar = sum(n for op, n in loop.histogram.items() if op.startswith("LDG") and "128" not in op)
    per_thread = report.bytes_in_flight(loop)
    resident = round(report.occupancy * offline.ARCHS[arch].max_warps / (threads // 32))
    per_sm = per_thread * threads * min(resident, blocks // SMS)
    print(
        f"{arch}: var, {blocks} blocks of {threads} threads ({blocks / SMS:.1f} per SM), "
        f"{report.registers} registers, {report.shared_bytes} B shared, {resident} resident "
        f"blocks per SM; main loop {loop.instructions} instructions ({loop.count('FFMA')} "
        f"FFMA, {loop.count('MUFU.RCP')} MUFU.RCP), {loads} x LDG.E.128, {per_thread} B in "
        f"flight per thread, {per_sm / 1024:.0f} KiB per SM"
    )
    assert passes == 1
    assert blocks >= 2 * SMS
    assert loads >= 4 and scalar == 0
    assert per_thread >= 64
    assert resident >= 2 and per_sm >= LITTLE_BYTES
