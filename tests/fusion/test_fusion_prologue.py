"""Operand prologues (issue 24): a matmul operand inside ``@tt.fuse`` that is an elementwise
chain over one array of its dtype (``tt.relu(x) @ w``) is computed by the GEMM kernel on each
tile as it lands in shared memory: one kernel, the operand never written. Results against NumPy
in float64, on host and device arrays; the near misses split, with the reason.

Tolerance, per element (``test_fusion_matmul``'s ``assert_within``): the chain's float32 error
(each op's rounding, propagated by the ops' derivative bounds), the operand's one rounding to its
dtype (the composer computes the chain in float32 and rounds once, where the operand is stored),
and the product's ``K`` roundings, each carried through the product by the other operand's
magnitudes.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import SIDES, back, on, on_sm90a
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from test_fusion_matmul import (
    BINARY,
    DTYPES,
    EPS32,
    PROFILER,
    SLACK,
    UNARY,
    U,
    assert_within,
    draw,
    f64,
    product_scale,
    reference,
)

import tessera_tile as tt


def build(tree, v):
    """The tree on the traced operand ``v``."""
    if not isinstance(tree, tuple):
        return v if tree == "v" else tree
    if tree[0] in UNARY:
        return UNARY[tree[0]][0](build(tree[1], v))
    return BINARY[tree[0]][0](build(tree[1], v), build(tree[2], v))


def chains():
    """1 to 4 ops over the operand ``v`` and constants, every op reading ``v`` (an op of
    constants alone would be a float64 scalar: test_fusion_matmul's every_op_reads_an_array)."""
    return st.recursive(
        st.sampled_from(["v", "v", 0.5, 3.0]),
        lambda sub: st.one_of(
            st.tuples(st.sampled_from(sorted(UNARY)), sub),
            st.tuples(st.sampled_from(sorted(BINARY)), sub, sub),
        ),
        max_leaves=4,
    ).filter(lambda t: isinstance(t, tuple) and _every_op_reads_v(t))


def _reads_v(tree) -> bool:
    return any(_reads_v(t) for t in tree[1:]) if isinstance(tree, tuple) else tree == "v"


def _every_op_reads_v(tree) -> bool:
    if not isinstance(tree, tuple):
        return True
    return _reads_v(tree) and all(_every_op_reads_v(t) for t in tree[1:])


def operand(tree, x64, dtype):
    """``(value, error scale)`` of a prologue operand: the chain's float32 error and the one
    rounding to ``dtype``, in ``assert_within``'s units of ``EPS32 * SLACK``."""
    if tree is None:
        return x64, np.zeros_like(x64)
    value, scale = reference(tree, {"v": (x64, 0.0)})
    return value, scale + U[dtype] / (EPS32 * SLACK) * np.abs(value)


def product_reference(a, b):
    """``(reference, scale)`` of ``a @ b`` from operands given as ``(value, scale)``."""
    (va, sa), (vb, sb) = a, b
    scale = product_scale(va, vb) + sa @ np.abs(vb) + np.abs(va) @ sb + sa @ sb
    return va @ vb, scale


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    chain=chains(),
    on_a=st.booleans(),
    on_b=st.booleans(),
    dtype=st.sampled_from(sorted(DTYPES)),
    m=st.integers(1, 40),
    n=st.integers(1, 40),
    k=st.integers(1, 40),
    side=st.sampled_from(SIDES),
)
@example(  # past a 128 x 128 tile both ways and a k-tile, cp.async tiles on the tensor cores
    chain=("add", ("gelu", "v"), 0.5), on_a=True, on_b=True,
    dtype="float16", m=129, n=130, k=40, side="device",
)  # fmt: skip
@example(  # K not a multiple of 8: the tensor cores' synchronous staging
    chain=("mul", ("silu", "v"), 3.0), on_a=True, on_b=False,
    dtype="bfloat16", m=65, n=33, k=27, side="host",
)  # fmt: skip
@example(  # SIMT float32: two row tiles, two column tiles, a partial k-tile
    chain=("maximum", ("tanh", "v"), ("neg", "v")), on_a=False, on_b=True,
    dtype="float32", m=129, n=65, k=9, side="device",
)  # fmt: skip
def test_random_prologue_chains_match_numpy(chain, on_a, on_b, dtype, m, n, k, side):
    x, w = draw((m, k), dtype, m), draw((k, n), dtype, n, k**-0.5)
    pro_a, pro_b = (chain if applied else None for applied in (on_a, on_b))
    fn = tt.fuse(lambda x, w: (build(pro_a, x) if on_a else x) @ (build(pro_b, w) if on_b else w))
    x64, w64 = f64(x, w)
    ref, scale = product_reference(operand(pro_a, x64, dtype), operand(pro_b, w64, dtype))
    report = fn.explain(x, w)
    assert report.kernels == 1, report.reasons
    for name, applied in (("a", on_a), ("b", on_b)):
        assert (f"prologue on {name}" in report.stages[0]) == applied, report.stages
    got = back(fn(*on(side, x, w)), side)
    assert_within(got, ref, scale, dtype)


