"""@tt.fuse: one test per kernel shape the planner produces, with measured traffic.

The simulator profiler counts every global access; the fused kernels must move exactly what
``explain()`` predicts, and for elementwise chains and on-chip reduce-then-broadcast chains the
minimum: each input read once, each output written once.
"""

import numpy as np
import pytest
from helpers import back, on

import tessera_tile as tt
from tessera_tile import sim

pytestmark = pytest.mark.sim_only(
    reason="the profiler measures global traffic in the simulator only"
)
rng = np.random.default_rng(7)


def measured(side, fn, *args):
    """Result (as NumPy), measured global bytes and the plan of ``fn(*args)`` called with the
    arrays on ``side``."""
    inputs = on(side, *args)
    with sim.profile() as prof:
        result = fn(*inputs)
    return back(result, side), prof.bytes_read + prof.bytes_written, fn.explain(*inputs)


def minimum_bytes(args, results):
    results = results if isinstance(results, tuple) else (results,)
    return sum(a.nbytes for a in args if isinstance(a, np.ndarray)) + sum(r.nbytes for r in results)


@tt.fuse
def chain5(a, b):
    return tt.tanh(a * b + 1.5) * tt.sigmoid(a - b) - a


@pytest.mark.parametrize("shape", [(0,), (1,), (33,), (4, 65), (2, 3, 5)])
def test_elementwise_chain_is_one_kernel_with_minimum_traffic(shape, side):
    a = rng.standard_normal(shape).astype(np.float32)
    b = rng.standard_normal(shape).astype(np.float32)
    got, traffic, ex = measured(side, chain5, a, b)
    ref = np.tanh(a * b + np.float32(1.5)) / (1 + np.exp(-(a - b))) - a
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)
    assert ex.kernels == 1 and not ex.reasons
    assert traffic == ex.bytes_fused == minimum_bytes((a, b), got)
    assert ex.bytes_unfused > ex.bytes_fused or a.size == 0


@tt.fuse
def softmax(x):
    m = tt.max(x, axis=-1, keepdims=True)
    e = tt.exp(x - m)
    return e / tt.sum(e, axis=-1, keepdims=True)


def softmax_ref(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


@pytest.mark.parametrize("cols", [2, 31, 32, 33, 1024, 1025])
def test_softmax_is_one_kernel_reading_each_row_once_when_it_fits(cols, side):
    x = rng.standard_normal((3, cols)).astype(np.float32)
    got, traffic, ex = measured(side, softmax, x)
    np.testing.assert_allclose(got, softmax_ref(x), rtol=1e-5, atol=1e-7)
    assert ex.kernels == 1
    mode = "warp" if cols <= 1024 else "block"
    assert f"reduced by a {mode}" in ex.stages[0] and "kept on chip" in ex.stages[0]
    assert traffic == ex.bytes_fused == 2 * x.nbytes


def test_long_rows_are_read_twice_when_they_do_not_fit(side):
    x = rng.standard_normal((2, 16400)).astype(np.float32)  # past 16,384 float32 on chip
    got, traffic, ex = measured(side, softmax, x)
    np.testing.assert_allclose(got, softmax_ref(x), rtol=1e-5, atol=1e-8)
    assert ex.kernels == 1 and "kept on chip" not in ex.stages[0]
    # an online max/sum pass, then the output pass; one write
    assert "2 pass(es)" in ex.stages[0]
    assert traffic == ex.bytes_fused == 2 * x.nbytes + x.nbytes


def test_online_max_and_sum_handle_infinities_and_nan_like_numpy(side):
    x = rng.standard_normal((5, 16400)).astype(np.float32)
    x[0, :] = -np.inf  # NumPy: all NaN
    x[1, 7] = np.inf  # NumPy: NaN where inf - inf
    x[2, 100] = np.nan
    x[3, ::2] = -np.inf  # half the row contributes nothing
    x[4, -1] = 80.0  # a late, large maximum rescales the running sum
    with np.errstate(all="ignore"):
        ref = softmax_ref(x)
    got, traffic, ex = measured(side, softmax, x)
    assert "2 pass(es)" in ex.stages[0]
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-8, equal_nan=True)


@tt.fuse
def column_softmax(x):
    e = tt.exp(x - tt.max(x, axis=0, keepdims=True))
    return e / tt.sum(e, axis=0, keepdims=True)


def test_column_softmax_folds_the_max_and_sum_into_one_pass(side):
    x = rng.standard_normal((40, 9)).astype(np.float32)
    x[:, 0] = -np.inf
    x[3, 1] = np.inf
    x[39, 2] = 60.0
    with np.errstate(all="ignore"):
        e = np.exp(x - x.max(0, keepdims=True))
        ref = e / e.sum(0, keepdims=True)
    got, traffic, ex = measured(side, column_softmax, x)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-8, equal_nan=True)
    assert "2 pass(es)" in ex.stages[0] and traffic == ex.bytes_fused == 3 * x.nbytes


