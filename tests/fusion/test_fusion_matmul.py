"""Matmul inside ``@tt.fuse`` (issue 24): NumPy's matmul semantics, GEMM stages whose epilogue
is generated from the traced expression, and the splits (with their reasons) where a product
cannot carry its consumers. Results against NumPy in float64, on host and device arrays.

Tolerance, per element: the stored result's rounding (``U[dtype] * |ref|``) plus float32
arithmetic on the way, bounded from the reference's own error scale (``ErrorScale``: each op's
rounding, propagated through the tree by the op's derivative bound; the product contributes
``K`` roundings of ``|x| @ |w|``). float16 and bfloat16 values are held in float32 between ops and
rounded once where stored (docs/fusion.md), so the reference rounds once too.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from helpers import SIDES, back, expression_trees, on
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

import tessera_tile as tt

BF16 = np.dtype(ml_dtypes.bfloat16)
PROFILER = pytest.mark.sim_only(reason="the profiler exists only in the simulator")
DTYPES = {"float16": np.dtype(np.float16), "bfloat16": BF16, "float32": np.dtype(np.float32)}
U = {"float16": 2.0**-11, "bfloat16": 2.0**-8, "float32": 2.0**-24}  # unit roundoff, stored
TINY = {"float16": 2.0**-25, "bfloat16": 2.0**-134, "float32": 2.0**-150}  # half a subnormal
EPS32 = 2.0**-24
SLACK = 8  # libdevice's transcendentals: a few ulp each


def draw(shape, dtype, seed, scale=1.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(DTYPES[dtype])


def f64(*arrays):
    return [np.asarray(a, np.float64) for a in arrays]


def assert_within(got, ref, scale, dtype):
    """Per element: ``|got - ref| <= U * |ref| + EPS32 * SLACK * scale`` (module doc)."""
    got = np.asarray(got, np.float64)
    assert got.shape == ref.shape
    bound = U[dtype] * np.abs(ref) + EPS32 * SLACK * scale + TINY[dtype]
    err = np.abs(got - ref)
    bad = ~(err <= bound)
    assert not bad.any(), (
        f"{bad.sum()} of {bad.size} elements off; worst {err[bad].max():.3g} vs bound "
        f"{bound[bad][np.argmax(err[bad])]:.3g}"
    )


def product_scale(x, w):
    """The product's error scale: K roundings of |x| @ |w|."""
    k = x.shape[-1]
    return (k + 2) * (np.abs(x) @ np.abs(w))


# --------------------------------------------------------------------------------------------
# NumPy's matmul semantics


SHAPES = [
    ((5, 7), (7, 3)),
    ((2, 5, 7), (7, 3)),  # a batch against one matrix
    ((2, 1, 5, 7), (3, 7, 4)),  # batches broadcast
    ((7,), (7, 3)),  # a vector on the left: a row, dropped from the result
    ((5, 7), (7,)),  # on the right: a column
    ((7,), (7,)),  # both: a 0-d result
    ((4, 0), (0, 3)),  # K = 0: zeros
]


@pytest.mark.parametrize("side", SIDES)
@pytest.mark.parametrize(("a_shape", "b_shape"), SHAPES)
def test_shapes_follow_numpy(a_shape, b_shape, side):
    a, b = draw(a_shape, "float32", 1), draw(b_shape, "float32", 2)
    bare = tt.fuse(lambda a, b: a @ b)
    scaled = tt.fuse(lambda a, b: tt.relu(tt.matmul(a, b)) * 2.0)
    ref = np.matmul(*f64(a, b))
    scale = product_scale(*f64(a, b))
    got = back(bare(*on(side, a, b)), side)
    assert np.shape(got) == ref.shape
    assert_within(got, ref, scale, "float32")
    assert_within(back(scaled(*on(side, a, b)), side), np.maximum(ref, 0) * 2, 2 * scale, "float32")


def test_operand_errors_are_numpys():
    f = tt.fuse(lambda a, b: a @ b)
    a, b = np.ones((3, 4), np.float32), np.ones((5, 2), np.float32)
    with pytest.raises(ValueError) as ours:
        f(a, b)
    with pytest.raises(ValueError) as numpys:
        np.matmul(a, b)
    assert str(ours.value).startswith(str(numpys.value).split("(size")[0])
    with pytest.raises(ValueError, match="does not have enough dimensions"):
        tt.fuse(lambda a, s: a @ s)(a, np.float32(2.0))
    with pytest.raises(TypeError, match="float16, bfloat16 or float32"):
        f(np.ones((3, 4), np.int32), np.ones((4, 2), np.int32))


def test_mixed_dtypes_promote_as_numpy():
    a, b = draw((6, 8), "float16", 3), draw((8, 5), "float32", 4)
    got = tt.fuse(lambda a, b: a @ b)(a, b)
    assert got.dtype == np.matmul(a, b).dtype == np.float32
    assert_within(got, np.matmul(*f64(a, b)), product_scale(*f64(a, b)), "float32")


