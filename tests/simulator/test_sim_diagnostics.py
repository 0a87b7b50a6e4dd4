"""The simulator names bad masks and divergent deadlocks instead of hanging, and marks reads
that PTX leaves undefined."""

import inspect

import numpy as np
import pytest
from numba import cuda

from tessera_tile import sim

pytestmark = pytest.mark.sim_only(reason="the simulator's own errors, notes and switches")
FULL = 0xFFFFFFFF


@cuda.jit
def full_mask_shuffle(x):
    i = cuda.threadIdx.x
    x[i] = cuda.shfl_down_sync(FULL, x[i], 1)


def test_a_read_from_a_lane_that_does_not_exist_is_poison_and_noted():
    # PTX: shfl.sync waits for the non-exited lanes of the mask; lanes 8-31 of the second warp
    # do not exist, so lane 7's read from lane 8 is undefined: NaN, and a note in the profile.
    x = np.arange(40, dtype=np.float32)
    with sim.profile() as prof:
        full_mask_shuffle[1, 40](x)
    np.testing.assert_array_equal(x[:31], np.arange(1, 32))  # lane 31 reads itself (clamped)
    np.testing.assert_array_equal(x[32:39], np.arange(33, 40))
    assert np.isnan(x[39])
    source, first = inspect.getsourcelines(full_mask_shuffle.py_func)
    line = first + next(k for k, t in enumerate(source) if "shfl_down_sync" in t)
    assert prof.undefined_shuffle_reads == {f"shfl_down_sync at test_sim_diagnostics.py:{line}": 1}
    assert "undefined shuffle reads: 1" in str(prof)


def test_int_poison_is_the_minimum():
    x = np.arange(40, dtype=np.int32)
    full_mask_shuffle[1, 40](x)  # no profile: the poison alone
    assert x[39] == np.iinfo(np.int32).min and x[38] == 39


def test_strict_masks_refuse_lanes_that_do_not_exist():
    with sim.strict_masks(), pytest.raises(sim.SimulationError, match=r"lanes 8-31 that do not"):
        full_mask_shuffle[1, 40](np.zeros(40, np.float32))
    full_mask_shuffle[1, 40](np.zeros(40, np.float32))  # the switch is scoped


@cuda.jit
def early_exit_shuffle(x):
    i = cuda.threadIdx.x
    if i == 5 or i == 6:
        return
    x[i] = cuda.shfl_xor_sync(FULL, x[i], 1)


def test_a_read_from_an_exited_lane_is_poison_and_noted():
    x = np.arange(32, dtype=np.float64)
    with sim.profile() as prof:
        early_exit_shuffle[1, 32](x)
    partners = np.arange(32) ^ 1
    np.testing.assert_array_equal(np.delete(x, [4, 5, 6, 7]), np.delete(partners, [4, 5, 6, 7]))
    assert np.isnan(x[4]) and np.isnan(x[7])  # their partners 5 and 6 exited
    assert x[5] == 5 and x[6] == 6  # untouched
    assert sum(prof.undefined_shuffle_reads.values()) == 2


def test_strict_masks_refuse_exited_lanes():
    with sim.strict_masks(), pytest.raises(sim.SimulationError, match=r"lanes 5-6 that exited"):
        early_exit_shuffle[1, 32](np.zeros(32, np.float32))


@cuda.jit
def divergent_deadlock(x):
    i = cuda.threadIdx.x
    if i < 16:
        x[i] = cuda.shfl_sync(FULL, x[i], 0)
    else:
        cuda.syncthreads()


def test_divergent_deadlock_names_lanes_and_lines():
    with pytest.raises(sim.SimulationError, match="deadlock") as err:
        divergent_deadlock[1, 32](np.zeros(32, np.float32))
    msg = str(err.value)
    assert "lanes 0-15 wait in shfl_sync" in msg and "lanes 16-31 wait in syncthreads" in msg
    source, first = inspect.getsourcelines(divergent_deadlock.py_func)
    shfl_line = first + next(k for k, t in enumerate(source) if "shfl_sync" in t)
    sync_line = first + next(k for k, t in enumerate(source) if "syncthreads" in t)
    assert f"shfl_sync at test_sim_diagnostics.py:{shfl_line}" in msg
    assert f"syncthreads at test_sim_diagnostics.py:{sync_line}" in msg


@cuda.jit
def mask_without_self(x):
    i = cuda.threadIdx.x
    x[i] = cuda.shfl_sync(0x1, x[i], 0)


def test_mask_that_excludes_the_caller():
    with pytest.raises(sim.SimulationError, match="excludes itself"):
        mask_without_self[1, 2](np.zeros(2, np.float32))


def test_exceptions_name_the_thread():
    with pytest.raises(IndexError) as err:
        full_mask_shuffle[1, 32](np.zeros(8, np.float32))
    assert "in simulated thread threadIdx=(8, 0, 0)" in "".join(err.value.__notes__)


@cuda.jit
def two_arrays_on_one_line(out):
    a, b = cuda.shared.array(4, np.int32), cuda.shared.array(4, np.int32)
    i = cuda.threadIdx.x
    a[i] = i
    b[i] = 10 * i
    cuda.syncthreads()
    out[i] = a[i] + b[i]


def test_shared_arrays_on_one_line_do_not_alias():
    out = np.zeros(4, np.int32)
    two_arrays_on_one_line[1, 4](out)
    np.testing.assert_array_equal(out, 11 * np.arange(4))


def test_install_is_idempotent_and_automatic():
    assert sim.installed()
    sim.install()
    sim.install()
    assert sim.installed()


@cuda.jit(device=True)
def stash(value):
    slot = cuda.shared.array(1, np.int32)
    old = slot[0]
    cuda.syncthreads()
    if cuda.threadIdx.x == 0:
        slot[0] = value
    cuda.syncthreads()
    return old


@cuda.jit
def stash_twice(out):
    stash(7)
    out[cuda.threadIdx.x] = stash(9)


def test_a_device_function_called_twice_gets_the_same_shared_array():
    out = np.zeros(4, np.int32)
    stash_twice[1, 4](out)
    np.testing.assert_array_equal(out, 7)  # the second call sees what the first one stored