@pytest.mark.device_only
@pytest.mark.parametrize(
    ("dtype", "precision", "k"),
    [
        ("float16", None, 40),  # cp.async tiles, the last k-tile partial
        ("float16", None, 9),  # the synchronous staging, a partial chunk
        ("bfloat16", None, 40),
        ("float32", None, 9),  # SIMT
        ("float32", "tf32", 36),
    ],
)
def test_the_fill_past_k_is_not_transformed(dtype, precision, k, side):
    """``1 / x`` is inf at 0, and the tiles past K are zero-filled: were the fill transformed,
    inf * 0 would make every result NaN. With a 0 in x, NumPy's row of infinities."""
    rng = np.random.default_rng(k)
    x = (rng.uniform(0.5, 2.0, (20, k)) * rng.choice([-1, 1], (20, k))).astype(DTYPES[dtype])
    w = (rng.uniform(0.5, 2.0, (k, 24))).astype(DTYPES[dtype])
    x[3, 1] = 0  # 1 / x: +inf in row 3, against positive weights: +inf
    fn = tt.fuse(lambda x, w: (1 / x) @ (1 / w), precision=precision)
    assert fn.explain(x, w).kernels == 1
    got = np.asarray(back(fn(*on(side, x, w)), side), np.float64)
    x64, w64 = f64(x, w)
    with np.errstate(divide="ignore"):
        ref = (1 / x64) @ (1 / w64)
    np.testing.assert_array_equal(np.isposinf(got), np.isposinf(ref))
    assert not np.isnan(got).any()
    finite = np.isfinite(ref)  # every row but row 3
    # each operand 1 / v: the division's float32 rounding and the one to the dtype (TF32: each
    # input read with 10 mantissa bits, docs/matmul.md)
    rounding = 1 / SLACK + U[dtype] / (EPS32 * SLACK) + (2.0**13 / SLACK if precision else 0)
    a, b = 1 / np.where(x64 == 0, 1, x64), 1 / w64
    _, scale = product_reference((a, rounding * np.abs(a)), (b, rounding * np.abs(b)))
    assert_within(got[finite], ref[finite], scale[finite], dtype)


@PROFILER
@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_the_operand_is_never_written(dtype):
    """The simulator's traffic is the plan's, the plain product's bytes: the kernel reads x
    where ``x @ w`` reads it, and writes the result only; the passes over the tiles are free
    of bank conflicts."""
    from numba import cuda

    m, k, n = 48, 32, 72
    x, w = (cuda.to_device(draw(s, dtype, 30 + i)) for i, s in enumerate(((m, k), (k, n))))
    fn, plain = tt.fuse(lambda x, w: tt.relu(x) @ tt.abs(w)), tt.fuse(lambda x, w: x @ w)
    for f in (fn, plain):
        f(x, w)  # compiled
    with tt.sim.profile() as prof:
        fn(x, w)
    planned = fn.explain(x, w).bytes_fused
    assert prof.bytes_read + prof.bytes_written == planned == plain.explain(x, w).bytes_fused
    assert prof.bytes_written == m * n * DTYPES[dtype].itemsize
    assert prof.bank_conflicts == 0 and prof.races == [], str(prof)


