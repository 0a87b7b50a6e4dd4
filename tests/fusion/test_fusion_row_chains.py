"""Fused row chains in the 16-bit dtypes against NumPy: the transformer block's fusions.

Several row inputs and broadcast operands (a row vector such as a bias, a column vector, a
Python scalar) combine elementwise, then feed row reductions, reduce-then-broadcast patterns,
a softmax or a layer norm. The widths cover every way a row kernel keeps a row: in a warp's
registers, in shared memory between passes (a warp or a block per row), and read again by each
pass (too long to keep); ``test_the_widths_cover_every_row_variant`` checks they do.

Reference: float64 NumPy on the same 16-bit inputs. Tolerance, per result dtype: ``rtol``
relative, plus ``rtol`` times the largest magnitude of the reference and of the chain's
elementwise values (sums of random-sign terms cancel; a centred value is as exact as the
values it was taken from). float16: 1e-2 (11 significant bits, a few roundings of the
intermediates); bfloat16: 4e-2 (8 significant bits: 8x float16's unit roundoff); float32:
1e-4. NaN nowhere: the inputs are finite and stay far from overflow.
"""

import ml_dtypes
import numpy as np
import pytest
from helpers import SIDES, back, on
from hypothesis import example, given, settings
from hypothesis import strategies as st

import tessera_tile as tt

BF16 = np.dtype(ml_dtypes.bfloat16)
DTYPES = {"float16": np.dtype(np.float16), "bfloat16": BF16, "float32": np.dtype(np.float32)}
RTOL = {"float16": 1e-2, "bfloat16": 4e-2, "float32": 1e-4}
ROWS = 3
# The ways a row kernel keeps a row, for the patterns that reuse one value of the first pass
# (var, layer norm...) and the one that reuses two (centred_product): in registers (8 to 1000
# by a warp, 2056 by a block of 256, 4104 to 12000 by a block of 512; centred_product to 512
# by a warp), in shared memory between passes (centred_product: 600 by a warp; for these
# patterns, whose column operand takes cache room too, a block's registers hold every row its
# cache would, so test_fusion_kernels covers that cache with a chain of one leaf), and read
# again by each pass (centred_product at 1000 with three row inputs by a warp, at 12000 by a
# block)
WIDTHS = (8, 40, 512, 600, 1000, 2056, 4104, 8192, 12000)
EPS = 1e-5


class _NumpyNS:
    """The few tt.* names the patterns use, on float64 NumPy arrays."""

    mean, sum, max, var, exp, sqrt = np.mean, np.sum, np.max, np.var, np.exp, np.sqrt

    @staticmethod
    def rsqrt(v):
        return 1 / np.sqrt(v)


PATTERNS = {
    # a row reduction of the chain
    "sum": lambda h, c, w, b, T: T.sum(h, axis=-1),
    "var": lambda h, c, w, b, T: T.var(h, axis=-1),
    "max": lambda h, c, w, b, T: T.max(h, axis=-1),
    # reduce, then broadcast back over the row
    "centre": lambda h, c, w, b, T: h - T.mean(h, axis=-1, keepdims=True),
    "scaled_sum_plus": lambda h, c, w, b, T: T.sum(h * c, axis=-1, keepdims=True) + h,
    "softmax": lambda h, c, w, b, T: (
        T.exp(h - T.max(h, axis=-1, keepdims=True))
        / T.sum(T.exp(h - T.max(h, axis=-1, keepdims=True)), axis=-1, keepdims=True)
    ),
    "layer_norm": lambda h, c, w, b, T: (
        (h - T.mean(h, axis=-1, keepdims=True))
        * T.rsqrt(T.var(h, axis=-1, keepdims=True) + EPS)
        * w
        + b
    ),
    # the chain itself and its row statistics, as two outputs
    "value_and_mean": lambda h, c, w, b, T: (h, T.mean(h, axis=-1)),
    # two centred values: a later pass reuses two of the first pass's values, not one
    "centred_product": lambda h, c, w, b, T: (
        (h - T.mean(h, axis=-1, keepdims=True)) * (h * c - T.mean(h * c, axis=-1, keepdims=True))
    ),
}
COMBINE = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b}


