"""Prebuilt cross-entropy (hand-written kernel) against a float64 NumPy reference.

The reference follows PyTorch's ``cross_entropy``, which computes ``log_softmax`` as
``x - max - log(sum(exp(x - max)))`` with a NaN-propagating max: a NaN logit makes its row's
loss NaN; a +inf logit too (``exp(inf - inf)``); so does a row of only -inf (``-inf - -inf``);
a -inf target among finite logits gives +inf.

Tolerances per logits dtype: rtol 2e-3 (float16: the result is rounded to float16), 2^-7
(bfloat16: rounded once, 8 significant bits, as in test_ops_rows), 1e-5 (float32), 1e-12
(float64), with an absolute part of rtol times the scale of the terms,
max(1, max |finite logit|) (times the number of rows for ``"sum"``); a float16 result past
65,504 is inf. Logits reach magnitude 1e4.
"""

import ml_dtypes
import numpy as np
import pytest
from helpers import SIDES, assert_close_rounded, back, counting_launches, on
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from tessera_tile import ops, sim

RTOL = {np.float16: 2e-3, ml_dtypes.bfloat16: 2**-7, np.float32: 1e-5, np.float64: 1e-12}


@np.errstate(invalid="ignore")  # inf - inf and -inf - -inf are NaN, as in PyTorch
def reference(x, t, reduction, ignore_index=-100):
    x = x.astype(np.float64)
    m = x.max(1, keepdims=True) if x.shape[1] else np.zeros((len(x), 1))
    lse = np.log(np.exp(x - m).sum(1)) + m[:, 0]
    keep = t != ignore_index
    picked = x[np.arange(len(t)), np.where(keep, t, 0)] if x.shape[1] else 0
    loss = np.where(keep, lse - picked, 0.0)
    return {"none": loss, "sum": loss.sum(), "mean": loss.sum() / keep.sum()}[reduction]


def check(got, x, t, reduction, ignore_index=-100):
    want = reference(x, t, reduction, ignore_index)
    assert got.dtype == x.dtype and got.shape == np.shape(want)
    rtol = RTOL[x.dtype.type]
    finite = np.abs(x[np.isfinite(x)].astype(np.float64))
    scale = max(1.0, float(finite.max(initial=0)))
    scale *= len(x) if reduction == "sum" else 1
    assert_close_rounded(got, want, rtol=rtol, atol=rtol * scale)


@given(
    st.sampled_from(list(RTOL)),
    st.sampled_from([1, 2, 5, 9]),
    st.sampled_from([1, 31, 32, 33, 100]),
    st.sampled_from(["none", "mean", "sum"]),
    st.sampled_from([np.int32, np.int64]),
    st.sampled_from(["host", "device"]),
    st.sampled_from([1.0, 1e4]),
    st.integers(0, 2**16),
)
def test_cross_entropy_matches_numpy(dtype, n, c, reduction, tdtype, side, scale, seed):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((n, c)) * scale).astype(dtype)
    t = rng.integers(0, c, n).astype(tdtype)
    t[rng.random(n) < 0.3] = -100
    before = x.copy(), t.copy()
    got = back(ops.cross_entropy(*on(side, x, t), reduction=reduction), side)
    np.testing.assert_array_equal(x, before[0])
    np.testing.assert_array_equal(t, before[1])
    check(got, x, t, reduction)


def test_large_logits_do_not_overflow(side):
    x = np.full((4, 33), 1e4, np.float32)
    x[1] = np.linspace(-1e4, 1e4, 33)
    t = np.array([0, 32, 5, 7])
    got = back(ops.cross_entropy(*on(side, x, t), reduction="none"), side)
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got[0], np.log(33), rtol=1e-6)
    assert got[1] < 1e-3  # the target holds the row's maximum by a wide margin
    check(got, x, t, "none")


def test_ignore_index_and_all_ignored():
    x = np.random.default_rng(3).standard_normal((6, 5)).astype(np.float32)
    t = np.array([1, 7, 2, 7, 7, 0])
    check(ops.cross_entropy(x, t, ignore_index=7), x, t, "mean", ignore_index=7)
    check(ops.cross_entropy(x, t, reduction="none", ignore_index=7), x, t, "none", 7)
    assert np.isnan(ops.cross_entropy(x, np.full(6, -100)))  # mean of nothing, as PyTorch
    assert ops.cross_entropy(x, np.full(6, -100), reduction="sum") == 0


