"""Property tests of @tt.fuse against NumPy: random expression trees over random shapes.

An expression tree is drawn once and turned into two functions: one on traced values
(``tessera_tile``) and one on NumPy arrays. Results must agree in shape, dtype and value.

Tolerances, per result dtype: float64 rtol 1e-9; float32 rtol 2e-4; float16 rtol 2e-2; each
with an absolute term of the same size times the largest magnitude in the reference (sums of
random-sign terms cancel, so a relative bound alone would be meaningless near zero). Integers
and booleans must match exactly.
"""

import math
import warnings
from functools import partial

import numpy as np
import pytest
from helpers import SIDES, back, on
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import tessera_tile as tt
from tessera_tile.kernels.epilogue import reference as activation_reference
from tessera_tile.tile_ir import ACTIVATIONS

RTOL = {np.float64: 1e-9, np.float32: 2e-4, np.float16: 2e-2}

UNARY = {
    "neg": (lambda x: -x, lambda x: -x),
    "abs": (tt.abs, np.abs),
    "tanh": (tt.tanh, np.tanh),
    "sin": (tt.sin, np.sin),
    "sigmoid": (tt.sigmoid, lambda x: 1 / (1 + np.exp(-x))),
    "square": (tt.square, np.square),
    "exp": (tt.exp, np.exp),
    "relu": (tt.relu, ACTIVATIONS["relu"].numpy),
}
BINARY = {
    "add": (lambda a, b: a + b, lambda a, b: a + b),
    "sub": (lambda a, b: a - b, lambda a, b: a - b),
    "mul": (lambda a, b: a * b, lambda a, b: a * b),
    "maximum": (tt.maximum, np.maximum),
    "minimum": (tt.minimum, np.minimum),
    "where_gt": (lambda a, b: tt.where(a > b, a, b), lambda a, b: np.where(a > b, a, b)),
}
REDUCE = {
    "sum": (tt.sum, np.sum),
    "max": (tt.max, np.max),
    "min": (tt.min, np.min),
    "mean": (tt.mean, np.mean),
}


def trees(n_inputs: int, depth: int):
    leaf = st.one_of(
        st.tuples(st.just("input"), st.integers(0, n_inputs - 1)),
        st.tuples(
            st.just("const"), st.sampled_from([0.5, 2, -1.25, math.nan, math.inf, -math.inf])
        ),
    )
    if depth == 0:
        return leaf
    sub = trees(n_inputs, depth - 1)
    return st.one_of(
        leaf,
        st.tuples(st.just("unary"), st.sampled_from(sorted(UNARY)), sub),
        st.tuples(st.just("binary"), st.sampled_from(sorted(BINARY)), sub, sub),
        st.tuples(
            st.just("reduce"),
            st.sampled_from(sorted(REDUCE)),
            sub,
            st.sampled_from([None, 0, -1, (0, 1)]),
            st.booleans(),
        ),
    )


def evaluate(tree, args, lib: int, dtypes: set | None = None):
    """lib 0: tessera_tile on traced values; lib 1: NumPy. ``dtypes`` collects the dtypes of
    every intermediate NumPy result."""
    value = _evaluate(tree, args, lib, dtypes)
    if dtypes is not None and hasattr(value, "dtype"):
        dtypes.add(np.dtype(value.dtype))
    return value


def _constant(x) -> bool:
    """A Python number from a constant-only subtree (a NumPy scalar, e.g. a full reduction's
    result, is data, although np.float64 subclasses float)."""
    return type(x) in (int, float)


def _evaluate(tree, args, lib: int, dtypes):
    kind = tree[0]
    if kind == "input":
        return args[tree[1]]
    if kind == "const":
        return tree[1]
    if kind == "unary":
        x = evaluate(tree[2], args, lib, dtypes)
        if _constant(x):
            return x  # keep constant-only subtrees out of the generated kernel
        return UNARY[tree[1]][lib](x)
    if kind == "binary":
        a, b = evaluate(tree[2], args, lib, dtypes), evaluate(tree[3], args, lib, dtypes)
        if _constant(a) and _constant(b):
            return a
        if tree[1] == "where_gt" and _constant(a):
            a, b = b, a  # where() needs an array condition
        return BINARY[tree[1]][lib](a, b)
    x = evaluate(tree[2], args, lib, dtypes)
    if _constant(x):
        return x
    axis, keepdims = tree[3], tree[4]
    ndim = len(x.shape)
    if axis is not None:
        axes = (axis,) if isinstance(axis, int) else axis
        if any(not -ndim <= a < ndim for a in axes):
            axis = None  # this draw's axis does not exist at this rank
    if tree[1] in ("max", "min"):
        reduced = range(ndim) if axis is None else ((axis,) if isinstance(axis, int) else axis)
        if any(x.shape[a] == 0 for a in reduced):
            return x  # NumPy raises on empty max; checked in its own test
    return REDUCE[tree[1]][lib](x, axis=axis, keepdims=keepdims)