@pytest.mark.parametrize("side", SIDES)
def test_inputs_are_never_modified_and_device_calls_copy_nothing(side):
    """The prologue rewrites shared-memory tiles only: x and w are as they were; on device
    arrays nothing is copied and the result is the one allocation."""
    x, w = draw((24, 40), "float16", 40), draw((40, 16), "float16", 41)
    before = [a.copy() for a in (x, w)]
    fn = tt.fuse(lambda x, w: tt.sigmoid(x) @ (w * 2.0 - 1.0))
    args = on(side, x, w)
    fn(*args)  # compiled outside the count
    with tt.sim.transfers() as counts:
        fn(*args)
    if side == "device":
        assert counts == {"to_device": 0, "copy_to_host": 0, "device_array": 1}
    for arg, was in zip(args, before, strict=True):
        np.testing.assert_array_equal(back(arg, side), was)


@pytest.mark.parametrize("side", SIDES)
def test_on_sm90a_a_prologue_runs_on_the_mma_sync_kernel(side):
    """The wgmma kernel's tensor cores read its tiles as they land: with a prologue the stage
    takes the mma.sync kernel, and says so."""
    x, w = draw((64, 64), "float16", 42), draw((64, 64), "float16", 43)
    fn = tt.fuse(lambda x, w: tt.relu(x) @ w)
    with on_sm90a():
        report = fn.explain(x, w)
        got = back(fn(*on(side, x, w)), side)
    assert "an operand prologue: the mma.sync kernel" in report.stages[0], report.stages
    x64, w64 = f64(x, w)
    a = np.maximum(x64, 0)
    ref, scale = product_reference((a, np.zeros_like(a)), (w64, np.zeros_like(w64)))
    assert_within(got, ref, scale, "float16")


# near misses: the operand runs in an earlier kernel (float32: the operand written by one kernel
# is the same float32 value the next reads)


def _narrowing(x, w, w16):  # float32 x cast into a float16 operand: more bytes read
    return x.astype(np.float16) @ w16


# function, its third argument (y: a (16, 16) array, w3 and w16: (16, 24) ones, float32 and
# float16, s: a scalar), kernels, whether the GEMM stage computes the operand as a prologue
NEAR_MISSES = {
    # a result of its own kernel (it does not read the product); the GEMM reads x, not it
    "also a result": (lambda x, w: (tt.relu(x) @ w, tt.relu(x)), None, 2, True),
    "a scalar argument": (lambda x, w, s: tt.relu(x * s) @ w, "s", 2, False),
    "two arrays": (lambda x, w, y: (x + tt.relu(y)) @ w, "y", 2, False),
    "a reduction": (lambda x, w: (x - tt.max(x, axis=-1, keepdims=True)) @ w, None, 2, False),
    "two products": (lambda x, w, w3: tt.relu(x) @ w * (tt.relu(x) @ w3), "w3", 2, False),
    "a narrowing cast": (_narrowing, "w16", 2, False),
}


def _near_miss_references(name, x64, w64, third=None) -> list:
    """``(reference, error scale)`` of each result: the product's, and one rounding of each
    operand element computed in float32 (``|a| @ |w|``)."""

    def product(a, w):
        return a @ w, product_scale(a, w) + np.abs(a) @ np.abs(w)

    relu = np.maximum(x64, 0)
    if name == "two products":
        (p1, s1), (p3, s3) = product(relu, w64), product(relu, third)
        return [(p1 * p3, s1 * np.abs(p3) + s3 * np.abs(p1) + np.abs(p1 * p3))]
    return {
        "also a result": lambda: [product(relu, w64), (relu, np.abs(relu))],
        "a scalar argument": lambda: [product(np.maximum(x64 * third, 0), w64)],
        "two arrays": lambda: [product(x64 + np.maximum(third, 0), w64)],
        "a reduction": lambda: [product(x64 - x64.max(-1, keepdims=True), w64)],
        "a narrowing cast": lambda: [product(x64.astype(np.float16).astype(np.float64), third)],
    }[name]()