def test_size_zero():
    x, t = np.zeros((0, 5), np.float32), np.zeros(0, np.int64)
    assert ops.cross_entropy(x, t, reduction="none").shape == (0,)
    assert ops.cross_entropy(x, t, reduction="sum") == 0
    assert np.isnan(ops.cross_entropy(x, t))


def test_out_of_range_target_on_device_gives_nan():
    from numba import cuda

    x = np.zeros((3, 4), np.float32)
    t = cuda.to_device(np.array([0, 4, -100]))
    got = ops.cross_entropy(cuda.to_device(x), t, reduction="none").copy_to_host()
    assert np.isnan(got[1]) and got[2] == 0 and got[0] == pytest.approx(np.log(4))


@pytest.mark.sim_only(reason="measures global traffic with the simulator's profiler")
def test_traffic_is_the_minimum_and_matches_explain():
    x = np.random.default_rng(4).standard_normal((16, 300)).astype(np.float32)
    t = np.arange(16) * 7
    for reduction in ("none", "mean"):
        with sim.profile() as prof:
            got = ops.cross_entropy(x, t, reduction=reduction)
        measured = prof.bytes_read + prof.bytes_written
        ex = ops.cross_entropy.explain(x, t, reduction=reduction)
        assert measured == ex.bytes_fused < ex.bytes_unfused
        if reduction == "none":  # logits once, a target and a loss per row
            assert measured == x.nbytes + t.nbytes + got.nbytes
    assert prof.traffic[("cross_entropy_rows", "logits")][0] == x.nbytes


def test_out_and_stream():
    from numba import cuda

    x = np.random.default_rng(5).standard_normal((4, 40)).astype(np.float32)
    t = np.array([1, 2, 3, 4])
    out = cuda.device_array(4, np.float32)
    assert ops.cross_entropy(*on("device", x, t), reduction="none", out=out, stream=0) is out
    check(out.copy_to_host(), x, t, "none")
    host_out = np.empty(4, np.float32)
    got = ops.cross_entropy(x, t, reduction="none", out=host_out, stream=cuda.stream())
    assert got is host_out
    check(host_out, x, t, "none")
    scalar_out = cuda.device_array((), np.float32)
    assert ops.cross_entropy(*on("device", x, t), out=scalar_out) is scalar_out
    check(scalar_out.copy_to_host(), x, t, "mean")
    host_scalar_out = np.empty((), np.float32)  # a 0-d host out= is an array, as on the device
    assert ops.cross_entropy(x, t, reduction="sum", out=host_scalar_out) is host_scalar_out
    check(host_scalar_out, x, t, "sum")


x32, t64 = np.zeros((4, 8), np.float32), np.zeros(4, np.int64)
BAD = [
    (lambda: ops.cross_entropy(np.zeros((4, 8), np.int32), t64), TypeError, "logits has dtype"),
    (lambda: ops.cross_entropy(x32, t64.astype(np.float32)), TypeError, "targets has dtype"),
    (lambda: ops.cross_entropy(x32[0], t64), ValueError, "logits has shape"),
    (lambda: ops.cross_entropy(x32, t64[:3]), ValueError, "targets has shape"),
    (lambda: ops.cross_entropy(x32, np.array([0, 1, 8, 2])), ValueError, r"targets\[2\] = 8"),
    (lambda: ops.cross_entropy(x32, np.array([0, -1, 2, 2])), ValueError, r"targets\[1\]"),
    (lambda: ops.cross_entropy(x32, t64, reduction="avg"), ValueError, "reduction"),
    (lambda: ops.cross_entropy(x32, t64, ignore_index=1.5), TypeError, "ignore_index"),
    (lambda: ops.cross_entropy(x32, t64, out=np.zeros(4, np.float32)), ValueError, "out"),
]


@pytest.mark.parametrize("call, error, words", BAD)
def test_bad_input_raises_before_any_launch(call, error, words):
    with counting_launches() as counted, pytest.raises(error, match=words):
        call()
    assert counted.launches == 0


def test_the_launch_counter_sees_a_valid_call():
    # the control of the test above: the same counter counts the hand-written kernel's launch
    with counting_launches() as counted:
        ops.cross_entropy(x32, t64, reduction="none")
    assert counted.launches == ops.cross_entropy.explain(x32, t64, reduction="none").kernels == 1