def test_8192_float32_per_row_stay_on_chip(side):
    x = rng.standard_normal((1, 8192)).astype(np.float32)
    got, traffic, ex = measured(side, softmax, x)
    np.testing.assert_allclose(got, softmax_ref(x), rtol=1e-5, atol=1e-8)
    assert "kept on chip" in ex.stages[0] and traffic == 2 * x.nbytes


# (ops, rows, row length, dtype, blocks): the launch's blocks as the schedule sizes them: a warp
# per row, 8 rows a block, up to 1,024 elements, the weights staged in shared memory once per
# block; a block per row above, each thread holding its part of the weights in registers for
# all its block's rows. Blocks that keep the weights loop over rows in a grid of at most
# REUSE_GRID_THREADS (8 blocks of 256 in the simulator).
NORM_CASES = [
    ("layer_norm rms_norm", 32, 512, np.float32, 4),  # 16-byte accesses
    ("layer_norm rms_norm", 32, 512, np.float16, 4),
    ("layer_norm rms_norm", 40, 513, np.float32, 5),  # one element per access
    ("layer_norm rms_norm", 50, 513, np.float32, 7),  # accesses past the row guarded
    ("layer_norm rms_norm", 100, 64, np.float32, 8),  # 13 blocks' rows: each block loops
    ("layer_norm rms_norm", 70, 33, np.float64, 8),
    ("layer_norm rms_norm", 90, 40, np.float32, 8),
    ("rms_norm", 12, 1536, np.float32, 8),  # a block per row, more rows than the grid
    ("layer_norm", 10, 2048, np.float32, 8),  # 16 KiB of weights, held in registers
]


@tt.fuse
def row_scale(x, w):
    return x * tt.rsqrt(tt.mean(x * x, axis=-1, keepdims=True) + 1e-6) * w


@pytest.mark.parametrize("names, rows, n, dtype, blocks", NORM_CASES)
@pytest.mark.device_only
def test_norm_weights_are_read_once_per_block(names, rows, n, dtype, blocks, side):
    """The weight and bias rows are read once per block (staged in shared memory for the rows
    of a warp-mode block): x read once, y written once, each weight ``blocks`` times."""
    from tessera_tile import ops

    x = (rng.standard_normal((rows, n)) * 3).astype(dtype)
    w = rng.standard_normal(n).astype(dtype)
    b = rng.standard_normal(n).astype(dtype)
    xs, ws, bs = on(side, x, w, b)
    tol = dict(rtol=2e-3, atol=4e-3) if dtype == np.float16 else dict(rtol=2e-5, atol=4e-6)
    x64 = x.astype(np.float64)
    centred = x64 - x64.mean(-1, keepdims=True)
    refs = {
        "layer_norm": (
            (xs, ws, bs),
            centred / np.sqrt((centred**2).mean(-1, keepdims=True) + 1e-5) * w + b,
        ),
        "rms_norm": ((xs, ws), x64 / np.sqrt((x64**2).mean(-1, keepdims=True) + 1e-6) * w),
    }
    for name in names.split():
        op = getattr(ops, name)
        args, ref = refs[name]
        with sim.profile() as prof:
            got = back(op(*args), side)
        np.testing.assert_allclose(got, ref, **tol)
        ex = op.explain(*args)
        traffic = prof.bytes_read + prof.bytes_written
        weights = len(args) - 1
        assert ex.kernels == 1
        assert traffic == ex.bytes_fused == 2 * x.nbytes + blocks * weights * w.nbytes, name


def test_per_row_weights_are_not_staged(side):
    """A (rows, n) weight differs per row: read once per element, as before; a (n,) one is
    read once per block (4 blocks of 8 rows)."""
    x = rng.standard_normal((32, 64)).astype(np.float32)
    ref = x / np.sqrt((x.astype(np.float64) ** 2).mean(-1, keepdims=True) + 1e-6)
    for w, weight_bytes in (
        (rng.standard_normal((32, 64)).astype(np.float32), 32 * 64 * 4),
        (rng.standard_normal(64).astype(np.float32), 4 * 64 * 4),
    ):
        got, traffic, ex = measured(side, row_scale, x, w)
        np.testing.assert_allclose(got, ref * w, rtol=2e-5, atol=4e-6)
        assert traffic == ex.bytes_fused == 2 * x.nbytes + weight_bytes