# --------------------------------------------------------------------------------------------
# epilogues in the GEMM kernel


@tt.fuse
def linear_gelu_times(x, w, b, r):
    return tt.gelu(x @ w + b) * r


@tt.fuse
def scaled_residual(x, w, b, scale, r):
    return (x @ w + b) * scale + r


@tt.fuse
def leaky(x, w):
    p = x @ w
    return tt.where(p > 0, p, p * 0.125)


def gelu64(v):
    from math import erf

    return 0.5 * v * (1 + np.vectorize(erf)(v / np.sqrt(2)))


@pytest.mark.device_only
@pytest.mark.parametrize("dtype", DTYPES)
def test_epilogues_run_in_the_gemm_kernel(dtype, side):
    m, k, n = 37, 24, 40
    x, w = draw((2, m, k), dtype, 5), draw((k, n), dtype, 6, k**-0.5)
    b, r = draw((n,), dtype, 7), draw((m, n), dtype, 8)
    x64, w64, b64, r64 = f64(x, w, b, r)
    p, scale = x64 @ w64, product_scale(x64, w64)
    cases = [
        (linear_gelu_times, (x, w, b, r), gelu64(p + b64) * r64, (scale + 2) * (np.abs(r64) + 1)),
        (scaled_residual, (x, w, b, 0.5, r), (p + b64) * 0.5 + r64, scale + np.abs(r64) + 2),
        (leaky, (x, w), np.where(p > 0, p, p * 0.125), scale),
    ]
    for fn, args, ref, err_scale in cases:
        assert fn.explain(*args).kernels == 1, fn.__name__
        got = back(fn(*on(side, *args)), side)
        assert got.dtype == DTYPES[dtype], fn.__name__
        assert_within(got, ref, err_scale, dtype)


@pytest.mark.parametrize("side", SIDES)
def test_a_scalar_factor_of_an_operand_moves_onto_the_product(side):
    x, w, r = (draw(s, "float32", 70 + i) for i, s in enumerate(((2, 9, 16), (16, 12), (9, 12))))
    fn = tt.fuse(lambda x, w, r, s: (x * s) @ (0.5 * w) + r)
    report = fn.explain(x, w, r, 3.0)
    assert report.kernels == 1
    assert any("(c * a) @ b = c * (a @ b)" in reason for reason in report.reasons)
    x64, w64, r64 = f64(x, w, r)
    got = back(fn(*on(side, x, w, r), 3.0), side)
    assert_within(
        got, 1.5 * (x64 @ w64) + r64, 2 * product_scale(x64, w64) + np.abs(r64), "float32"
    )


@pytest.mark.parametrize("side", SIDES)
@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_row_and_column_scales_move_onto_the_product(side, dtype):
    """A row scale of A and a column scale of B (the same all along K: per-row and per-channel
    scales of quantized operands) are applied to the accumulator: one kernel, no scaled operand
    written. A scale that varies along K is not rewritten: that operand is computed first."""
    x, w, d, e = (
        draw(s, dtype, 80 + i) for i, s in enumerate(((2, 9, 16), (16, 12), (2, 9, 1), (12,)))
    )
    fn = tt.fuse(lambda x, w, d, e: (x * d) @ (w * e))
    report = fn.explain(x, w, d, e)
    assert report.kernels == 1, report
    assert any("(a * d) @ (b * e) = d * (a @ b) * e" in r for r in report.reasons), report.reasons
    x64, w64, d64, e64 = f64(x, w, d, e)
    got = back(fn(*on(side, x, w, d, e)), side)
    assert got.dtype == DTYPES[dtype]
    # NumPy rounds the scaled operands (float16: 2^-11 each) where the kernel scales the
    # float32 accumulator: the reference is the exact product, the bound the product's own
    # plus one rounding of each scaled term
    scale = product_scale(np.abs(x64 * d64), np.abs(w64 * e64)) + 2 * U[dtype] / EPS32 * (
        np.abs(x64 * d64) @ np.abs(w64 * e64)
    )
    assert_within(got, (x64 * d64) @ (w64 * e64), scale, dtype)

    along_k = tt.fuse(lambda x, w, g: (x * g) @ w)  # g of shape (K,): varies along K
    g = draw((16,), dtype, 90)
    assert along_k.explain(x, w, g).kernels == 2
    x64, w64, g64 = f64(x, w, g)
    assert_within(
        back(along_k(*on(side, x, w, g)), side), (x64 * g64) @ w64,
        product_scale(x64 * g64, w64) + 2 * U[dtype] / EPS32 * (np.abs(x64 * g64) @ np.abs(w64)),
        dtype,
    )  # fmt: skip


def test_inputs_are_never_modified_and_out_is_written_in_place():
    shapes = ((9, 16), (16, 12), (12,), (9, 12))
    x, w, b, r = (draw(s, "float32", 9 + i) for i, s in enumerate(shapes))
    copies = [a.copy() for a in (x, w, b, r)]
    out = np.full((9, 12), np.nan, np.float32)
    got = linear_gelu_times(x, w, b, r, out=out)
    assert got is out
    ref = gelu64(np.matmul(*f64(x, w)) + b) * r
    assert_within(out, ref, product_scale(*f64(x, w)) * 4 + 4, "float32")
    for a, c in zip((x, w, b, r), copies, strict=True):
        np.testing.assert_array_equal(a, c)


