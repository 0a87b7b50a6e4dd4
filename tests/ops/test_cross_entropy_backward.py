"""Cross-entropy's backward (``tt.vjp(ops.cross_entropy, ...)``) against PyTorch's formula in
float64 NumPy: ``(softmax(row) - onehot(target)) * scale``, scale the row's cotangent
(``"none"``), the loss's (``"sum"``) or the loss's over the rows counted (``"mean"``), and 0
for an ignored row.

Tolerances per element, per dtype: ``rtol`` times the largest reference magnitude, plus, for
float32, the rounding of a row's log-sum-exp (two ulps of the largest logit, times the scale),
which any float32 log-softmax has: float64 1e-12, float32 4e-6 (ex2.approx), float16 2e-3 and
bfloat16 1e-2 (computed in float32, rounded once: half an ulp is 4.9e-4 and 3.9e-3).
"""

import ml_dtypes
import numpy as np
import pytest
from helpers import assert_close_rounded, back, on

import tessera_tile as tt
from tessera_tile import ops, sim

BF16 = np.dtype(ml_dtypes.bfloat16)
RTOL = {np.dtype(np.float64): 1e-12, np.dtype(np.float32): 4e-6, np.dtype(np.float16): 2e-3}
RTOL[BF16] = 1e-2


def reference(x, t, g, reduction, ignore_index=-100):
    x = x.astype(np.float64)
    n, c = x.shape
    with np.errstate(all="ignore"):
        e = np.exp(x - x.max(axis=1, keepdims=True))
        p = e / e.sum(axis=1, keepdims=True)
    counted = t != ignore_index
    onehot = np.zeros_like(p)
    onehot[np.flatnonzero(counted), t[counted]] = 1
    d = np.where(counted[:, None], p - onehot, 0.0)
    g = np.asarray(g, np.float64)
    if reduction == "none":
        return d * g[:, None]
    return d * g / (counted.sum() if reduction == "mean" else 1)


def gradient(x, t, g, reduction, side, ignore_index=-100, **options):
    xs, ts = on(side, x, t)
    gs = on(side, g)[0] if reduction == "none" else g
    loss, pullback = tt.vjp(
        ops.cross_entropy, xs, ts, reduction=reduction, ignore_index=ignore_index, **options
    )
    want = ops.cross_entropy(x, t, reduction=reduction, ignore_index=ignore_index)
    np.testing.assert_array_equal(np.asarray(back(loss, side)), want)  # the forward's result
    dx, dt = pullback(gs)
    assert dt is None  # integer targets
    return back(dx, side), pullback.explain(gs)


def check(x, t, g, reduction, side, ignore_index=-100, **options):
    got, report = gradient(x, t, g, reduction, side, ignore_index, **options)
    want = reference(x, t, g, reduction, ignore_index)
    assert got.shape == x.shape and got.dtype == x.dtype
    scale = np.max(np.abs(want[np.isfinite(want)]), initial=0.0)
    atol = RTOL[x.dtype] * scale
    if x.dtype == np.float32:
        finite = np.abs(x[np.isfinite(x)].astype(np.float64))
        atol += 2 * 2.0**-23 * np.max(finite, initial=0.0) * np.max(np.abs(g))
    assert_close_rounded(got, want, rtol=RTOL[x.dtype], atol=atol)
    return report


def data(n, c, dtype, seed, scale=3.0, ignored=(), target_dtype=np.int64):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((n, c)) * scale).astype(dtype)
    t = rng.integers(0, c, n).astype(target_dtype)
    t[list(ignored)] = -100
    return x, t, rng


# (dtype, rows, columns, reduction, target dtype): rows of 16-byte chunks and a tail, one
# reduction each per dtype (no cross product), int32 and int64 targets
CASES = [
    (np.float32, 9, 70, "none", np.int64),
    (np.float32, 6, 64, "mean", np.int32),
    (np.float16, 5, 72, "sum", np.int64),
    (np.float16, 7, 40, "none", np.int32),
    (np.float64, 4, 33, "mean", np.int64),
    (BF16, 6, 48, "none", np.int64),
    (BF16, 5, 24, "mean", np.int32),
]