@st.composite
def chains(draw):
    """A case: pattern, dtype, width, row inputs, broadcast operands, scale, seed and side.

    Drawn from one seed rather than field by field: derandomised hypothesis draws neighbouring
    values for neighbouring fields, and a few dozen examples would then cover few widths."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))

    def pick(options):
        return options[rng.integers(len(options))]

    return dict(
        pattern=pick(sorted(PATTERNS)),
        dtype=pick(["float16", "bfloat16", "float16", "bfloat16", "float32"]),
        width=int(pick(WIDTHS)),
        inputs=int(rng.integers(1, 4)),
        # broadcast operands joined to the chain, each with its combiner
        operands=[
            (pick(["row", "row", "column", "scalar"]), pick(["add", "mul"]))
            for _ in range(rng.integers(0, 4))
        ],
        combiners=[pick(sorted(COMBINE)) for _ in range(2)],
        scale=float(pick([1e-2, 1.0, 2.0])),
        seed=int(rng.integers(2**16)),
        side=pick(SIDES),
    )


def build(case):
    """The fused function, its NumPy twin, and the arguments."""
    dtype, n = DTYPES[case["dtype"]], case["width"]
    rng = np.random.default_rng(case["seed"])

    def draw(shape, near_one=False):
        """Normal values (clipped at 2.5 sigma) times the case's scale, or a factor near 1:
        whatever the chain multiplies by, so that no square of a chain's value overflows
        float16 (NumPy's float16 would give inf there too)."""
        if near_one:
            return rng.uniform(0.5, 1.5, shape).astype(dtype)
        return (np.clip(rng.standard_normal(shape), -2.5, 2.5) * case["scale"]).astype(dtype)

    combiners = [COMBINE[name] for name in case["combiners"]]
    rows = [draw((ROWS, n))]
    rows += [draw((ROWS, n), name == "mul") for name in case["combiners"][: case["inputs"] - 1]]
    extra = []
    for kind, how in case["operands"]:
        if kind == "row":
            extra.append(draw((n,), how == "mul"))
        elif kind == "column":
            extra.append(draw((ROWS, 1), how == "mul"))
        else:
            extra.append(0.75)
    c = draw((ROWS, 1), near_one=True)
    w, b = draw((n,), near_one=True), draw((n,))
    joins = [COMBINE[how] for _, how in case["operands"]]
    pattern = PATTERNS[case["pattern"]]

    def chain(xs):
        h = xs[0]
        for i, x in enumerate(xs[1 : len(rows)]):
            h = combiners[i](h, x)
        for join, operand in zip(joins, xs[len(rows) :], strict=True):
            h = join(h, operand)
        return h

    def fn(*args):
        *xs, c_, w_, b_ = args
        return pattern(chain(xs), c_, w_, b_, tt)

    def reference(*args):
        wide = [a.astype(np.float64) if isinstance(a, np.ndarray) else a for a in args]
        *xs, c_, w_, b_ = wide
        h = chain(xs)
        return pattern(h, c_, w_, b_, _NumpyNS), h

    return fn, reference, [*rows, *extra, c, w, b]


def check(case):
    fn, reference, args = build(case)
    copies = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    side = case["side"]
    got = back(tt.fuse(fn)(*on(side, *args)), side)
    want, h = reference(*args)
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    rtol = RTOL[case["dtype"]]
    for g, r in zip(got, want, strict=True):
        assert g.dtype == DTYPES[case["dtype"]], g.dtype
        assert g.shape == r.shape, (g.shape, r.shape)
        g = g.astype(np.float64)
        assert not np.isnan(g).any(), f"{np.isnan(g).sum()} of {g.size} results are NaN"
        scale = max(np.abs(r).max(initial=0), np.abs(h).max(initial=0))
        np.testing.assert_allclose(g, r, rtol=rtol, atol=rtol * scale)
    for a, copy in zip(args, copies, strict=True):
        np.testing.assert_array_equal(a, copy)  # inputs are never modified


BUG = dict(inputs=2, operands=[("row", "add")], combiners=["add", "add"], scale=1.0, seed=0)


@settings(max_examples=40)
@given(chains())
# the reports of issue 40: var of x + bias + r, softmax of x + bias, sum(x * c) + x
@example(dict(BUG, pattern="var", dtype="float16", width=512, side="host"))
@example(dict(BUG, pattern="var", dtype="float16", width=4096, side="device"))
@example(dict(BUG, pattern="layer_norm", dtype="bfloat16", width=4096, side="host"))
@example(dict(BUG, pattern="softmax", dtype="float16", width=8192, inputs=1, side="device"))
@example(
    dict(BUG, pattern="scaled_sum_plus", dtype="bfloat16", width=1000, inputs=1, side="host")
    | {"operands": []}
)
def test_row_chains_match_numpy(case):
    check(case)


@pytest.mark.parametrize(
    "width, inputs, operands, pattern, mode, variant",
    [
        (8, 1, BUG["operands"], "var", "warp", "registers"),
        (1000, 3, BUG["operands"], "var", "warp", "registers"),
        (4104, 2, BUG["operands"], "var", "block", "registers"),
        (12000, 2, BUG["operands"], "var", "block", "registers"),
        (600, 2, BUG["operands"], "centred_product", "warp", "kept on chip between passes"),
        # what a warp's registers and shared memory cannot hold, a block's registers do
        (1000, 3, BUG["operands"], "centred_product", "block", "registers"),
        (12000, 3, BUG["operands"], "centred_product", "block", None),
    ],
)
def test_the_widths_cover_every_row_variant(width, inputs, operands, pattern, mode, variant):
    case = dict(BUG, pattern=pattern, dtype="float16", width=width, inputs=inputs, side="host")
    fn, _, args = build(case | {"operands": operands})
    (stage,) = tt.fuse(fn).explain(*args).stages
    assert f"rows reduced by a {mode}" in stage, stage
    assert f"of {512 if width > 4096 else 256} threads" in stage, stage
    if variant is None:
        assert "kept on chip" not in stage, stage
    else:
        assert variant in stage, stage


def residual_layer_norm(x, r, w, b):
    h = x + r
    d = h - tt.mean(h, axis=-1, keepdims=True)
    return d * tt.rsqrt(tt.mean(d * d, axis=-1, keepdims=True) + EPS) * w + b


def bias_gelu_residual_layer_norm(x, bias, r, w, b):
    return residual_layer_norm(tt.gelu(x + bias), r, w, b)


def _split(fn):
    """The same chain split at its reductions: the elementwise part, then the layer norm."""
    if fn is residual_layer_norm:
        return [(tt.fuse(lambda x, r: x + r), 2)]
    return [(tt.fuse(lambda x, bias, r: tt.gelu(x + bias) + r), 3)]


@pytest.mark.sim_only(reason="the profiler measures traffic in the simulator only")
@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("rows, width", [(16, 768), (12, 2056), (6, 8192)])
@pytest.mark.parametrize("fn", [residual_layer_norm, bias_gelu_residual_layer_norm])
def test_residual_layer_norm_reads_each_row_once(fn, rows, width, dtype):
    """Issue 40, item 2: a layer norm of a residual sum keeps the sum, not its inputs, in
    registers, so each row input is read once and the result written once; the only bytes past
    that minimum are the weights (and bias) each block reads once, for all its rows (staged in
    shared memory by a warp-mode block, held in registers by a block-mode one, whose grid of
    at most 8 blocks of 256, or 4 of 512, in the simulator then loops over the rows). Never
    more than the same chain split at its reductions."""
    dt = DTYPES[dtype]
    rng = np.random.default_rng(width)
    x, r = (rng.standard_normal((rows, width)).astype(dt) for _ in range(2))
    bias, w, b = (rng.standard_normal(width).astype(dt) for _ in range(3))
    args = (x, r, w, b) if fn is residual_layer_norm else (x, bias, r, w, b)
    fused = tt.fuse(fn)
    report = fused.explain(*args)
    with tt.sim.profile() as prof:
        fused(*args)
    moved = prof.bytes_read + prof.bytes_written
    weights = (len(args) - 2) * width * dt.itemsize  # the (width,) rows
    minimum = 3 * rows * width * dt.itemsize + weights
    (stage,) = report.stages
    blocks = int(stage.rsplit("; ", 1)[1].split()[0])
    assert "in registers" in stage and "stay in registers" in report.reasons[0], report
    assert f"read once per block, {'staged' if width <= 1024 else 'held'} in" in report.reasons[1]
    assert moved == report.bytes_fused == minimum + (blocks - 1) * weights
    elementwise, n = _split(fn)[0]
    h = np.zeros((rows, width), dt)
    split = (
        elementwise.explain(*args[:n]).bytes_fused
        + tt.fuse(lambda h, w, b: residual_layer_norm(h, 0 * h, w, b)).explain(h, w, b).bytes_fused
    )
    print(f"{fn.__name__} {dtype} {rows}x{width}: {moved} B, {moved / minimum:.3f}x the "
          f"minimum {minimum} B; split at the reductions {split} B")  # fmt: skip
    assert moved <= split