shapes = st.sampled_from(
    [(5,), (1,), (3, 4), (3, 1), (1, 4), (2, 3, 4), (0, 4), (4, 33), (33,), (2, 1, 5)]
)


@st.composite
def problems(draw):
    n_inputs = draw(st.integers(1, 3))
    base = draw(shapes)
    arg_shapes = []
    for _ in range(n_inputs):
        # broadcastable variants of the base shape: drop leading axes or set some to 1
        drop = draw(st.integers(0, len(base) - 1)) if base else 0
        shape = [1 if draw(st.booleans()) and n != 0 else n for n in base[drop:]]
        arg_shapes.append(tuple(shape))
    arg_shapes[0] = base
    dtype = draw(st.sampled_from([np.float32, np.float64, np.float16, np.int32, np.int64, bool]))
    seed = draw(st.integers(0, 2**16))
    rng = np.random.default_rng(seed)
    if dtype is bool:
        args = [rng.uniform(-2, 2, s) > 0 for s in arg_shapes]
    elif np.issubdtype(dtype, np.integer):
        args = [rng.integers(-3, 4, s).astype(dtype) for s in arg_shapes]
    else:
        args = [rng.uniform(-2, 2, s).astype(dtype) for s in arg_shapes]
    tree = draw(trees(n_inputs, 3))
    return tree, args


def assert_matches(got, ref):
    ref = np.asarray(ref)
    assert got.shape == ref.shape, (got.shape, ref.shape)
    assert got.dtype == ref.dtype, (got.dtype, ref.dtype)
    if ref.dtype.kind == "f":
        rtol = RTOL[ref.dtype.type]
        finite = ref[np.isfinite(ref)]
        scale = float(np.max(np.abs(finite), initial=1.0))
        np.testing.assert_allclose(got, ref, rtol=rtol, atol=rtol * scale, equal_nan=True)
    else:
        np.testing.assert_array_equal(got, ref)


@settings(max_examples=60)  # cheap: mostly tiny elementwise kernels
@given(problems(), st.sampled_from(SIDES))
def test_random_expression_trees_match_numpy(problem, side):
    tree, args = problem

    def fn(*xs):
        return evaluate(tree, xs, 0)

    fused = tt.fuse(fn)
    seen: set = set()
    try:
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # NumPy's "mean of empty slice"
            ref = evaluate(tree, args, 1, seen)
    except ValueError:  # NumPy cannot broadcast the shapes: neither may we
        with pytest.raises(ValueError, match="broadcast"):
            fused(*args)
        return
    except TypeError:  # NumPy refuses the dtypes (-bool): so do we
        with pytest.raises(TypeError):
            fused(*args)
        return
    if not seen <= set(tt.tile_ir.SUPPORTED_DTYPES):  # e.g. square(bool) is int8
        with pytest.raises(TypeError, match="does not support"):
            fused(*args)
        return
    assume(isinstance(ref, np.ndarray | np.generic) and not _constant(ref))
    assume(np.ndim(ref) >= 0 and tree[0] not in ("const",))
    if not isinstance(ref, np.ndarray):
        ref = np.asarray(ref)
    copies = [a.copy() for a in args]
    inputs = on(side, *args)
    got = back(fused(*inputs), side)
    assert_matches(got, ref)
    inputs = [i.copy_to_host() if hasattr(i, "copy_to_host") else i for i in inputs]
    for a, c in zip(inputs, copies, strict=True):
        np.testing.assert_array_equal(a, c)  # inputs are never modified