@pytest.mark.parametrize("dtype, n, c, reduction, target_dtype", CASES)
def test_gradients_match_pytorchs_formula(dtype, n, c, reduction, target_dtype, side):
    x, t, rng = data(n, c, dtype, seed=n * c, ignored=(1,), target_dtype=target_dtype)
    g = rng.standard_normal(n).astype(dtype) if reduction == "none" else 0.75
    report = check(x, t, g, reduction, side)
    # the row kernel; before it the mean's scale, and a bfloat16 cotangent's cast to float32
    extra = (reduction == "mean") + (reduction == "none" and np.dtype(dtype) == BF16)
    assert report.kernels == 1 + extra, report
    assert "hand-written" in report.stages[0]


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_magnitudes_across_the_dtypes_range(dtype):
    """Logits from 1e-3 to 1e3 (float16: to 1e2), cotangents from 1e-3 to 1e3."""
    high = 2 if dtype == np.float16 else 3
    for i, e in enumerate(range(-3, high + 1)):
        x, t, rng = data(6, 40, dtype, seed=i, scale=10.0**e)
        g = (rng.standard_normal(6) * 10.0 ** (3 - i)).astype(dtype)
        check(x, t, g, "none", "host")


def test_nan_infinities_and_ignored_rows():
    """A NaN logit, a +inf logit or a row of only -inf makes the row's gradient NaN (PyTorch
    keeps a +inf row finite but at the +inf: documented); an ignored row is 0 whatever its
    logits; a -inf logit has probability 0."""
    x, t, _ = data(6, 40, np.float32, seed=4, ignored=(4,))
    x[0, 5], x[1, 7], x[2], x[3, 9], x[4, 0] = np.nan, np.inf, -np.inf, -np.inf, np.inf
    got, _ = gradient(x, t, 1.0, "sum", "host")
    assert np.isnan(got[:3]).all()
    assert not np.isnan(got[3]).any() and got[3, 9] == 0
    np.testing.assert_array_equal(got[4], 0)
    check(x[3:], t[3:], 1.0, "sum", "host")  # the finite rows, against the reference


def test_a_device_target_outside_the_row_gives_a_nan_row():
    x, t, _ = data(4, 16, np.float32, seed=5)
    t[2] = 99  # on the host the op refuses it before launch
    loss, pullback = tt.vjp(ops.cross_entropy, *on("device", x, t), reduction="sum")
    (dx, _) = pullback(1.0)
    dx = back(dx, "device")
    assert np.isnan(dx[2]).all() and np.isfinite(np.delete(dx, 2, axis=0)).all()


def test_a_cotangent_on_the_other_side_is_refused():
    x, t, rng = data(4, 16, np.float32, seed=8)
    _, pullback = tt.vjp(ops.cross_entropy, x, t, reduction="none")
    with pytest.raises((TypeError, ValueError), match="cotangent 0"):
        pullback(on("device", rng.standard_normal(4).astype(np.float32))[0])


def test_grad_of_the_mean_loss_and_inputs_unchanged():
    x, t, _ = data(8, 32, np.float32, seed=6, ignored=(0, 3))
    saved = x.copy(), t.copy()
    got = tt.grad(ops.cross_entropy)(x, t)
    np.testing.assert_allclose(got, reference(x, t, 1.0, "mean"), atol=1e-6)
    np.testing.assert_array_equal(x, saved[0])
    np.testing.assert_array_equal(t, saved[1])


def test_explain_backward_plans_without_running():
    x = np.zeros((4096, 32000), np.float16)
    t = np.zeros(4096, np.int64)
    report = ops.cross_entropy.explain(x, t, reduction="none", backward=True)
    assert report.kernels == 1 and "logits read once" in report.stages[0]
    assert report.bytes_fused < 2.01 * x.nbytes and report.bytes_unfused > 9 * x.nbytes


@pytest.mark.sim_only(reason="the profiler measures traffic in the simulator only")
def test_traffic_is_the_plan():
    """The logits read once and the gradient written once; per row its target, loss, scale
    and x[target]."""
    x, t, rng = data(12, 64, np.float32, seed=7)
    g = rng.standard_normal(12).astype(np.float32)
    loss, pullback = tt.vjp(ops.cross_entropy, *on("device", x, t), reduction="none")
    (gd,) = on("device", g)
    report = pullback.explain(gd)
    with sim.profile() as prof:
        pullback(gd)
    assert prof.bytes_read + prof.bytes_written == report.bytes_fused
    assert report.bytes_fused == 2 * x.nbytes + 12 * (8 + 4 + 4 + 4)
    assert prof.races == [] and prof.out_of_bounds == []