@PROFILER
@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_traffic_is_the_plan_and_the_result_is_written_once(dtype):
    from numba import cuda

    m, k, n = 48, 32, 72
    arrays = [draw(s, dtype, 13 + i) for i, s in enumerate(((m, k), (k, n), (n,), (m, n)))]
    args = [cuda.to_device(a) for a in arrays]
    linear_gelu_times(*args)  # compiled
    planned = linear_gelu_times.explain(*args).bytes_fused
    with tt.sim.profile() as prof:
        linear_gelu_times(*args)
    assert prof.bytes_read + prof.bytes_written == planned
    assert prof.bytes_written == m * n * DTYPES[dtype].itemsize


# --------------------------------------------------------------------------------------------
# several results, and casts, from one accumulator tile


@tt.fuse
def fan_out(x, w, b, r):
    y = x @ w + b
    return y, tt.gelu(y) * r, y > 0, (y * 2).astype(np.float64)


@tt.fuse
def product_and_relu(x, w):
    p = x @ w
    return p, tt.relu(p)


def cast_of(dtype):
    """The product cast to another float dtype: no result of the product's dtype."""
    to = np.float16 if dtype == "float32" else np.float32
    return tt.fuse(lambda x, w: (x @ w).astype(to)), np.dtype(to)


@pytest.mark.device_only
@pytest.mark.parametrize("dtype", DTYPES)
def test_several_results_and_casts_come_from_one_gemm_kernel(dtype, side):
    m, k, n = 37, 24, 40
    x, w = draw((2, m, k), dtype, 31), draw((k, n), dtype, 32, k**-0.5)
    b, r = draw((n,), dtype, 33), draw((m, n), dtype, 34)
    x64, w64, b64, r64 = f64(x, w, b, r)
    p, scale = x64 @ w64, product_scale(x64, w64)
    y = p + b64
    cast, to = cast_of(dtype)
    half = "float16" if to == np.float16 else dtype  # the cast's rounding, where it narrows
    cases = [
        (fan_out, (x, w, b, r), [
            (y, DTYPES[dtype], scale + 1, dtype),
            (gelu64(y) * r64, DTYPES[dtype], (scale + 2) * (np.abs(r64) + 1), dtype),
            (y > 0, np.dtype(bool), scale + 1, None),
            (y * 2, np.dtype(np.float64), 2 * scale + 2, dtype),
        ]),
        (product_and_relu, (x, w), [
            (p, DTYPES[dtype], scale, dtype), (np.maximum(p, 0), DTYPES[dtype], scale, dtype),
        ]),
        (cast, (x, w), [(p, to, scale, half)]),
    ]  # fmt: skip
    for fn, args, refs in cases:
        report = fn.explain(*args)
        assert report.kernels == 1, (fn, report.reasons)
        got = fn(*on(side, *args))
        got = got if isinstance(got, tuple) else (got,)
        assert len(got) == len(refs)
        for g, (ref, kind, err_scale, rounding) in zip(got, refs, strict=True):
            g = back(g, side)
            assert g.dtype == kind
            if rounding is None:  # a comparison: exact wherever the value is clear of 0
                clear = np.abs(y) > U[dtype] * np.abs(y) + EPS32 * SLACK * err_scale
                np.testing.assert_array_equal(g[clear], ref[clear])
            else:
                assert_within(g, ref, err_scale, rounding)


@PROFILER
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_several_results_traffic_is_the_plan_each_written_once(dtype):
    from numba import cuda

    m, k, n = 48, 32, 72
    arrays = [draw(s, dtype, 40 + i) for i, s in enumerate(((m, k), (k, n), (n,), (m, n)))]
    args = (
        [cuda.to_device(a) for a in arrays]
        if dtype != "bfloat16"
        else [tt.to_device(a) for a in arrays]
    )
    cast, to = cast_of(dtype)
    for fn, fn_args, written in [
        (fan_out, args, m * n * (2 * DTYPES[dtype].itemsize + 1 + 8)),
        (cast, args[:2], m * n * to.itemsize),
    ]:
        fn(*fn_args)  # compiled
        planned = fn.explain(*fn_args).bytes_fused
        with tt.sim.profile() as prof:
            fn(*fn_args)
        assert prof.bytes_read + prof.bytes_written == planned
        assert prof.bytes_written == written


# --------------------------------------------------------------------------------------------
# two products of one left operand in one kernel (a gated MLP)


@tt.fuse
def gated(x, w1, w3):
    return tt.silu(x @ w1) * (x @ w3)