def vector_of(dtype) -> int:
    """Logits per 16-byte load: lane l's first element is column l * vector."""
    return 16 // np.dtype(dtype).itemsize


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("dtype", list(RTOL))
def test_nan_logit_propagates_where_a_lane_meets_it_first(dtype, reduction, side):
    """A NaN as the first logit a lane sees (its running max still -inf) was dropped: the
    first column (lane 0), the first of lane 5's 16-byte chunk, the last column (the scalar
    tail), and every column of a strided row (lane l's first is column l)."""
    x = np.random.default_rng(9).standard_normal((5, 67)).astype(dtype)
    x[0, 0] = x[1, 5 * vector_of(dtype)] = x[2, -1] = np.nan
    t = np.array([1, 2, 3, 4, 5])
    check(back(ops.cross_entropy(*on(side, x, t), reduction=reduction), side), x, t, reduction)
    got = back(ops.cross_entropy(*on(side, x, t), reduction="none"), side)
    assert np.isnan(got[:3]).all() and np.isfinite(got[3:]).all()
    base = np.random.default_rng(10).standard_normal((4, 80)).astype(dtype)
    base[:, ::2][np.arange(4), [0, 7, 31, 39]] = np.nan
    (device_base,) = on(side, base)
    got = back(ops.cross_entropy(device_base[:, ::2], *on(side, t[:4]), reduction="none"), side)
    assert np.isnan(got).all()


def test_row_of_only_minus_inf_gives_nan(side):
    """logsumexp of a row of only -inf is -inf and its loss -inf - -inf is NaN (PyTorch's);
    on a GPU log(0) = -inf gives it. Needs the simulator to follow CUDA's log(0) = -inf
    (Python's math.log(0) raises)."""
    x = np.zeros((3, 40), np.float32)
    x[0] = x[1] = -np.inf
    t = np.array([3, -100, 5])
    for reduction in ("none", "mean", "sum"):
        got = back(ops.cross_entropy(*on(side, x, t), reduction=reduction), side)
        check(got, x, t, reduction)
    got = back(ops.cross_entropy(*on(side, x, t), reduction="none"), side)
    assert np.isnan(got[0]) and got[1] == 0 and got[2] == pytest.approx(np.log(40))


def test_infinite_logits_follow_pytorch(side):
    """+inf anywhere: NaN (exp(inf - inf)); a -inf target among finite logits: +inf."""
    x = np.zeros((4, 40), np.float32)
    x[0, 0] = x[1, 39] = np.inf
    x[2, 7] = x[3, 0] = -np.inf
    t = np.array([0, 3, 7, 5])
    got = back(ops.cross_entropy(*on(side, x, t), reduction="none"), side)
    check(got, x, t, "none")
    assert np.isnan(got[:2]).all() and got[2] == np.inf and got[3] == pytest.approx(np.log(39))


@st.composite
def logits_with_specials(draw):
    """Logits of magnitude up to 1e4 holding NaN, +inf or -inf: none, one or two per row, at
    the first, the last or any column (in rows of one column, the only one)."""
    dtype = draw(st.sampled_from(list(RTOL)))
    n, c = draw(st.sampled_from([1, 2, 5])), draw(st.sampled_from([1, 2, 31, 33, 67]))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    scale = draw(st.sampled_from([1.0, 100.0, 1e4]))
    x = (rng.standard_normal((n, c)) * scale).astype(dtype)
    for row in x:
        for _ in range(draw(st.integers(0, 2))):
            at = draw(st.one_of(st.just(0), st.just(c - 1), st.integers(0, c - 1)))
            row[at] = draw(st.sampled_from([np.nan, np.inf, -np.inf]))
    t = rng.integers(0, c, n)
    t[rng.random(n) < 0.3] = -100
    return x, t


@settings(max_examples=40)
@given(logits_with_specials(), st.sampled_from(["none", "mean", "sum"]), st.sampled_from(SIDES))
def test_nan_and_infinities_anywhere_follow_pytorch(case, reduction, side):
    x, t = case
    # A kept row of only -inf is test_row_of_only_minus_inf_gives_nan's: it needs the
    # simulator's log(0) to be CUDA's -inf.
    assume(not np.isneginf(x[t != -100]).all(axis=1).any())
    got = back(ops.cross_entropy(*on(side, x, t), reduction=reduction), side)
    check(got, x, t, reduction)
