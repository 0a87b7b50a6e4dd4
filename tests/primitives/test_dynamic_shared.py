"""Dynamic shared memory beyond 48 KiB: the opt-in launch works, and the simulator refuses what
a GPU refuses (static arrays over 48 KiB, dynamic memory over 48 KiB without the opt-in,
either over the architecture's limit)."""

import numpy as np
import pytest
from dynamic_shared_kernels import CARVED_BYTES, carved_tiles
from helpers import SIMULATED
from numba import cuda, float32

from tessera_tile import dynamic_shared, sim

KIB = 1024
REFUSAL = "the simulator's own error type; a GPU refuses the same launch with a CUDA error"


@cuda.jit
def reverse_through_shared(x, out):
    """Stages all of ``x`` in the launch's dynamic shared memory, then writes it reversed: the
    whole dynamic region is used, so a short allocation would read garbage."""
    smem = cuda.shared.array(0, float32)
    n = x.size
    for i in range(cuda.threadIdx.x, n, cuda.blockDim.x):
        smem[i] = x[i]
    cuda.syncthreads()
    for i in range(cuda.threadIdx.x, n, cuda.blockDim.x):
        out[i] = smem[n - 1 - i]


@cuda.jit
def static_too_large(out):
    big = cuda.shared.array(12289, float32)  # 48 KiB + 4 B
    big[0] = 1.0
    out[0] = big[0]


@cuda.jit
def static_and_dynamic(out):
    fixed = cuda.shared.array(10240, float32)  # 40 KiB static
    dyn = cuda.shared.array(0, float32)
    fixed[0] = 2.0
    dyn[0] = fixed[0]
    out[0] = dyn[0]