def gated_reference(x, w1, w3):
    x64, w164, w364 = f64(x, w1, w3)
    p, s = x64 @ w164, product_scale(x64, w164)
    p3, s3 = x64 @ w364, product_scale(x64, w364)
    silu = p / (1 + np.exp(-p))
    return silu * p3, (1.1 * s + np.abs(silu)) * np.abs(p3) + s3 * np.abs(silu)


@pytest.mark.device_only
@pytest.mark.parametrize(
    ("dtype", "precision"),
    [("float16", None), ("bfloat16", None), ("float32", None), ("float32", "tf32")],
)
def test_gated_mlp_is_one_kernel_of_two_products(dtype, precision, side):
    m, k, n = 37, 40, 48  # rows aligned: the cp.async kernels
    x, w1, w3 = draw((2, m, k), dtype, 50), draw((k, n), dtype, 51), draw((k, n), dtype, 52)
    fn = tt.fuse(gated.fn, precision=precision) if precision else gated
    report = fn.explain(x, w1, w3)
    assert report.kernels == 1, report.reasons
    assert "second product of the same A tiles" in report.stages[0]
    ref, scale = gated_reference(x, w1, w3)
    got = back(fn(*on(side, x, w1, w3)), side)
    assert got.dtype == DTYPES[dtype]
    if precision:  # TF32: each input read with 10 mantissa bits (docs/matmul.md)
        scale = scale * 2.0**13
    assert_within(got, ref, scale, dtype)