@tt.fuse
def layer_norm(x):
    mu = tt.mean(x, axis=-1, keepdims=True)
    var = tt.mean(tt.square(x - mu), axis=-1, keepdims=True)
    return (x - mu) * tt.rsqrt(var + 1e-5)


def test_layer_norm_is_one_kernel_with_minimum_traffic(side):
    x = rng.standard_normal((5, 100)).astype(np.float32)
    got, traffic, ex = measured(side, layer_norm, x)
    ref = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)
    assert ex.kernels == 1 and traffic == ex.bytes_fused == 2 * x.nbytes


@tt.fuse
def layer_norm_var(x):
    mu = tt.mean(x, axis=-1, keepdims=True)
    return (x - mu) * tt.rsqrt(tt.var(x, axis=-1, keepdims=True) + 1e-5)


def test_equal_values_are_computed_once():
    # tt.var computes its own mean: the kernel reduces sum(x) once, not twice
    x = rng.standard_normal((3, 40)).astype(np.float32)
    ex = layer_norm_var.explain(x)
    assert ex.ir.count(" = sum %0 ") == 1 and ex.ir.count(" = sum ") == 2, ex.ir
    assert ex.source.count("= warp_allsum_float32(") == 2, ex.source
    ref = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(layer_norm_var(x), ref, rtol=1e-4, atol=1e-5)


@tt.fuse
def row_dot(x, y):
    return tt.sum(x * y, axis=-1)


def test_trailing_axis_reduction_uses_warp_shuffles_per_row(side):
    x = rng.standard_normal((9, 70)).astype(np.float32)
    y = rng.standard_normal((9, 70)).astype(np.float32)
    got, traffic, ex = measured(side, row_dot, x, y)
    np.testing.assert_allclose(got, (x * y).sum(-1), rtol=1e-5, atol=1e-5)
    assert "warp_allsum_float32(" in ex.source and ex.kernels == 1
    assert traffic == ex.bytes_fused == x.nbytes + y.nbytes + got.nbytes


@tt.fuse
def column_stats(x):
    return tt.mean(x, axis=0), tt.max(x, axis=0)


