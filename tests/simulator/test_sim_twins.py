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


# The fast-math instructions' twins give the worst result the PTX ISA allows (9.1, "Floating
# Point Instructions"): ex2.approx.f32 within 2 ulp of the correctly rounded result,
# rcp.approx.f32 within 1 ulp, rsqrt.approx.f32 within a relative 2**-22.9.
def _fast_twin(name: str):
    return sim.twins()[f"tessera_tile._device.numerics.{name}"][1]


def _ulps(got, exact):
    return np.abs(got.astype(np.float64) - exact) / np.spacing(np.abs(exact).astype(np.float32))


@pytest.mark.sim_only("the twins themselves: on a GPU the instructions run")
def test_fast_math_twins_err_as_far_as_the_ptx_isa_allows():
    rng = np.random.default_rng(17)
    ys = np.concatenate([np.linspace(-120, 120, 2001), rng.uniform(-20, 20, 2000)])
    ys = ys.astype(np.float32)
    ex2 = np.array([_fast_twin("exp2_approx")(y) for y in ys])
    err = _ulps(ex2, np.exp2(ys.astype(np.float64)))
    assert err.max() <= 2.0 and np.mean(err > 1.0) > 0.5  # most at the bound, none past it
    xs = np.concatenate([rng.uniform(-1e3, 1e3, 2000), np.geomspace(1e-30, 1e30, 2000)])
    xs = xs[xs != 0].astype(np.float32)
    rcp = np.array([_fast_twin("rcp_approx")(x) for x in xs])
    err = _ulps(rcp, 1 / xs.astype(np.float64))
    assert err.max() <= 1.0 and np.mean(err > 0.5) > 0.5
    pos = np.abs(xs)
    rsq = np.array([_fast_twin("rsqrt_approx")(x) for x in pos])
    exact = 1 / np.sqrt(pos.astype(np.float64))
    rel = np.abs(rsq - exact) / exact
    assert rel.max() <= 2.0**-22.9 and np.mean(rel > 2.0**-24) > 0.5
    # deterministic: the same argument, the same result
    again = np.array([_fast_twin("exp2_approx")(y) for y in ys])
    np.testing.assert_array_equal(again, ex2)


@pytest.mark.sim_only("the twins themselves: on a GPU the instructions run")
def test_fast_math_twins_follow_the_special_values_of_the_ptx_isa():
    ex2, rcp = _fast_twin("exp2_approx"), _fast_twin("rcp_approx")
    rsqrt = _fast_twin("rsqrt_approx")
    f = np.float32
    # ex2: -inf -> +0, +-0 -> 1 (exactly), +inf -> +inf, NaN -> NaN; .ftz: subnormals as 0
    assert [ex2(f(v)) for v in (-np.inf, 0.0, -0.0, np.inf, 1e-40)] == [0, 1, 1, np.inf, 1]
    assert np.isnan(ex2(f(np.nan)))
    # rcp: -inf -> -0, -0 -> -inf, +0 -> +inf, +inf -> +0
    got = [rcp(f(v)) for v in (-np.inf, -0.0, 0.0, np.inf)]
    assert got == [0, -np.inf, np.inf, 0] and np.signbit(got[0]) and not np.signbit(got[3])
    # rsqrt: negatives and NaN -> NaN, -0 -> -inf, +0 -> +inf, +inf -> +0
    assert [rsqrt(f(v)) for v in (-0.0, 0.0, np.inf)] == [-np.inf, np.inf, 0]
    assert np.isnan(rsqrt(f(-1.0))) and np.isnan(rsqrt(f(np.nan)))