@PROFILER
@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_gated_mlp_reads_x_once_per_tile_pair(dtype):
    """Traffic equals the plan, and x is read once per column of C tiles for both products
    (two GEMM kernels would read it twice, and write and read the first product)."""
    from numba import cuda

    from tessera_tile.kernels.matmul.choice import DUAL

    m, k, n = 136, 16, 72  # two row tiles of x
    args = [cuda.to_device(draw(s, dtype, 60 + i)) for i, s in enumerate(((m, k), (k, n), (k, n)))]
    gated(*args)  # compiled
    planned = gated.explain(*args).bytes_fused
    with tt.sim.profile() as prof:
        gated(*args)
    assert prof.bytes_read + prof.bytes_written == planned
    tile = DUAL["float16" if dtype == "float16" else "float32"]
    rows, cols = -(-m // tile.tile_m), -(-n // tile.tile_n)
    size = DTYPES[dtype].itemsize
    assert prof.bytes_read == size * (m * k * cols + 2 * k * n * rows)
    assert prof.bytes_written == size * m * n


# --------------------------------------------------------------------------------------------
# what does not fuse: more kernels, a reason each, the same results


@tt.fuse
def two_lefts(x, w, w3):
    return (x @ w) * (tt.swapaxes(x, -1, -2) @ w3)


@tt.fuse
def row_sums(x, w):
    return tt.sum(x @ w, axis=-1)


@tt.fuse
def product_and_exp(x, w, r):
    return x @ w, tt.exp(r)


@tt.fuse
def row_scaled(x, w):
    return (x @ w) / tt.sum(x * x, axis=-1, keepdims=True)


@tt.fuse
def computed_operand(x, w):  # not an elementwise chain: no prologue (test_fusion_prologue)
    return tt.tanh(x - tt.max(x, axis=-1, keepdims=True)) @ w


# function, arguments taken, kernels, the reason's words; float32 operands, so that a product
# written by one kernel and read by the next is the same float32 value
SPLITS = [
    (two_lefts, 3, 2, "one matmul per kernel, or two of one left operand"),
    (row_sums, 2, 2, "a reduction of a product"),
    (product_and_exp, 3, 2, "a result that does not read the product"),
    (row_scaled, 2, 2, "a reduction in a GEMM's epilogue"),
    (computed_operand, 2, 2, "a matmul operand that is computed"),
]


def split_references(fn, x, w, w3) -> list:
    """``(reference, error scale)`` of each result."""
    x64, w64, w364 = f64(x, w, w3)
    p, s = x64 @ w64, product_scale(x64, w64)
    pt, st3 = x64.T @ w364, product_scale(x64.T, w364)
    return {
        two_lefts: lambda: [(p * pt, s * np.abs(pt) + st3 * np.abs(p) + s * st3)],
        row_sums: lambda: [(p.sum(-1), (s + np.abs(p)).sum(-1))],
        product_and_exp: lambda: [(p, s), (np.exp(w364), np.exp(w364))],
        row_scaled: lambda: [
            (
                p / (x64 * x64).sum(-1, keepdims=True),
                (s + np.abs(p) * 24) / (x64 * x64).sum(-1, keepdims=True),
            )
        ],
        computed_operand: lambda: [
            (
                np.tanh(x64 - x64.max(-1, keepdims=True)) @ w64,
                s + 2 * np.abs(x64) @ np.abs(w64),
            )
        ],
    }[fn]()


@pytest.mark.parametrize("side", SIDES)
@pytest.mark.parametrize(("fn", "arity", "kernels", "reason"), SPLITS)
def test_what_cannot_fuse_splits_with_a_reason(fn, arity, kernels, reason, side):
    x, w, w3 = (draw(s, "float32", 20 + i) for i, s in enumerate(((16, 16), (16, 24), (16, 24))))
    args = (x, w, w3)[:arity]
    report = fn.explain(*args)
    assert report.kernels == kernels
    assert any(reason in r for r in report.reasons), report.reasons
    got = fn(*on(side, *args))
    results = got if isinstance(got, tuple) else (got,)
    refs = split_references(fn, x, w, w3)
    assert len(results) == len(refs)
    for g, (ref, scale) in zip(results, refs, strict=True):
        assert_within(back(g, side), ref, scale, "float32")


# --------------------------------------------------------------------------------------------
# random epilogue trees over a product (3 to 8 ops), shapes around the tiles

UNARY = {
    "relu": (tt.relu, lambda v: np.maximum(v, 0), 1.0),
    "gelu": (tt.gelu, gelu64, 1.13),
    "silu": (tt.silu, lambda v: v / (1 + np.exp(-v)), 1.1),
    "tanh": (tt.tanh, np.tanh, 1.0),
    "sigmoid": (tt.sigmoid, lambda v: 1 / (1 + np.exp(-v)), 0.25),
    "abs": (tt.abs, np.abs, 1.0),
    "neg": (lambda v: -v, np.negative, 1.0),
    "leaky": (lambda v: tt.where(v > 0, v, v * 0.125), lambda v: np.where(v > 0, v, v * 0.125), 1),
}
BINARY = {
    "add": (lambda a, b: a + b, np.add),
    "sub": (lambda a, b: a - b, np.subtract),
    "mul": (lambda a, b: a * b, np.multiply),
    "maximum": (tt.maximum, np.maximum),
    "minimum": (tt.minimum, np.minimum),
}
LEAVES = ["p", "p", "p2", "bias", "residual", "scalar", 0.5, 3.0]  # p2 = x @ w2: a dual stage


def trees():
    return expression_trees(LEAVES, UNARY, BINARY, max_leaves=6)


def count_ops(tree) -> int:
    return 0 if not isinstance(tree, tuple) else 1 + sum(count_ops(t) for t in tree[1:])


def has_product(tree) -> bool:
    if not isinstance(tree, tuple):
        return tree in ("p", "p2")
    return any(has_product(t) for t in tree[1:])


def has_array(tree) -> bool:
    if not isinstance(tree, tuple):
        return tree in ("p", "p2", "bias", "residual")
    return any(has_array(t) for t in tree[1:])


def every_op_reads_an_array(tree) -> bool:
    """An op of scalars alone gives a strong float64 NumPy scalar (NEP 50), which would make
    the result float64: another dtype than the product's, split off (tested above)."""
    if not isinstance(tree, tuple):
        return True
    return has_array(tree) and all(every_op_reads_an_array(t) for t in tree[1:])


def epilogues(tree) -> bool:
    return 3 <= count_ops(tree) <= 8 and has_product(tree) and every_op_reads_an_array(tree)


def build(tree, env):
    """The tree on traced values (``env``: leaf name -> value)."""
    if not isinstance(tree, tuple):
        return env.get(tree, tree)
    if tree[0] in UNARY:
        return UNARY[tree[0]][0](build(tree[1], env))
    return BINARY[tree[0]][0](build(tree[1], env), build(tree[2], env))


def reference(tree, env):
    """``(value, error scale)`` of the tree in float64 (module doc)."""
    if not isinstance(tree, tuple):
        value, scale = env.get(tree, (tree, 0.0))
        return np.asarray(value, np.float64), scale
    if tree[0] in UNARY:
        _, fn, lipschitz = UNARY[tree[0]]
        v, s = reference(tree[1], env)
        out = fn(v)
        return out, lipschitz * s + np.abs(out)
    _, fn = BINARY[tree[0]]
    (a, sa), (b, sb) = reference(tree[1], env), reference(tree[2], env)
    out = fn(a, b)
    if tree[0] == "mul":
        return out, sa * np.abs(b) + sb * np.abs(a) + sa * sb + np.abs(out)
    if tree[0] in ("maximum", "minimum"):
        return out, np.maximum(sa, sb)
    return out, sa + sb + np.abs(out)


@settings(max_examples=14, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    tree=trees().filter(epilogues),
    dtype=st.sampled_from(sorted(DTYPES)),
    m=st.integers(1, 40),
    n=st.integers(1, 40),
    k=st.integers(1, 40),
    batch=st.sampled_from([(), (2,)]),
    side=st.sampled_from(SIDES),
)
@example(  # past a 128 x 128 tile both ways, on the tensor cores
    tree=("add", ("gelu", ("add", "p", "bias")), ("mul", "residual", "scalar")),
    dtype="float16", m=129, n=130, k=40, batch=(), side="device",
)  # fmt: skip
@example(
    tree=("mul", ("silu", "p"), ("sub", "residual", 0.5)),
    dtype="bfloat16", m=65, n=129, k=24, batch=(2,), side="host",
)  # fmt: skip
@example(  # SIMT float32 tiles of 128 x 64 (x 8): two row tiles, two column tiles
    tree=("maximum", ("tanh", "p"), ("neg", ("sigmoid", "bias"))),
    dtype="float32", m=129, n=65, k=9, batch=(), side="device",
)  # fmt: skip
@example(  # two products of x past the dual tile (128 x 128) both ways, on the tensor cores
    tree=("mul", ("silu", "p"), ("add", "p2", "bias")),
    dtype="float16", m=129, n=130, k=40, batch=(), side="device",
)  # fmt: skip
def test_random_epilogue_trees_match_numpy(tree, dtype, m, n, k, batch, side):
    x, w = draw((*batch, m, k), dtype, m), draw((k, n), dtype, n, k**-0.5)
    w2 = draw((k, n), dtype, n + 1, k**-0.5)
    b, r = draw((n,), dtype, k), draw((m, n), dtype, m + n)
    scalar = 0.75
    fn = tt.fuse(
        lambda x, w, w2, b, r, s: build(
            tree, {"p": x @ w, "p2": x @ w2, "bias": b, "residual": r, "scalar": s}
        )
    )
    x64, w64, w264, b64, r64 = f64(x, w, w2, b, r)
    env = {
        "p": (x64 @ w64, product_scale(x64, w64)),
        "p2": (x64 @ w264, product_scale(x64, w264)),
        "bias": (b64, 0.0),
        "residual": (r64, 0.0),
        "scalar": (scalar, 0.0),
    }
    ref, scale = reference(tree, env)
    ref = np.broadcast_to(ref, (*batch, m, n))
    assume(np.all(np.abs(ref) < 2.0**-4 * float(ml_dtypes.finfo(DTYPES[dtype]).max)))
    assert fn.explain(x, w, w2, b, r, scalar).kernels == 1
    got = back(fn(*on(side, x, w, w2, b, r), scalar), side)
    assert_within(got, ref, np.broadcast_to(scale, ref.shape), dtype)


# --------------------------------------------------------------------------------------------
# attention written in algebra: found, and run on the flash kernel


def softmax_rows(s, axis=-1):
    m = tt.max(s, axis=axis, keepdims=True)
    e = tt.exp(s - m)
    return e / tt.sum(e, axis=axis, keepdims=True)


@tt.fuse
def attention(q, k, v):
    return softmax_rows(q @ tt.swapaxes(k, -1, -2) * 0.125) @ v


@tt.fuse
def attention_divided(q, k, v):
    return softmax_rows(q @ tt.swapaxes(k, -2, -1) / 8.0) @ v


@tt.fuse
def attention_over_queries(q, k, v):  # a near miss: the softmax runs over the other axis
    return softmax_rows(q @ tt.swapaxes(k, -1, -2) * 0.125, axis=-2) @ v


@tt.fuse
def attention_scaled_at_run_time(q, k, v, scale):  # a scale passed at run time: not rewritten
    return softmax_rows(q @ tt.swapaxes(k, -1, -2) * scale) @ v


def causal_of(k_offset=None, fill=-np.inf):
    """Causal attention in algebra: the scaled scores masked by ``tt.tri`` (diagonal
    ``Sk - Sq``, the flash kernel's, unless ``k_offset`` says otherwise) and ``fill``."""

    def fn(q, k, v):
        sq, sk = q.shape[-2], k.shape[-2]
        diagonal = sk - sq if k_offset is None else k_offset
        mask = tt.tri(sq, sk, diagonal, dtype=bool)
        return softmax_rows(tt.where(mask, q @ tt.swapaxes(k, -1, -2) * 0.125, fill)) @ v

    return tt.fuse(fn)


causal = causal_of()


def attention_reference(q, k, v, axis=-1, mask=None, fill=-np.inf):
    q, k, v = f64(q, k, v)
    s = q @ np.swapaxes(k, -1, -2) * 0.125
    if mask is not None:
        s = np.where(mask, s, fill)
    with np.errstate(invalid="ignore"):  # a row with no visible key: NaN, as NumPy gives it
        p = np.exp(s - s.max(axis, keepdims=True))
        p /= p.sum(axis, keepdims=True)
    # the flash kernel rounds P to the operands' dtype for P @ V (docs/attention.md)
    return p @ v, np.abs(p) @ np.abs(v)


@pytest.mark.device_only
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fn", [attention, attention_divided])
def test_attention_pattern_runs_on_the_flash_kernel(fn, dtype, side):
    q, k, v = (draw((2, s, 64), dtype, 30 + i) for i, s in enumerate((24, 40, 40)))
    report = fn.explain(q, k, v)
    assert report.kernels == 1
    assert any("attention pattern -> flash kernel" in r for r in report.reasons), report.reasons
    ref, scale = attention_reference(q, k, v)
    got = back(fn(*on(side, q, k, v)), side)
    assert got.dtype == DTYPES[dtype]
    # P rounded to the operands' dtype for P @ V: 2 U of each term of |P| @ |V| (in float32
    # units, as assert_within takes them), and float32 softmax statistics
    flash = 2 * U[dtype] / EPS32 * scale + 64 * np.abs(ref)
    assert_within(got, ref, flash, dtype)


@pytest.mark.device_only
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("sq", "sk"), [(24, 24), (16, 40)])
def test_causal_attention_pattern_runs_on_the_flash_kernel(sq, sk, dtype, side):
    q, k, v = (draw((2, s, 64), dtype, 70 + i) for i, s in enumerate((sq, sk, sk)))
    report = causal.explain(q, k, v)
    assert report.kernels == 1
    assert any("(causal)" in r for r in report.reasons), report.reasons
    ref, scale = attention_reference(q, k, v, mask=np.tri(sq, sk, sk - sq, dtype=bool))
    got = back(causal(*on(side, q, k, v)), side)
    flash = 2 * U[dtype] / EPS32 * scale + 64 * np.abs(ref)  # as the pattern's test above
    assert_within(got, ref, flash, dtype)


