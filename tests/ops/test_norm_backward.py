"""Layer norm's and RMS norm's backward (``tt.vjp(ops.layer_norm, ...)``): the hand-written
kernels of tessera_tile.kernels.norm_backward against the analytic gradients in float64 NumPy.

Reference, with xhat the normalised x, rstd = 1 / sqrt(var + eps) (RMS: mean(x**2) + eps) and
g = dy * weight (PyTorch's formulas for both norms):

    dx = rstd * (g - mean(g) - xhat * mean(g * xhat))    (RMS norm: no mean(g))
    dweight = sum over rows of dy * xhat,  dbias = sum over rows of dy

Tolerances per dtype, per element, against the largest reference magnitude of each result:
float64 1e-12, float32 2e-6 (float32 sums over a row and over the rows), float16 2e-3 (computed
in float32 and rounded once: half an ulp is 4.9e-4 of a value).
"""

import ml_dtypes
import numpy as np
import pytest
from helpers import assert_close_rounded, back, on

import tessera_tile as tt
from tessera_tile import ops, sim

TOL = {np.dtype(np.float64): 1e-12, np.dtype(np.float32): 2e-6, np.dtype(np.float16): 2e-3}
EPS = {"layer": 1e-5, "rms": 1e-6}


def reference(kind, x, w, dy):
    """dx, dweight, dbias in float64 (NumPy's NaN and infinities: errors ignored)."""
    x, dy = x.astype(np.float64), dy.astype(np.float64)
    n = x.shape[-1]
    with np.errstate(all="ignore"):
        if kind == "layer":
            rstd = 1 / np.sqrt(x.var(-1, keepdims=True) + EPS[kind])
            h = (x - x.mean(-1, keepdims=True)) * rstd
        else:
            rstd = 1 / np.sqrt((x * x).mean(-1, keepdims=True) + EPS[kind])
            h = x * rstd
        g = dy if w is None else dy * w.astype(np.float64)
        centre = g.mean(-1, keepdims=True) if kind == "layer" else 0
        dx = rstd * (g - centre - h * (g * h).mean(-1, keepdims=True))
        return dx, (dy * h).reshape(-1, n).sum(0), dy.reshape(-1, n).sum(0)


def gradients(kind, x, w, b, dy, side):
    """The op's gradients on ``side`` (NumPy results) and the pullback's plan."""
    op, args = (ops.layer_norm, (x, w, b)) if kind == "layer" else (ops.rms_norm, (x, w))
    _, pullback = tt.vjp(op, *on(side, *args))
    (cot,) = on(side, dy)
    got = pullback(cot)
    return [None if g is None else back(g, side) for g in got], pullback.explain(cot)


def check(kind, x, w, b, dy, side):
    got, report = gradients(kind, x, w, b, dy, side)
    want = reference(kind, x, w, dy)
    tol = TOL[x.dtype]
    for g, ref, present in zip(got, want, (True, w is not None, b is not None), strict=False):
        if not present:
            assert g is None
            continue
        assert g.shape == ref.shape and g.dtype == x.dtype
        scale = np.max(np.abs(ref[np.isfinite(ref)]), initial=0.0)
        assert_close_rounded(g, ref, rtol=tol, atol=tol * scale)
    return report


def data(shape, dtype, seed=0, scale=1.0, dy_scale=1.0, strided=False):
    rng = np.random.default_rng(seed)
    n = shape[-1]
    full = (*shape[:-1], 2 * n) if strided else shape
    x = (rng.standard_normal(full) * scale + scale / 2).astype(dtype)
    x = x[..., ::2] if strided else x
    w = rng.standard_normal(n).astype(dtype)
    b = rng.standard_normal(n).astype(dtype)
    dy = (rng.standard_normal(shape) * dy_scale).astype(dtype)
    return x, w, b, dy


# (kind, dtype, shape, weight, bias): rows that straddle the 16-byte width and the threads,
# more rows than the simulator's grid (its blocks loop over rows), float16 at 16 elements a
# thread, rows of no multiple of 16 bytes (50 float32, 99 float64: loads of one element)
CASES = [
    ("layer", np.float32, (3, 5, 96), True, True),
    ("layer", np.float32, (20, 50), True, False),
    ("layer", np.float32, (6, 130), False, True),
    ("layer", np.float16, (7, 4096), True, True),
    ("layer", np.float64, (5, 99), True, True),
    ("rms", np.float32, (20, 768), True, False),
    ("rms", np.float32, (4, 37), False, False),
    ("rms", np.float16, (5, 1000), True, False),
    ("rms", np.float64, (3, 256), True, False),
    ("rms", np.float32, (2, 8192), True, False),  # a group of 1,024 threads
    ("layer", np.float32, (3, 8192), True, True),  # the same, its weight read for each row
]


@pytest.mark.parametrize("kind, dtype, shape, with_w, with_b", CASES)
def test_gradients_match_the_analytic_formulas(kind, dtype, shape, with_w, with_b, side):
    x, w, b, dy = data(shape, dtype, seed=len(shape) + shape[-1])
    report = check(kind, x, w if with_w else None, b if with_b else None, dy, side)
    assert report.kernels == (2 if with_w or with_b else 1), report
    assert "hand-written" in report.stages[0]


@pytest.mark.parametrize("kind", ["layer", "rms"])
@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_magnitudes_across_the_dtypes_range(kind, dtype):
    """x from 1e-3 to 1e3 (float16: 1e-2 to 1e2, its normal range squared stays finite in
    float32) and cotangents from 1e-3 to 1e2."""
    low, high = (-2, 2) if dtype == np.float16 else (-3, 3)
    for i, e in enumerate(range(low, high + 1)):
        x, w, b, dy = data((6, 64), dtype, seed=i, scale=10.0**e, dy_scale=10.0 ** (i % 6 - 3))
        check(kind, x, w, b if kind == "layer" else None, dy, "host")


