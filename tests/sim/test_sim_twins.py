"""Twins: an inline-PTX intrinsic runs as its registered Python twin in the simulator."""

import numpy as np
import pytest
from numba import cuda
from numba.cuda.extending import intrinsic

from tessera_tile import sim

pytestmark = pytest.mark.sim_only(reason="twins replace intrinsics in the simulator only")


def _copy4_twin(dst, i, src, j):
    sim.store(dst, slice(i, i + 4), sim.load(src, slice(j, j + 4)))


@sim.twin(_copy4_twin)
@intrinsic
def copy4(typingctx, dst, i, src, j):  # pragma: no cover - never compiled in this test
    raise NotImplementedError


@cuda.jit
def gather4(dst, src):
    t = cuda.threadIdx.x
    copy4(dst, 4 * t, src, 4 * t + 1)


def test_twin_replaces_the_intrinsic_and_is_listed():
    assert copy4 is _copy4_twin
    assert any(name.endswith("copy4") for name in sim.twins())


def test_twin_accesses_are_counted_and_attributed_to_the_kernel_line():
    src = np.arange(17, dtype=np.float32)
    dst = np.zeros(16, np.float32)
    with sim.profile() as prof:
        gather4[1, 5](dst, src)  # thread 4 reads src[17:21] and writes dst[16:20]: both out
    np.testing.assert_array_equal(dst, src[1:17])
    assert prof.bytes_read == 16 * 4 and prof.bytes_written == 16 * 4
    assert prof.out_of_bounds, "the fifth thread's copy is out of bounds"
    assert all("test_sim_twins.py" in o.line for o in prof.out_of_bounds)