@pytest.mark.device_only
@pytest.mark.parametrize(
    ("fn", "shapes", "mask"),
    [
        (causal, (24, 16), lambda sq, sk: np.tri(sq, sk, sk - sq, dtype=bool)),  # Sq > Sk: NaN rows
        (causal_of(k_offset=0), (16, 24), lambda sq, sk: np.tri(sq, sk, 0, dtype=bool)),
        (causal_of(fill=-1e4), (16, 16), lambda sq, sk: np.tri(sq, sk, 0, dtype=bool)),
    ],
    ids=["queries-past-keys", "top-left-diagonal", "finite-fill"],
)
def test_causal_near_misses_are_not_rewritten_and_match_numpy(fn, shapes, mask, side):
    """Not the flash kernel's causal mask: GEMM stages and the composer's kernels, tt.tri
    written by a kernel of its own; NumPy's results, NaN rows included (a row that sees no
    key, where the flash kernel would give zeros)."""
    sq, sk = shapes
    q, k, v = (draw((2, s, 32), "float32", 80 + i) for i, s in enumerate((sq, sk, sk)))
    report = fn.explain(q, k, v)
    assert report.kernels > 1
    assert not any("attention pattern" in r for r in report.reasons), report.reasons
    assert any("tt.tri is written by a kernel of its own" in r for r in report.reasons)
    fill = -1e4 if fn is not causal and sq == sk else -np.inf
    ref, scale = attention_reference(q, k, v, mask=mask(sq, sk), fill=fill)
    got = back(fn(*on(side, q, k, v)), side)
    nan = np.isnan(ref)
    np.testing.assert_array_equal(np.isnan(got), nan)
    ref, scale, got = (np.where(nan, 0, a) for a in (ref, scale, got))  # NaN rows compared
    assert_within(got, ref, 8 * (scale + np.abs(ref)), "float32")