def test_strided_rows_and_device_views(side):
    x, w, b, dy = data((6, 64), np.float32, seed=3, strided=True)
    if side == "device":  # a strided view of a device array, not a copy
        full = tt.to_device(np.ascontiguousarray(np.repeat(x, 2, axis=-1)))
        from tessera_tile._runtime import arrays

        xd = arrays.view(full, x.shape, (full.strides[0], 2 * full.strides[1]))
        _, pullback = tt.vjp(ops.layer_norm, xd, *on(side, w, b))
        got = [back(g, side) for g in pullback(on(side, dy)[0])]
    else:
        got, _ = gradients("layer", x, w, b, dy, side)
    for g, ref in zip(got, reference("layer", x, w, dy), strict=True):
        np.testing.assert_allclose(g, ref, rtol=2e-6, atol=2e-6 * np.abs(ref).max())


@pytest.mark.parametrize("kind", ["layer", "rms"])
def test_nan_and_infinities_as_the_formulas_give_them(kind):
    """A NaN or an infinity in x makes its row's dx NaN and every dweight NaN (its xhat is
    NaN), dbias unaffected; an infinity in dy makes its row of dx non-finite as the formula's
    float64 evaluation does."""
    x, w, b, dy = data((5, 40), np.float32, seed=11)
    x[1, 3], x[3, 0], dy[2, 7] = np.nan, np.inf, -np.inf
    check(kind, x, w, b if kind == "layer" else None, dy, "host")


def test_inputs_are_not_modified_and_results_are_deterministic():
    x, w, b, dy = data((24, 96), np.float32, seed=5)
    saved = [a.copy() for a in (x, w, b, dy)]
    first, _ = gradients("layer", x, w, b, dy, "host")
    again, _ = gradients("layer", x, w, b, dy, "host")
    for a, s in zip((x, w, b, dy), saved, strict=True):
        np.testing.assert_array_equal(a, s)
    for f, g in zip(first, again, strict=True):
        assert f.tobytes() == g.tobytes()  # the partials are folded in one order


@pytest.mark.sim_only(reason="the profiler measures traffic in the simulator only")
@pytest.mark.parametrize(("kind", "n"), [("layer", 256), ("rms", 256), ("layer", 8192)])
def test_traffic_is_the_plan_and_the_plan_is_the_minimum(kind, n):
    """x and dy read once, dx written once, the weight once by each group of threads (8 groups
    of 32 a block at 256 columns; at 8,192 one group of 1,024, which reads it for each row),
    the blocks' partials written and read once (float32, one row of n per block and
    gradient), the gradients of the parameters written once."""
    rows = 20 if n == 256 else 3
    x, w, b, dy = data((rows, n), np.float32, seed=2)
    params = (w, b) if kind == "layer" else (w,)
    op = ops.layer_norm if kind == "layer" else ops.rms_norm
    _, pullback = tt.vjp(op, *on("device", x, *params))
    (cot,) = on("device", dy)
    report = pullback.explain(cot)
    blocks = int(report.stages[0].split(" block(s)")[0].rsplit(" ", 1)[1])
    groups = 8 * blocks if n == 256 else rows  # weight reads
    assert blocks * 8 < rows if n == 256 else blocks < rows  # blocks loop over rows
    minimum = 3 * x.nbytes + groups * w.nbytes + 2 * len(params) * blocks * n * 4
    minimum += sum(p.nbytes for p in params)
    assert report.bytes_fused == minimum
    with sim.profile() as prof:
        pullback(cot)
    assert prof.bytes_read + prof.bytes_written == minimum
    assert prof.races == [] and prof.out_of_bounds == []
    print(
        f"{kind} norm backward {rows} x {n} float32: {minimum} B in {blocks} blocks, "
        f"{minimum / (3 * x.nbytes):.3f}x x, dy and dx; {report.reasons[1]}"
    )


def test_other_cotangents_and_dtypes_take_the_composers_backward():
    """A cotangent of another dtype, bfloat16 and rows past a block's registers are
    differentiated by the composer (same results, more kernels)."""
    x, w, b, dy = data((4, 40), np.float32, seed=9)
    _, pullback = tt.vjp(ops.layer_norm, x, w, b)
    assert "recomputes" in " ".join(pullback.explain(dy.astype(np.float64)).reasons)
    got = pullback(dy.astype(np.float64))
    for g, ref in zip(got, reference("layer", x, w, dy), strict=True):
        np.testing.assert_allclose(g, ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())
    bf16 = [a.astype(ml_dtypes.bfloat16) for a in (x, w, b, dy)]
    _, pullback = tt.vjp(ops.layer_norm, *bf16[:3])
    assert "hand-written" not in " ".join(pullback.explain(bf16[3]).stages)
    for g, ref in zip(
        pullback(bf16[3]), reference("layer", bf16[0], bf16[1], bf16[3]), strict=False
    ):
        assert g.dtype == ml_dtypes.bfloat16  # rounded once: half an ulp is 3.9e-3
        assert_close_rounded(g, ref, rtol=1e-2, atol=1e-2 * np.abs(ref).max())
    long = np.zeros((1, 8200), np.float32)
    _, pullback = tt.vjp(ops.rms_norm, long + 1)
    assert "hand-written" not in " ".join(pullback.explain(long).stages)
    # past 4,096 single-element accesses (rows of no multiple of 16 bytes) would spill
    odd = np.zeros((1, 4099), np.float32)
    _, pullback = tt.vjp(ops.layer_norm, odd + 1)
    assert "hand-written" not in " ".join(pullback.explain(odd).stages)