@pytest.mark.device_only
@pytest.mark.parametrize("name", NEAR_MISSES)
def test_near_misses_run_the_operand_in_an_earlier_kernel(name, side):
    f, third, kernels, prologue = NEAR_MISSES[name]
    x, w = draw((16, 16), "float32", 44), draw((16, 24), "float32", 45)
    extra = {"s": [np.float32(0.75)], "y": [draw((16, 16), "float32", 46)], None: []}
    extra["w3"], extra["w16"] = draw((16, 24), "float32", 47), draw((16, 24), "float16", 47)
    extra["w3"], extra["w16"] = [extra["w3"]], [extra["w16"]]
    args = (x, w, *extra[third])
    fn = tt.fuse(f)
    report = fn.explain(*args)
    assert report.kernels == kernels, report.reasons
    assert ("prologue on a" in " ".join(report.stages)) == prologue, report.stages
    if not prologue:
        assert any("a matmul operand that is computed" in r for r in report.reasons), report
    got = fn(*on(side, *(a for a in args if a.ndim)), *(a for a in args if not a.ndim))
    results = got if isinstance(got, tuple) else (got,)
    refs = _near_miss_references(name, *f64(x, w), *f64(*extra[third]))
    assert len(results) == len(refs)
    for g, (ref, scale) in zip(results, refs, strict=True):
        got = back(g, side)
        assert_within(got, ref, scale, str(got.dtype))


# casts on the way in: an array of no more bytes than the operand's dtype, converted where the
# synchronous staging loads it


def _to(dtype):
    return lambda v: v.astype(DTYPES[dtype])


# function, the arrays' dtypes, the operands' (and the result's) dtype, the prologue's operand
CASTS = {
    "float16 into float32": (
        lambda x, w: x.astype(np.float32) @ w,
        ("float16", "float32"),
        "float32",
        "a",
    ),
    "promoted as NumPy": (lambda x, w: x @ w, ("float16", "float32"), "float32", "a"),
    "bfloat16 into float32": (
        lambda x, w: x @ w.astype(np.float32),
        ("float32", "bfloat16"),
        "float32",
        "b",
    ),
    "float16 into bfloat16": (
        lambda x, w: _to("bfloat16")(x) @ w,
        ("float16", "bfloat16"),
        "bfloat16",
        "a",
    ),
    "bool into float16": (
        lambda x, w: x @ w.astype(np.float16),
        ("float16", "bool"),
        "float16",
        "b",
    ),
    "int32 into float32": (
        lambda x, w: tt.relu(x.astype(np.float32)) @ w,
        ("int32", "float32"),
        "float32",
        "a",
    ),
}


def _cast_input(shape, dtype, seed):
    rng = np.random.default_rng(seed)
    if dtype == "bool":
        return rng.integers(0, 2, shape).astype(bool)
    if dtype == "int32":
        return rng.integers(-1000, 1000, shape).astype(np.int32)
    return draw(shape, dtype, seed)


@pytest.mark.device_only
@pytest.mark.parametrize("name", CASTS)
def test_widening_casts_are_prologues(name, side):
    f, dtypes, dtype, operand_name = CASTS[name]
    x, w = _cast_input((33, 40), dtypes[0], 48), _cast_input((40, 24), dtypes[1], 49)
    fn = tt.fuse(f)
    report = fn.explain(x, w)
    assert report.kernels == 1, report.reasons
    assert f"prologue on {operand_name}" in report.stages[0], report.stages
    assert "cast on its way in" in report.stages[0], report.stages
    got = back(fn(*on(side, x, w)), side)
    x64, w64 = f64(x, w)
    if name == "int32 into float32":
        x64 = np.maximum(x64, 0)
    ref = x64 @ w64
    assert got.dtype == DTYPES[dtype]
    # the cast operand's one rounding to the operands' dtype (exact but for float16 into
    # bfloat16)
    rounding = U[dtype] / (EPS32 * SLACK)
    _, scale = product_reference((x64, rounding * np.abs(x64)), (w64, rounding * np.abs(w64)))
    assert_within(got, ref, scale, dtype)