@pytest.mark.parametrize("side", SIDES)
@pytest.mark.parametrize(
    ("n", "m", "k", "dtype"),
    [(5, 7, 0, bool), (6, 4, -1, np.float32), (3, None, 2, float), (4, 4, -9, np.int32),
     (0, 3, 0, bool)],
)  # fmt: skip
def test_tri_is_numpys(n, m, k, dtype, side):
    """tt.tri inside a fused function: numpy.tri's values and dtype, alone and in use."""
    x = draw((n, n if m is None else m), "float32", 90)
    fn = tt.fuse(lambda x: (tt.tri(n, m, k, dtype), tt.where(tt.tri(n, m, k) > 0, x, 0.0)))
    mask, masked = (back(r, side) for r in fn(*on(side, x)))
    assert mask.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(mask, np.tri(n, m, k, dtype))
    np.testing.assert_array_equal(masked, np.where(np.tri(n, m, k) > 0, x, 0.0))
    with pytest.raises(ValueError, match="negative dimensions"):
        tt.fuse(lambda x: tt.tri(-1) + x)(x)
    with pytest.raises(TypeError, match="must be an int"):
        tt.fuse(lambda x: tt.tri(2.5) + x)(x)


def test_a_causal_mask_traced_for_other_shapes_is_numpys_error():
    """A mask written with fixed sizes serves only those: a call with other sequence lengths
    (the same program otherwise) gets NumPy's broadcast error, not another mask."""
    fixed = tt.fuse(
        lambda q, k, v: (
            softmax_rows(
                tt.where(tt.tri(16, 16, 0, bool), q @ tt.swapaxes(k, -1, -2) * 0.125, -np.inf)
            )
            @ v
        )
    )
    q, k, v = (draw((2, 16, 32), "float16", 95 + i) for i in range(3))
    assert fixed.explain(q, k, v).kernels == 1
    q2, k2, v2 = (draw((2, 24, 32), "float16", 98 + i) for i in range(3))
    with pytest.raises(ValueError, match="could not be broadcast"):
        fixed(q2, k2, v2)


