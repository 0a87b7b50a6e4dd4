"""Column reductions (over leading axes) with their rows split across blocks, against NumPy.

In the simulator a split takes at least 64 rows (4 unrolled rows x 16 threads per column) and
a launch aims at 4 blocks, so the shapes below straddle one split (63, 64 rows), several
(65, 130, 300), the 16-byte vector (4 float32 or 8 float16/bfloat16 columns: 63, 64, 65 and
odd columns fall back to one column per thread) and the column tile (16 vectors).

Tolerances: max, min, argmax, argmin exact. Sums and means against float64 NumPy on the same
inputs, atol = rtol * (sum of |x| over the column) (/ n for means): rtol 1e-6 for float32 (the
order of the additions differs from NumPy's), and, as the result is rounded once to its dtype,
2^-11 (float16) and 2^-8 (bfloat16) relative to the result on top of that.
"""

import functools
import warnings

import ml_dtypes
import numpy as np
import pytest
from helpers import back, on

import tessera_tile as tt
from tessera_tile import ops, sim

pytestmark = pytest.mark.sim_only(reason="the simulator's grid sizes and measured traffic")
rng = np.random.default_rng(11)
HALF = {np.dtype(np.float16): 2.0**-11, np.dtype(ml_dtypes.bfloat16): 2.0**-8}


def check(got, x, name, axis=0, keepdims=False):
    want = getattr(np, name)(x, axis=axis, keepdims=keepdims)
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, got.shape)
    if name not in ("sum", "mean"):
        np.testing.assert_array_equal(got, want)
        return
    wide = x.astype(np.float64)
    ref = getattr(np, name)(wide, axis=axis, keepdims=keepdims)
    scale = np.abs(wide).sum(axis=axis, keepdims=keepdims)
    if name == "mean":
        scale = scale / max(1, x.shape[axis] if isinstance(axis, int) else 1)
    rel = HALF.get(x.dtype, 0.0)
    err = np.abs(got.astype(np.float64) - ref)
    bound = 1e-6 * scale + rel * np.abs(ref)
    finite = np.isfinite(ref)
    assert np.all(err[finite] <= bound[finite]), np.max(err[finite] - bound[finite])
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))


def measured(call, *args, **kwargs):
    with sim.profile() as prof:
        got = call(*args, **kwargs)
    return got, prof.bytes_read + prof.bytes_written, call.explain(*args, **kwargs)