def test_leading_axis_reduction_is_coalesced_and_shares_one_pass(side):
    x = rng.standard_normal((37, 45)).astype(np.float32)
    (mean, mx), traffic, ex = measured(side, column_stats, x)
    np.testing.assert_allclose(mean, x.mean(0), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(mx, x.max(0))
    assert ex.kernels == 1 and "coalesced column" in ex.stages[0]
    assert traffic == ex.bytes_fused == x.nbytes + mean.nbytes + mx.nbytes


@tt.fuse
def middle(x):
    return tt.sum(x, axis=1)


def test_middle_axis_reduction(side):
    x = rng.standard_normal((3, 40, 5))
    got, traffic, ex = measured(side, middle, x)
    np.testing.assert_allclose(got, x.sum(1), rtol=1e-12)
    assert ex.kernels == 1 and traffic == ex.bytes_fused == x.nbytes + got.nbytes


@tt.fuse
def total(x):
    return tt.sum(x), tt.argmax(x)


def test_full_reduction_is_deterministic_and_one_launch(side):
    x = rng.standard_normal(5000).astype(np.float32)
    (s, i), traffic, ex = measured(side, total, x)
    np.testing.assert_allclose(s, x.sum(dtype=np.float64), rtol=1e-5)
    assert i == x.argmax() and ex.kernels == 1 and "two-stage" in ex.stages[0]
    assert traffic == ex.bytes_fused
    again = total(x)
    assert again[0] == s  # the same partials combined in the same order


@tt.fuse
def variance_all(x):
    return tt.var(x)


def test_full_reduce_then_broadcast_takes_two_kernels_and_says_why(side):
    x = rng.standard_normal((10, 10))
    got, traffic, ex = measured(side, variance_all, x)
    np.testing.assert_allclose(got, x.var(), rtol=1e-12)
    assert ex.kernels == 2 and "grid-wide barrier" in ex.reasons[0]
    assert traffic == ex.bytes_fused


@tt.fuse
def several(x):
    return tt.exp(x), tt.sum(x, axis=-1), tt.max(x, axis=-1, keepdims=True)


def test_outputs_of_different_shapes_from_one_kernel(side):
    x = rng.standard_normal((4, 20)).astype(np.float32)
    (e, s, m), traffic, ex = measured(side, several, x)
    assert e.shape == (4, 20) and s.shape == (4,) and m.shape == (4, 1)
    np.testing.assert_allclose(e, np.exp(x), rtol=1e-6)
    np.testing.assert_allclose(s, x.sum(-1), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(m, x.max(-1, keepdims=True))
    assert ex.kernels == 1
    assert traffic == ex.bytes_fused == x.nbytes + e.nbytes + s.nbytes + m.nbytes


def test_non_contiguous_views_give_correct_results(side):
    """Strided views, host or device, are read where they are: never copied contiguous on the
    device side (a host view is copied contiguously to the device, as numba requires)."""
    host = rng.standard_normal((12, 70)).astype(np.float32)
    (base,) = on(side, host)
    # Each view and its rows reversed, both taken from the base: numba's device arrays slice a
    # view of negative stride wrongly (base[:, ::-3][::-1] has 0 columns, numba-cuda 0.30.4).
    for index, flipped in (
        (
            (slice(None, None, 2), slice(None, None, -3)),
            (slice(10, None, -2), slice(None, None, -3)),
        ),
        ((slice(None), slice(5, 45)), (slice(None, None, -1), slice(5, 45))),
    ):
        view, ref = base[index], host[index]
        np.testing.assert_array_equal(host[flipped], ref[::-1])
        np.testing.assert_allclose(
            back(softmax(view), side), softmax_ref(ref), rtol=1e-5, atol=1e-7
        )
        np.testing.assert_allclose(
            back(chain5(view, base[flipped]), side),
            np.tanh(ref * ref[::-1] + 1.5) / (1 + np.exp(-(ref - ref[::-1]))) - ref,
            rtol=1e-5,
            atol=1e-6,
        )
    np.testing.assert_allclose(softmax(host.T), softmax_ref(host.T), rtol=1e-5, atol=1e-7)


@tt.fuse
def extremes(x, y):
    return tt.maximum(x, y), tt.minimum(x, y), tt.max(x, axis=-1), tt.min(y, axis=-1), tt.relu(x)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_max_and_min_propagate_nan_like_numpy(dtype):
    x = rng.standard_normal((6, 70)).astype(dtype)
    y = rng.standard_normal((6, 70)).astype(dtype)
    x[1, 3] = y[2, 5] = np.nan
    x[3, 0] = np.inf
    y[4, :] = -np.inf
    got = extremes(x, y)
    ref = (np.maximum(x, y), np.minimum(x, y), x.max(-1), y.min(-1), np.maximum(x, 0))
    for g, r in zip(got, ref, strict=True):
        np.testing.assert_array_equal(g, r)


@tt.fuse
def plus_row(a, b):
    return a + b


def test_index_width_is_part_of_the_variant():
    # 32-bit coordinates below 2**31 elements; a separate 64-bit kernel above (a broadcast view
    # makes such an index space without the memory)
    small, row = rng.standard_normal((5, 7)).astype(np.float32), np.arange(7, dtype=np.float32)
    source = plus_row.explain(small, row).source
    assert "index_bits=32" in source and "uint32(dk1)" in source, source
    big = np.broadcast_to(np.float32(1), (2**16 + 1, 2**15))
    source = plus_row.explain(big, np.zeros(2**15, np.float32)).source
    assert "index_bits=64" in source and "uint64(dk1)" in source, source
    np.testing.assert_array_equal(plus_row(small, row), small + row)


@tt.fuse
def fma_like(a, b, c):
    return a * b + c


def test_float16_is_rounded_only_where_stored():
    # computed in float32 and rounded once, at the store (NumPy rounds after every op)
    a, b, c = (rng.standard_normal(4099).astype(np.float16) for _ in range(3))
    once = (a.astype(np.float32) * b.astype(np.float32) + c.astype(np.float32)).astype(np.float16)
    assert np.any(once != a * b + c)  # the two roundings differ on this data
    np.testing.assert_array_equal(fma_like(a, b, c), once)
    assert "vector=8" in fma_like.explain(a, b, c).source


@tt.fuse
def centred_product(x):
    return (x - tt.mean(x, axis=-1, keepdims=True)) * (
        x * x - tt.mean(x * x, axis=-1, keepdims=True)
    )


def test_block_row_cache_has_no_bank_conflicts():
    # two values per element for the second pass: at 12,288 float16 past the registers of a
    # block of 512 (16 elements a thread: 32 registers), so the shared row cache keeps x
    x = rng.standard_normal((2, 12288)).astype(np.float16)
    with sim.profile() as prof:
        got = centred_product(x)
    x64 = x.astype(np.float64)
    ref = (x64 - x64.mean(-1, keepdims=True)) * (x64 * x64 - (x64 * x64).mean(-1, keepdims=True))
    np.testing.assert_allclose(got, ref, rtol=1e-2, atol=1e-2 * np.abs(ref).max())
    assert "cache=True" in centred_product.explain(x).source
    assert prof.bank_conflicts == 0