def _reverse(nbytes: int, side: str):
    x = np.arange(nbytes // 4, dtype=np.float32)
    out = np.zeros_like(x)
    args = (x, out) if side == "host" else (cuda.to_device(x), cuda.to_device(out))
    dynamic_shared.launch(reverse_through_shared, 1, 64, nbytes, args)
    got = out if side == "host" else args[1].copy_to_host()
    return x, got


@pytest.mark.parametrize("nbytes", [16 * KIB, 96 * KIB, 160 * KIB])
def test_dynamic_shared_over_48_kib_launches(nbytes, side):
    x, got = _reverse(nbytes, side)
    np.testing.assert_array_equal(got, x[::-1])


@pytest.mark.sim_only(reason=REFUSAL)
def test_dynamic_over_48_kib_without_opt_in_is_refused():
    kernel = cuda.jit(reverse_through_shared.py_func)  # a kernel nothing opted in
    x = np.zeros(16 * KIB, np.float32)
    with pytest.raises(sim.SharedMemoryError, match="without an opt-in"):
        kernel[1, 32, 0, 64 * KIB](x, np.zeros_like(x))
    kernel[1, 32, 0, 48 * KIB](x[: 12 * KIB], np.zeros(12 * KIB, np.float32))  # 48 KiB: fine


@pytest.mark.sim_only(reason=REFUSAL)
def test_static_shared_over_48_kib_is_refused():
    with pytest.raises(sim.SharedMemoryError, match="too much shared data"):
        static_too_large[1, 1](np.zeros(1, np.float32))


@pytest.mark.sim_only(reason=REFUSAL)
def test_static_and_dynamic_together_need_the_opt_in():
    kernel = cuda.jit(static_and_dynamic.py_func)
    out = np.zeros(1, np.float32)
    kernel[1, 1, 0, 8 * KIB](out)  # 40 + 8 KiB: within 48 KiB
    assert out[0] == 2.0
    with pytest.raises(sim.SharedMemoryError, match="need an opt-in"):
        kernel[1, 1, 0, 8 * KIB + 4](out)
    dynamic_shared.launch(kernel, 1, 1, 16 * KIB, (out,))
    assert out[0] == 2.0


@pytest.mark.sim_only(reason=REFUSAL)
@pytest.mark.parametrize(("arch", "limit_kib"), [("sm_80", 163), ("sm_86", 99), ("sm_90", 227)])
def test_opt_in_over_the_architecture_limit_is_refused(arch, limit_kib):
    kernel = cuda.jit(reverse_through_shared.py_func)
    with sim.simulated_arch(arch):
        assert dynamic_shared.limit() == limit_kib * KIB
        x = np.arange(limit_kib * KIB // 4, dtype=np.float32)
        out = np.zeros_like(x)
        dynamic_shared.launch(kernel, 1, 64, limit_kib * KIB, (x, out))
        np.testing.assert_array_equal(out, x[::-1])
        with pytest.raises(sim.SharedMemoryError, match=f"{arch} allows a block at most"):
            dynamic_shared.launch(kernel, 1, 64, limit_kib * KIB + 16, (x, out))


@pytest.mark.sim_only(reason=REFUSAL)
def test_static_plus_opt_in_over_the_architecture_limit_is_refused():
    kernel = cuda.jit(static_and_dynamic.py_func)
    with sim.simulated_arch("sm_86"):
        dynamic_shared.launch(kernel, 1, 1, 99 * KIB - 40 * KIB, (np.zeros(1, np.float32),))
        kernel = cuda.jit(static_and_dynamic.py_func)
        with pytest.raises(sim.SharedMemoryError, match="pass sm_86's"):
            dynamic_shared.launch(kernel, 1, 1, 60 * KIB, (np.zeros(1, np.float32),))


def test_limits_table():
    assert dynamic_shared.limit("sm_80") == 163 * KIB
    assert dynamic_shared.limit("sm_89") == 99 * KIB
    assert dynamic_shared.limit("sm_90") == 227 * KIB
    with pytest.raises(ValueError, match="unknown architecture 'sm_75'"):
        dynamic_shared.limit("sm_75")


def test_kept_launch_opts_in_where_the_device_refuses(side):
    """A kept launch does not type its arguments; on a kernel that has not opted in (as on
    another device) the refusal makes it opt in and launch again."""
    kernel = cuda.jit(reverse_through_shared.py_func)  # never opted in
    x = np.arange(16 * KIB, dtype=np.float32)
    out = np.zeros_like(x)
    args = (x, out) if side == "host" else (cuda.to_device(x), cuda.to_device(out))
    dynamic_shared.launch_kept(kernel, 1, 64, 64 * KIB, args)
    got = out if side == "host" else args[1].copy_to_host()
    np.testing.assert_array_equal(got, x[::-1])


def test_carved_tiles_share_the_dynamic_memory(side):
    x = np.arange(96 * 32, dtype=np.float32).reshape(96, 32)
    out = np.zeros((32, 32), np.float32)
    args = (x, out) if side == "host" else (cuda.to_device(x), cuda.to_device(out))
    dynamic_shared.launch(carved_tiles, 1, 32, CARVED_BYTES, args)
    got = out if side == "host" else args[1].copy_to_host()
    np.testing.assert_array_equal(got, (x[:32] + x[64:]).T)


@pytest.mark.sim_only(reason="the twin's own check; a GPU reads and writes past the array")
def test_a_carve_past_the_end_is_refused():
    x = np.zeros((96, 32), np.float32)
    out = np.zeros((32, 32), np.float32)
    with pytest.raises(sim.SimulationError, match="leaves the"):
        dynamic_shared.launch(carved_tiles, 1, 32, 64 * 65 * 4, (x, out))


@pytest.mark.sim_only(reason=REFUSAL)
def test_an_opt_in_holds_for_the_argument_types_it_was_made_for():
    """A GPU compiles one kernel per argument types and keeps the opt-in on that kernel: a
    launch on other types (here a strided view: layout "A") needs its own opt-in."""
    kernel = cuda.jit(reverse_through_shared.py_func)
    x = np.arange(2 * 16 * KIB, dtype=np.float32)
    dx, out = cuda.to_device(x), cuda.to_device(np.zeros(16 * KIB, np.float32))
    dynamic_shared.opt_in(kernel, (dx[: 16 * KIB], out), 64 * KIB)
    kernel[1, 64, 0, 64 * KIB](dx[: 16 * KIB], out)  # the types it opted in for
    with pytest.raises(sim.SharedMemoryError, match="without an opt-in"):
        kernel[1, 64, 0, 64 * KIB](dx[::2], out)
    dynamic_shared.launch(kernel, 1, 64, 64 * KIB, (dx[::2], out))
    np.testing.assert_array_equal(out.copy_to_host(), x[::2][::-1])


@pytest.mark.parametrize(
    ("nbytes", "error"), [(-16, ValueError), (1.5, TypeError), (True, TypeError)]
)
def test_bad_sizes_are_refused_before_any_launch(nbytes, error):
    out = np.zeros(1, np.float32)
    with pytest.raises(error, match="nbytes"):
        dynamic_shared.launch(static_and_dynamic, 1, 1, nbytes, (out,))
    assert out[0] == 0.0  # nothing ran


def test_planning_for_an_unknown_architecture_is_refused():
    """Plans made for an architecture (offline inspect) name a known one; a typo would
    otherwise plan the wrong kernels without a word."""
    with pytest.raises(ValueError, match="known"), dynamic_shared.planning_for("sm90a"):
        pass
    with dynamic_shared.planning_for("sm_90a"):
        assert dynamic_shared.wgmma()
    with dynamic_shared.planning_for("sm_80"):
        assert not dynamic_shared.wgmma()
        with dynamic_shared.planning_for(None):  # None: as planned around it
            assert not dynamic_shared.wgmma()


def test_one_target_answers_every_question():
    """The architecture, whether warpgroup MMA runs and the shared-memory limit are one
    record's: the simulator's default device is an sm_80 (the mma.sync kernels); told to stand
    for an sm_90 it has the warpgroup MMA and the sm_90 limit; plans made for an architecture
    see that one; on a GPU, the GPU's."""
    from tessera_tile._runtime import target

    def answers():
        return dynamic_shared.arch(), dynamic_shared.wgmma(), dynamic_shared.limit()

    here = target.current()
    assert answers() == (here.name, here.wgmma, here.block_shared)
    if SIMULATED:
        assert answers() == ("sm_80", False, 163 * KIB)
        with sim.simulated_arch("sm_90"):
            assert answers() == ("sm_90", True, 227 * KIB)
            with dynamic_shared.planning_for("sm_86"):
                assert answers() == ("sm_86", False, 99 * KIB)
                assert target.simulated().name == "sm_90"  # what the simulator enforces
    for name in ("sm_90", "sm_90a"):
        with dynamic_shared.planning_for(name):
            assert answers() == (name, True, 227 * KIB)