# ---------------------------------------------------------------------------------------------
# gradient_in_forward: the forward's row kernel writes the gradient, the pullback hands it over


@pytest.mark.parametrize(
    ("dtype", "reduction", "g"),
    [(np.float32, "mean", 1.0), (np.float16, "sum", 1.0), (BF16, "mean", 1.0),
     (np.float64, "sum", 1.0), (np.float32, "sum", -2.5)],
    ids=["float32-mean", "float16-sum", "bfloat16-mean", "float64-sum", "float32-scaled"],
)  # fmt: skip
def test_gradient_in_forward_matches_pytorchs_formula(dtype, reduction, g, side):
    """The same reference and tolerances as the backward kernel's; rows of 16-byte chunks and
    a tail, an ignored row; a cotangent other than 1 scales the held gradient."""
    x, t, _ = data(9, 70, dtype, seed=11, ignored=(2,))
    check(x, t, g, reduction, side, gradient_in_forward=True)


def test_gradient_in_forward_nan_infinities_and_ignored_rows():
    """The backward kernel's rules (test_nan_infinities_and_ignored_rows)."""
    x, t, _ = data(6, 40, np.float32, seed=4, ignored=(4,))
    x[0, 5], x[1, 7], x[2], x[3, 9], x[4, 0] = np.nan, np.inf, -np.inf, -np.inf, np.inf
    got, _ = gradient(x, t, 1.0, "mean", "host", gradient_in_forward=True)
    two_pass, _ = gradient(x, t, 1.0, "mean", "host")
    assert np.isnan(got[:3]).all() and got[3, 9] == 0
    np.testing.assert_array_equal(got[4], 0)
    np.testing.assert_allclose(got[3:], two_pass[3:], rtol=4e-6, atol=1e-7)


@pytest.mark.sim_only(reason="the profiler measures traffic in the simulator only")
def test_gradient_in_forward_traffic_and_the_handed_array():
    """The forward's row kernel reads each row twice (the same warp, back to back) and writes
    the gradient once; a pullback for a cotangent of 1 launches nothing and hands over that
    array (on the device: the same array again scaled for another cotangent), any other
    cotangent one elementwise kernel."""
    x, t, _ = data(12, 64, np.float32, seed=7, ignored=(3,))
    xd, td = on("device", x, t)
    with sim.profile() as prof:
        loss, pullback = tt.vjp(
            ops.cross_entropy, xd, td, reduction="sum", gradient_in_forward=True
        )
    row_kernel = {k: rw for (name, k), rw in prof.traffic.items() if "with_gradient" in name}
    assert row_kernel["logits"] == [2 * x.nbytes, 0] and row_kernel["grad"] == [0, x.nbytes]
    assert prof.races == [] and prof.out_of_bounds == []
    with sim.profile() as prof:
        (dx, _) = pullback(1.0)
    assert prof.launches == 0
    want = reference(x, t, 1.0, "sum")
    np.testing.assert_allclose(back(dx, "device"), want, atol=4e-6)
    with sim.profile() as prof:
        (scaled, _) = pullback(3.0)
    assert prof.launches == 1 and prof.bytes_read + prof.bytes_written == 2 * x.nbytes
    np.testing.assert_allclose(back(scaled, "device"), 3 * want, atol=2e-5)
    np.testing.assert_allclose(back(loss, "device"), ops.cross_entropy(x, t, reduction="sum"))


def test_gradient_in_forward_is_checked():
    x, t, _ = data(4, 16, np.float32, seed=1)
    with pytest.raises(ValueError, match="scalar loss"):
        ops.cross_entropy(x, t, reduction="none", gradient_in_forward=True)
    with pytest.raises(TypeError, match="gradient_in_forward must be a bool"):
        ops.cross_entropy(x, t, gradient_in_forward=1)
    report = ops.cross_entropy.explain(x, t, gradient_in_forward=True, backward=True)
    assert report.kernels == 1 and report.bytes_fused == 2 * x.nbytes  # the scaling kernel
    _, pullback = tt.vjp(ops.cross_entropy, x, t, gradient_in_forward=True)
    (dx, _) = pullback(np.array(2.0, np.float32))  # a host call's 0-d cotangent
    np.testing.assert_allclose(dx, reference(x, t, 2.0, "mean"), atol=1e-6)