@pytest.mark.parametrize(
    "shape", [(63, 64), (64, 65), (65, 64), (130, 63), (300, 40), (300, 5), (200, 8)]
)
@pytest.mark.device_only
def test_float32_sums_and_selections_match_numpy_with_predicted_traffic(shape, side):
    x = rng.standard_normal(shape).astype(np.float32)
    for name in ("sum", "mean", "max", "argmin"):
        got, traffic, ex = measured(getattr(ops, name), *on(side, x), axis=0)
        check(back(got, side), x, name)
        assert ex.kernels == 1 and "coalesced column" in ex.stages[0]
        assert traffic == ex.bytes_fused
        minimum = x.nbytes + back(got, side).nbytes
        blocks = int(ex.stages[0].split(" block(s)")[0].rsplit(" ", 1)[1])
        vector = 4 if shape[1] % 4 == 0 else 1
        tiles = -(-shape[1] // vector // (16 if vector > 1 else 32))
        splits = blocks // tiles
        assert splits == max(1, min(-(-4 // tiles), shape[0] // (64 if vector > 1 else 32)))
        # partials (written by every block, read by the last of a tile) and one ticket
        # atomic per block; one split writes its results directly
        width = 4 + 8 * name.startswith("arg")
        extra = 2 * width * splits * shape[1] + 8 * blocks if splits > 1 else 0
        assert ex.bytes_fused == minimum + extra
        assert ("load16(" in ex.source) == (vector > 1)


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16])
@pytest.mark.parametrize("shape", [(130, 64), (70, 24)])
@pytest.mark.device_only
def test_half_column_sums_load_8_columns_and_match_numpy(dtype, shape, side):
    x = rng.standard_normal(shape).astype(dtype)
    for name in ("sum", "mean", "max"):
        got, traffic, ex = measured(getattr(ops, name), *on(side, x), axis=0)
        check(back(got, side), x, name)
        assert traffic == ex.bytes_fused
        assert ("load16(" in ex.source) == (shape[1] % 8 == 0)


def test_argmax_ties_nan_and_infinities_across_splits(side):
    x = rng.standard_normal((300, 16)).astype(np.float32)
    x[:, 0] = 1.0  # ties everywhere: the first index wins
    x[250, 1], x[20, 1] = np.nan, np.nan  # the first NaN, in another split than the last
    x[290, 2] = np.inf
    x[:, 3] = -np.inf
    x[5, 4], x[270, 4] = np.inf, -np.inf  # inf - inf: NaN sum
    x[299, 5] = 7.0  # the maximum in the last row of the last split
    for name in ("argmax", "argmin", "max", "min", "sum", "mean"):
        with np.errstate(invalid="ignore"):
            got = back(getattr(ops, name)(*on(side, x), axis=0), side)
            check(got, x, name)
    first = back(ops.argmax(*on(side, x), axis=0), side)
    again = back(ops.argmax(*on(side, x), axis=0), side)
    np.testing.assert_array_equal(first, again)


def test_strided_views_keepdims_out_and_three_axes(side):
    base = rng.standard_normal((260, 72)).astype(np.float32)
    views = {
        "rows": base[::2],  # 16-byte loads still: every row 16-byte aligned
        "offset": base[:, 1:],  # columns off the 16-byte grid: one column per thread
        "every other column": base[:, ::2],
    }
    for what, x in views.items():
        if side == "device":  # numba copies host arguments whole: a device view of a copy
            from numba import cuda

            full = cuda.to_device(base)
            x = full[::2] if what == "rows" else full[:, 1:] if what == "offset" else full[:, ::2]
            ref = base[::2] if what == "rows" else base[:, 1:] if what == "offset" else base[:, ::2]
        else:
            ref = x
        check(back(ops.sum(x, axis=0), side), ref, "sum")
    x = rng.standard_normal((3, 130, 8)).astype(np.float32)  # two kept axes around the reduced
    check(back(ops.sum(*on(side, x), axis=1), side), x, "sum", axis=1)
    check(back(ops.max(*on(side, x), axis=1, keepdims=True), side), x, "max", 1, True)
    x2 = rng.standard_normal((200, 32)).astype(np.float32)
    out = np.empty(32, np.float32)
    (dev,) = on(side, x2)
    dest = on(side, out)[0] if side == "device" else out
    got = ops.mean(dev, axis=0, out=dest)
    assert got is dest
    check(back(got, side), x2, "mean")


def test_size_zero_axes(side):
    x = np.zeros((0, 8), np.float32)
    np.testing.assert_array_equal(back(ops.sum(*on(side, x), axis=0), side), np.zeros(8))
    with np.errstate(invalid="ignore"):
        assert np.isnan(back(ops.mean(*on(side, x), axis=0), side)).all()
    with pytest.raises(ValueError):
        ops.max(*on(side, x), axis=0)
    assert back(ops.sum(*on(side, np.zeros((70, 0), np.float32)), axis=0), side).shape == (0,)


# --------------------------------------------------------------------------------------------
# var and std: one pass, (shift, mean, M2) partials merged by Chan's formula
#
# Tolerance, relative to the float64 result: a variance passes through at most rows + 48
# roundings (a thread's Welford steps, one per row it folds; the merges of the block's 8 or
# 16 y threads and of at most 4 splits; rcp.approx and the division), each of relative size
# at most u = 2^-24 of the non-negative sum of squared deviations it adds to (deviations are
# taken from a shift, one of the column's elements, so a large mean does not enter); a std
# halves that and adds its square root's rounding. Half results add their one rounding, as
# above. A merge that cancelled (sum of squares minus n mean^2) would miss 1e4 + N(0, 1) by
# about u * 1e8 / 1 = 6 times the variance.

U = 2.0**-24


@functools.cache
def fused(name, ddof, axis=0, keepdims=False):
    """``tt.<name>(x, axis, ddof)``; float16 widened to float32 as the prebuilt ops do."""

    def fn(x):
        half = x.dtype == np.float16
        r = getattr(tt, name)(tt.astype(x, np.float32) if half else x, axis, keepdims, ddof)
        return tt.astype(r, np.float16) if half else r

    fn.__name__ = f"{name}_ddof{ddof}"
    return tt.fuse(fn)


def check_moments(got, x, name, ddof=0, axis=0, keepdims=False):
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        want = getattr(np, name)(x, axis=axis, ddof=ddof, keepdims=keepdims)
        ref = getattr(np, name)(x.astype(np.float64), axis=axis, ddof=ddof, keepdims=keepdims)
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, got.shape)
    chain = (x.shape[axis] + 48) * U
    rel = (chain / 2 + U if name == "std" else chain) + HALF.get(x.dtype, 0.0)
    wide = got.astype(np.float64)
    finite = np.isfinite(ref)
    err, scale = np.abs(wide[finite] - ref[finite]), np.abs(ref[finite])
    assert np.all(err <= rel * scale), np.max(err - rel * scale)  # a constant column: exact 0
    np.testing.assert_array_equal(wide[~finite], ref[~finite])  # inf and NaN where NumPy's
    return np.max(err / np.where(scale > 0, scale, 1.0), initial=0.0)


@pytest.mark.parametrize("shape", [(63, 64), (64, 65), (65, 64), (130, 63), (300, 40)])
def test_float32_var_and_std_one_pass_with_predicted_traffic(shape):
    x = rng.standard_normal(shape).astype(np.float32)
    for fn, name, ddof in ((ops.var, "var", 0), (fused("std", 1), "std", 1)):
        got, traffic, ex = measured(fn, x, axis=0) if ddof == 0 else measured(fn, x)
        check_moments(got, x, name, ddof)
        assert ex.kernels == 1 and "coalesced column" in ex.stages[0]
        assert " 1 pass(es)" in ex.stages[0]
        assert traffic == ex.bytes_fused
        blocks = int(ex.stages[0].split(" block(s)")[0].rsplit(" ", 1)[1])
        vector = 4 if shape[1] % 4 == 0 else 1
        tiles = -(-shape[1] // vector // (16 if vector > 1 else 32))
        splits = blocks // tiles
        assert splits == max(1, min(-(-4 // tiles), shape[0] // (64 if vector > 1 else 32)))
        # three float32 partials per column per split (shift, mean - shift, M2), written by
        # every block and read by the last of a tile, and one ticket atomic per block
        extra = 2 * 12 * splits * shape[1] + 8 * blocks if splits > 1 else 0
        assert ex.bytes_fused == x.nbytes + got.nbytes + extra


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16])
def test_half_var_and_std_accumulate_in_float32_and_round_once(dtype):
    x = (rng.standard_normal((130, 64)) * 100).astype(dtype)  # squares past float16
    got, traffic, ex = measured(ops.var, x, axis=0)
    assert traffic == ex.bytes_fused and " 1 pass(es)" in ex.stages[0]
    assert "load16(" in ex.source
    check_moments(got, x, "var")
    check_moments(fused("std", 1)(x), x, "std", 1)
    y = rng.standard_normal((70, 24)).astype(dtype)
    check_moments(fused("var", 1)(y), y, "var", 1)


def test_large_mean_small_variance_does_not_cancel():
    x = (1e4 + rng.standard_normal((300, 16))).astype(np.float32)
    x[64:, 3] += np.float32(8.0)  # a mean that jumps between splits
    worst = max(
        check_moments(ops.var(x, axis=0), x, "var"),
        check_moments(fused("var", 1)(x), x, "var", 1),
    )
    print(f"1e4 + N(0, 1), float32: worst relative error of var {worst:.2e}")


def test_var_nan_inf_and_ddof_past_the_count():
    x = rng.standard_normal((300, 16)).astype(np.float32)
    x[250, 1], x[20, 2] = np.nan, np.nan  # in the last split; in the first
    x[290, 3] = np.inf
    x[5, 4], x[270, 4] = np.inf, -np.inf
    x[0, 5] = np.inf  # a thread's shift
    x[:, 6] = -np.inf
    x[:, 7] = 2.5  # M2 = 0: NaN where ddof >= n
    check_moments(ops.var(x, axis=0), x, "var")
    for ddof in (299, 300, 400):  # n - ddof = 1, 0 (inf, NaN), negative (as 0)
        check_moments(fused("var", ddof)(x), x, "var", ddof)


def test_var_keepdims_out_three_axes_and_device_arrays(side):
    x = rng.standard_normal((200, 32)).astype(np.float32)
    (dev,) = on(side, x)
    check_moments(back(ops.var(dev, axis=0, keepdims=True), side), x, "var", keepdims=True)
    out = np.empty(32, np.float32)
    dest = on(side, out)[0] if side == "device" else out
    got = ops.std(dev, axis=0, out=dest)
    assert got is dest
    check_moments(back(got, side), x, "std")
    x3 = rng.standard_normal((3, 130, 8)).astype(np.float32)
    check_moments(back(ops.var(*on(side, x3), axis=1), side), x3, "var", axis=1)


def test_var_size_zero_axes():
    with np.errstate(all="ignore"):
        got = ops.var(np.zeros((0, 8), np.float32), axis=0)
        assert got.shape == (8,) and np.isnan(got).all()
        assert np.isnan(ops.std(np.zeros((0, 8), np.float32), axis=0)).all()
    assert ops.var(np.zeros((70, 0), np.float32), axis=0).shape == (0,)


def test_var_epilogue_and_mean_beside_it_stay_one_pass():
    x = rng.standard_normal((130, 32)).astype(np.float32)

    @tt.fuse
    def inv_std(x):
        return tt.sqrt(tt.var(x, axis=0) + 1e-5)

    @tt.fuse
    def both(x):
        return tt.mean(x, axis=0), tt.var(x, axis=0, ddof=1)

    for fn in (inv_std, both):
        ex = fn.explain(x)
        assert ex.kernels == 1 and " 1 pass(es)" in ex.stages[0], ex.stages
    ref = np.sqrt(np.var(x.astype(np.float64), axis=0) + 1e-5)
    np.testing.assert_allclose(inv_std(x), ref, rtol=(130 + 48) * U / 2 + 2 * U)
    mean, var = both(x)
    check(mean, x, "mean")
    check_moments(var, x, "var", 1)