@given(
    a=st.lists(st.integers(-50, 50), min_size=1, max_size=40),
    b=st.lists(st.integers(-7, 7), min_size=1, max_size=40),
    dtype=st.sampled_from([np.int32, np.int64]),
)
def test_integer_division_and_modulo_follow_numpy_signs(a, b, dtype):
    n = min(len(a), len(b))
    x, y = np.array(a[:n], dtype), np.array(b[:n], dtype)

    @tt.fuse
    def divmod_(x, y):
        return x // y, x % y, x / y

    q, r, t = divmod_(x, y)
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(q, x // y)
        np.testing.assert_array_equal(r, x % y)
        np.testing.assert_allclose(t, x / y, equal_nan=True)
    assert q.dtype == dtype and t.dtype == np.float64


@given(
    a=st.lists(st.floats(-100, 100, allow_nan=False, width=64), min_size=1, max_size=30),
    b=st.sampled_from([3.0, -3.0, 0.5, -0.5, 0.0, 7.25]),
)
def test_float_floor_division_and_remainder(a, b):
    x = np.array(a)

    @tt.fuse
    def fdm(x, b):
        return x // b, x % b

    q, r = fdm(x, b)
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(q, x // b)
        np.testing.assert_allclose(r, x % b, rtol=1e-12, atol=1e-12, equal_nan=True)


@given(dtype=st.sampled_from(["bool", "int32", "int64", "float16", "float32", "float64"]))
def test_promotion_with_weak_python_scalars(dtype):
    x = np.arange(6).reshape(2, 3).astype(dtype)

    @tt.fuse
    def mixed(x, s):
        return x + 1, x * 2.5, x + s, tt.astype(x, np.float32) * x

    got = mixed(x, 3)
    ref = (x + 1, x * 2.5, x + 3, x.astype(np.float32) * x)
    for g, r in zip(got, ref, strict=True):
        assert g.dtype == r.dtype, (dtype, g.dtype, r.dtype)
        np.testing.assert_allclose(g.astype(np.float64), r.astype(np.float64), rtol=1e-3)


def test_every_elementwise_function_matches_numpy():
    x = np.linspace(-3, 3, 37).astype(np.float32)
    x[5] = np.nan
    x[6] = np.inf
    erf = np.vectorize(math.erf)
    cases = {
        "exp": (tt.exp, np.exp),
        "exp2": (tt.exp2, np.exp2),
        "log": (tt.log, np.log),
        "log2": (tt.log2, np.log2),
        "log1p": (tt.log1p, np.log1p),
        "expm1": (tt.expm1, np.expm1),
        "sqrt": (tt.sqrt, np.sqrt),
        "rsqrt": (tt.rsqrt, lambda v: 1 / np.sqrt(v)),
        "sin": (tt.sin, np.sin),
        "cos": (tt.cos, np.cos),
        "tanh": (tt.tanh, np.tanh),
        "erf": (tt.erf, lambda v: erf(v).astype(np.float32)),
        "sigmoid": (tt.sigmoid, lambda v: 1 / (1 + np.exp(-v))),
        "floor": (tt.floor, np.floor),
        "ceil": (tt.ceil, np.ceil),
        "square": (tt.square, np.square),
        "relu": (tt.relu, partial(activation_reference, "relu")),
        "gelu": (tt.gelu, partial(activation_reference, "gelu")),
        "gelu_tanh": (
            lambda v: tt.gelu(v, approximate="tanh"),
            partial(activation_reference, "gelu_tanh"),
        ),
        "silu": (tt.silu, partial(activation_reference, "silu")),
        "isnan": (tt.isnan, np.isnan),
        "isinf": (tt.isinf, np.isinf),
        "isfinite": (tt.isfinite, np.isfinite),
        "clip": (lambda v: tt.clip(v, -1, 0.5), lambda v: np.clip(v, -1, 0.5)),
        "abs": (tt.abs, np.abs),
    }
    for name, (ours, theirs) in cases.items():
        with np.errstate(all="ignore"):
            ref = np.asarray(theirs(x))
            if ref.dtype != np.bool_:
                ref = ref.astype(np.float32)
            got = tt.fuse(ours)(x)
        assert got.dtype == ref.dtype, name
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6, equal_nan=True, err_msg=name)


REDUCTIONS = {
    "sum": (tt.sum, np.sum),
    "prod": (tt.prod, np.prod),
    "max": (tt.max, np.max),
    "min": (tt.min, np.min),
    "mean": (tt.mean, np.mean),
    "var": (tt.var, np.var),
    "std": (tt.std, np.std),
    "any": (tt.any, np.any),
    "all": (tt.all, np.all),
    "logsumexp": (
        tt.logsumexp,
        lambda x, axis, keepdims: np.log(
            np.sum(np.exp(x.astype(np.float64)), axis, keepdims=keepdims)
        ),
    ),
}


@given(
    name=st.sampled_from(sorted(REDUCTIONS)),
    dtype=st.sampled_from(["bool", "int32", "int64", "float16", "float32", "float64"]),
    shape=st.sampled_from([(7,), (3, 5), (2, 3, 4), (1, 6), (33, 2), (3, 8)]),
    axis=st.sampled_from([None, 0, -1, (0, -1)]),
    keepdims=st.booleans(),
    seed=st.integers(0, 2**16),
    side=st.sampled_from(SIDES),
)
def test_every_reduction_matches_numpy(name, dtype, shape, axis, keepdims, seed, side):
    x = np.random.default_rng(seed).uniform(-3, 3, shape)
    x = (x > 0) if dtype == "bool" else x.astype(dtype)
    if isinstance(axis, tuple) and len(shape) < 2:
        axis = None
    ours, theirs = REDUCTIONS[name]
    try:
        with np.errstate(all="ignore"):
            ref = np.asarray(theirs(x, axis=axis, keepdims=keepdims))
    except TypeError:
        with pytest.raises(TypeError):
            tt.fuse(lambda v: ours(v, axis=axis, keepdims=keepdims))(x)
        return
    got = back(tt.fuse(lambda v: ours(v, axis=axis, keepdims=keepdims))(*on(side, x)), side)
    if name == "logsumexp":
        ref = ref.astype(got.dtype)
    assert_matches(got, ref)


@given(
    dtype=st.sampled_from(["bool", "int32", "int64", "float16", "float32", "float64"]),
    shape=st.sampled_from([(7,), (3, 5), (1, 6), (33, 2), (3, 8)]),  # rows of 8: 16-byte loads
    axis=st.sampled_from([None, 0, -1]),
    seed=st.integers(0, 2**16),
    side=st.sampled_from(SIDES),
)
def test_argmax_and_argmin_match_numpy_with_ties(dtype, shape, axis, seed, side):
    x = np.random.default_rng(seed).integers(-2, 3, shape)  # few values: many ties
    x = (x > 0) if dtype == "bool" else x.astype(dtype)

    @tt.fuse
    def args(v):
        return tt.argmax(v, axis=axis), tt.argmin(v, axis=axis, keepdims=True)

    amax, amin = back(args(*on(side, x)), side)
    np.testing.assert_array_equal(amax, np.argmax(x, axis=axis))
    np.testing.assert_array_equal(amin, np.argmin(x, axis=axis, keepdims=True))
    assert amax.dtype == np.int64


@given(
    shape=st.sampled_from([(1, 3), (5, 4), (33, 2), (70, 3)]),
    specials=st.lists(
        st.tuples(
            st.integers(0, 69), st.integers(0, 3), st.sampled_from([np.inf, -np.inf, np.nan, 30.0])
        ),
        max_size=4,
    ),
    dtype=st.sampled_from([np.float32, np.float64]),
    seed=st.integers(0, 2**16),
)
def test_softmax_over_columns_folds_max_and_sum_like_two_passes(shape, specials, dtype, seed):
    """Column reductions never keep the data on chip: the normaliser is computed online."""
    x = np.random.default_rng(seed).standard_normal(shape).astype(dtype)
    for i, j, v in specials:
        x[i % shape[0], j % shape[1]] = v

    @tt.fuse
    def softmax0(v):
        e = tt.exp(v - tt.max(v, axis=0, keepdims=True))
        return e / tt.sum(e, axis=0, keepdims=True)

    with np.errstate(all="ignore"):
        e = np.exp(x - x.max(0, keepdims=True))
        ref = e / e.sum(0, keepdims=True)
    assert softmax0.explain(x).stages[0].count("2 pass(es)") == 1
    np.testing.assert_allclose(softmax0(x), ref, rtol=RTOL[dtype] * 10, atol=1e-12, equal_nan=True)