@PROFILER
def test_a_cast_operand_is_read_at_its_own_width():
    """``x16.astype(np.float32) @ w``: x is read as float16, 2 bytes an element per tile of C,
    the plan's bytes; a float32 x would be twice that."""
    from numba import cuda

    m, k, n = 48, 32, 72
    x16, w = draw((m, k), "float16", 50), draw((k, n), "float32", 51)
    fn = tt.fuse(lambda x, w: x.astype(np.float32) @ w)
    args = cuda.to_device(x16), cuda.to_device(w)
    fn(*args)  # compiled
    with tt.sim.profile() as prof:
        fn(*args)
    planned = fn.explain(*args).bytes_fused
    wide = tt.fuse(lambda x, w: x @ w).explain(x16.astype(np.float32), w).bytes_fused
    assert prof.bytes_read + prof.bytes_written == planned
    traffic = {arg: rw for (_, arg), rw in prof.traffic.items()}
    assert traffic["a"][0] % (m * k * 2) == 0  # x's float16 bytes, once per column of C tiles
    assert planned == wide - traffic["a"][0]  # float32 x: twice the bytes


@pytest.mark.parametrize("side", SIDES)
@pytest.mark.parametrize(
    ("a_shape", "b_shape", "on_b"),
    [
        ((2, 5, 7), (7, 3), False),  # a batch against one matrix
        ((2, 1, 5, 7), (3, 7, 4), True),  # batches broadcast
        ((7,), (7, 3), False),  # a vector on the left
        ((5, 7), (7,), True),  # on the right
    ],
)
def test_batches_and_vectors_follow_numpy(a_shape, b_shape, on_b, side):
    x, w = draw(a_shape, "float32", 52), draw(b_shape, "float32", 53)
    fn = tt.fuse(lambda x, w: x @ tt.abs(w) if on_b else tt.sigmoid(x) @ w)
    assert fn.explain(x, w).kernels == 1
    x64, w64 = f64(x, w)
    a, b = (x64, np.abs(w64)) if on_b else (1 / (1 + np.exp(-x64)), w64)
    ref = np.matmul(a, b)
    got = back(fn(*on(side, x, w)), side)
    assert np.shape(got) == ref.shape
    # sigmoid: libdevice's exp, a few ulp; the product's roundings
    assert_within(got, ref, np.matmul(np.abs(a), np.abs(b)) * (a.shape[-1] + 4), "float32")


def test_a_warp_specialised_choice_runs_as_its_8_warp_twin(monkeypatch):
    """On sm_90a the tuner may choose a warp-specialised wgmma tile (12 warps, as a GPU timing
    would): with a prologue the stage runs the mma.sync kernel of that tile with 8 warps."""
    from tessera_tile.kernels.matmul import calls as _matmul
    from tessera_tile.tile_config import WARP_SPECIALISED, TileConfig

    x, w = draw((64, 64), "float16", 54), draw((64, 64), "float16", 55)
    producer = TileConfig(128, 128, 64, WARP_SPECIALISED, 3, dtype="float16")
    for method in ("expected", "choose"):
        monkeypatch.setattr(_matmul.TUNED_MATMUL, method, lambda *args: producer)
    fn = tt.fuse(lambda x, w: tt.relu(x) @ w)
    with on_sm90a():
        stage = fn.explain(x, w).stages[0]
        got = back(fn(*on("device", x, w)), "device")
    assert "tile 128x128x64, 8 warps, 3 stages" in stage, stage
    a, w64 = np.maximum(f64(x)[0], 0), f64(w)[0]
    ref, scale = product_reference((a, np.zeros_like(a)), (w64, np.zeros_like(w64)))
    assert_within(got, ref, scale, "float16")