@PROFILER
@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_attention_writes_only_its_result(dtype):
    from numba import cuda

    q, k, v = (cuda.to_device(draw((2, s, 32), dtype, 40 + i)) for i, s in enumerate((20, 48, 48)))
    attention(q, k, v)
    planned = attention.explain(q, k, v).bytes_fused
    with tt.sim.profile() as prof:
        attention(q, k, v)
    assert prof.bytes_written == 2 * 20 * 32 * DTYPES[dtype].itemsize  # O alone: no scores
    assert prof.bytes_read + prof.bytes_written == planned


@pytest.mark.parametrize("side", SIDES)
@pytest.mark.parametrize(
    ("fn", "axis", "args"),
    [(attention_over_queries, -2, ()), (attention_scaled_at_run_time, -1, (0.125,))],
)
def test_near_misses_are_not_rewritten_and_match_numpy(fn, axis, args, side):
    q, k, v = (draw((2, s, 32), "float32", 50 + i) for i, s in enumerate((24, 24, 24)))
    report = fn.explain(q, k, v, *args)
    assert report.kernels > 1
    assert not any("attention pattern" in r for r in report.reasons), report.reasons
    ref, scale = attention_reference(q, k, v, axis)
    got = back(fn(*on(side, q, k, v), *args), side)
    # the scores' product, exp's approximation (a few ulp), the row sums: float32 roundings
    assert_within(got, ref, 8 * (scale + np.abs(ref)), "float32")


@pytest.mark.parametrize("side", SIDES)
@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_a_swapped_operand_is_read_in_place(dtype, side):
    x, w = draw((3, 9, 16), dtype, 60), draw((3, 12, 16), dtype, 61)
    fn = tt.fuse(lambda x, w: x @ tt.swapaxes(w, -1, -2) * 2.0)
    # the view is the kernel's operand only: the epilogue reads no array
    assert "extras[" not in fn.explain(x, w).source
    got = back(fn(*on(side, x, w)), side)
    x64, w64 = f64(x, w)
    wt = np.swapaxes(w64, -1, -2)
    assert_within(got, 2 * (x64 @ wt), 2 * product_scale(x64, wt), dtype)


def test_swapaxes_feeds_matmuls_only():
    x = np.ones((4, 6), np.float32)
    with pytest.raises(ValueError, match="matmul operand"):
        tt.fuse(lambda x: tt.swapaxes(x, 0, 1) + 1.0)(x)
    with pytest.raises(np.exceptions.AxisError):
        tt.fuse(lambda x: x @ tt.swapaxes(x, 0, 2))(x)


def test_device_calls_copy_nothing_and_allocate_only_results():
    """GEMM stages (one product, two of one x, several results) and an attention stage on
    device arrays: no host copies; one allocation per result, no temporaries."""
    from numba import cuda

    shapes = ((16, 32), (32, 24), (24,), (16, 24))
    x, w, b, r = (cuda.to_device(draw(s, "float16", 80 + i)) for i, s in enumerate(shapes))
    q, k, v = (cuda.to_device(draw((2, 16, 32), "float16", 90 + i)) for i in range(3))
    for fn, args, allocations in (
        (linear_gelu_times, (x, w, b, r), 1),
        (gated, (x, w, w), 1),
        (fan_out, (x, w, b, r), 4),
        (attention, (q, k, v), 1),
    ):
        fn(*args)  # compiled outside the count
        with tt.sim.transfers() as counts:
            got = fn(*args)
        assert counts == {"to_device": 0, "copy_to_host": 0, "device_array": allocations}
        results = got if isinstance(got, tuple) else (got,)
        assert len(results) == allocations
        assert all(type(g) is type(x) for g in results)


@pytest.mark.parametrize("side", SIDES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_nan_and_infinities_follow_ieee_as_numpy(dtype, side):
    """A NaN in a row of x makes its row NaN; an infinity gives ±inf, or NaN where +inf meets
    -inf in the sum; a residual's infinity passes through the epilogue; values near the
    dtype's largest stay finite where NumPy's do."""
    x, w, r = draw((6, 16), dtype, 100), draw((16, 8), dtype, 101, 0.25), draw((6, 8), dtype, 102)
    big = float(ml_dtypes.finfo(DTYPES[dtype]).max) / 64
    x[0, 3], x[1, 5], x[2, :] = np.nan, np.inf, 1.0
    w[:, 0] = np.abs(w[:, 0])  # row 1's +inf meets only positive weights in column 0
    r[3, 2], r[4, 4], r[5, 1] = np.inf, -np.inf, big
    fn = tt.fuse(lambda x, w, r: tt.relu(x @ w) + r)
    got = np.asarray(back(fn(*on(side, x, w, r)), side), np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        ref = np.maximum(np.matmul(*f64(x, w)), 0) + np.float64(r)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
    np.testing.assert_array_equal(np.isposinf(got), np.isposinf(ref))
    np.testing.assert_array_equal(np.isneginf(got), np.isneginf(ref))
    finite = np.isfinite(ref)
    scale = product_scale(*f64(x, w)) + 2 * np.abs(ref)
    assert_within(got[finite], ref[finite], scale[finite], dtype)
