"""Lowering tables: how each op of the Tile IR is written in a generated kernel.

* ``EMIT[op](node, operands) -> str``: the expression of an elementwise node, given its
  operands' expressions.
* ``REDUCTIONS[op]``: a reduction's monoid: its identity, how a value is folded into the
  accumulator, and the warp operator of its butterfly all-reduce.

Every value is computed in its compute dtype (float16 and bfloat16 in float32) and every
constant is cast to it, so float32 kernels contain no float64 instruction. A bfloat16 array
reaches the kernel as its ``uint16`` bits (:mod:`tessera_tile.bfloat16`): loads widen them with
``bf16_to_f32``, stores round with ``f32_to_bf16``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .. import tile_ir as ir
from .. import warp
from .._device import numerics as device
from ..tile_ir import Node, Op

TYPE_NAMES = {
    np.dtype(bool): "boolean",
    np.dtype(np.int32): "int32",
    np.dtype(np.int64): "int64",
    np.dtype(np.float16): "float16",
    np.dtype(np.float32): "float32",
    np.dtype(np.float64): "float64",
    ir.BFLOAT16: "uint16",  # its storage in kernels: the bits
}
HALVES = (np.dtype(np.float16), ir.BFLOAT16)  # computed in float32, rounded when stored
ONLINE = "online"  # the op of the online (max, sum of exp) pseudo-reduction, see passes.Online
MOMENTS = "moments"  # var's (shift, mean, M2) in one pass, see passes.Moments


def compute_dtype(dtype: np.dtype) -> np.dtype:
    return np.dtype(np.float32) if dtype in HALVES else np.dtype(dtype)


def load_cast(dtype: np.dtype, expr: str) -> str:
    """A loaded element ``expr`` of an array of ``dtype`` in its compute dtype."""
    if dtype == ir.BFLOAT16:
        return f"bf16_to_f32({expr})"
    return f"float32({expr})" if dtype == np.float16 else expr


def _rounded(dtype: np.dtype, expr: str) -> str:
    """A float32 ``expr`` rounded to a half dtype, as stored: its bits for bfloat16."""
    return f"f32_to_bf16({expr})" if dtype == ir.BFLOAT16 else f"float16({expr})"


def is_float(dtype) -> bool:
    return np.dtype(dtype).kind == "f" or dtype == ir.BFLOAT16  # ml_dtypes' kind is "V"


def cast(expr: str, src: np.dtype, dst: np.dtype, explicit: bool = False) -> str:
    """``expr`` (a value of dtype ``src``, held in its compute dtype) as ``dst``.

    float16 values live in float32 between float16 ops; where one flows into another dtype it
    is rounded to float16 first, as NumPy would have stored it. bfloat16 values are computed in
    float32 and rounded once, where stored, or where an explicit cast (``explicit``) asks.
    """
    src, dst = np.dtype(src), np.dtype(dst)
    held = compute_dtype(src)
    if src == np.float16 and dst != np.float16:
        expr, held = f"float16({expr})", src
    elif src == ir.BFLOAT16 and dst != ir.BFLOAT16 and explicit:  # rounded, widened again
        expr = f"bf16_to_f32({_rounded(src, expr)})"
    target = compute_dtype(dst)
    if held == target:
        return expr
    if target == np.dtype(bool):
        return f"({expr} != 0)"
    return f"{TYPE_NAMES[target]}({expr})"


def literal(value) -> str:
    """Python source of a constant's value (a Python scalar): its ``repr``, which round-trips
    every finite float, except for NaN and infinities, whose ``repr`` is no Python name."""
    if isinstance(value, float) and not np.isfinite(value):
        return f'float("{value!r}")'
    return repr(value)


def store_cast(n: Node, expr: str) -> str:
    """``expr`` as stored into an array of ``n``'s dtype."""
    return _rounded(n.dtype, expr) if n.dtype in HALVES else expr


def vector_element(n: Node, expr: str) -> str:
    """``expr`` as one element of a vector store into an array of ``n``'s dtype."""
    dtype = np.dtype(n.dtype)
    return _rounded(dtype, expr) if dtype in HALVES else f"{TYPE_NAMES[dtype]}({expr})"


# --------------------------------------------------------------------------------------------
# elementwise expressions


class _Operands:
    """The operands of one node, cast as its op needs them."""

    def __init__(self, n: Node, args: list[str]):
        self.n, self.args = n, args
        self.out = compute_dtype(n.dtype)
        self.t = TYPE_NAMES[self.out]
        self.floating = is_float(self.out)

    def __call__(self, i: int, to=None) -> str:
        # operands go to the node's dtype, not its compute dtype: a float16 operand of a
        # float16 op stays in float32, unrounded (rounding happens where it is stored or
        # meets another dtype)
        return cast(self.args[i], self.n.srcs[i].dtype, self.n.dtype if to is None else to)

    def const(self, value) -> str:
        return f"{self.t}({value!r})"


def _infix(symbol: str):
    return lambda o: f"({o(0)} {symbol} {o(1)})"


def _arithmetic(symbol: str):
    def emit(o):
        if o.out == np.dtype(bool):  # NumPy: + is "or", * is "and" on booleans
            return f"({o(0)} {'|' if symbol == '+' else '&'} {o(1)})"
        return f"({o(0)} {symbol} {o(1)})"

    return emit


def _compare(symbol: str):
    def emit(o):
        common = ir.infer_dtype(Op.MAXIMUM, o.n.srcs)  # the dtype NumPy compares in
        return f"({o(0, common)} {symbol} {o(1, common)})"

    return emit


def _library(name: str):
    return lambda o: f"{o.t}({name}({o(0)}))"


def _divmod(kind: str):
    return lambda o: f"{o.t}({kind}_{'float' if o.floating else 'int'}({o(0)}, {o(1)}))"


def _extreme(name: str):
    return lambda o: f"{name}_nan({o(0)}, {o(1)})" if o.floating else f"{name}({o(0)}, {o(1)})"


def _rounding(name: str):
    def emit(o):
        x = o(0)
        return f"({o.t}({name}({x})) if isfinite({x}) else {x})" if o.floating else x

    return emit


def _float_test(op: Op):
    def emit(o):
        if not is_float(o.n.srcs[0].dtype):
            return "True" if op is Op.ISFINITE else "False"
        x = o.args[0]
        return {Op.ISNAN: f"({x} != {x})", Op.ISINF: f"isinf({x})"}.get(op, f"isfinite({x})")

    return emit


def _activation(a: ir.Activation):
    # relu is the one activation NumPy keeps integral (or boolean): nothing to propagate as NaN
    return lambda o: a.expr(o(0), o.t) if o.floating else f"max({o(0)}, {o.t}(0))"


EMIT: dict[Op, Callable[[_Operands], str]] = {
    Op.ADD: _arithmetic("+"),
    Op.SUB: _arithmetic("-"),
    Op.MUL: _arithmetic("*"),
    Op.TRUEDIV: _arithmetic("/"),
    Op.AND: _infix("&"),
    Op.OR: _infix("|"),
    Op.XOR: _infix("^"),
    **{
        op: _compare(s)
        for op, s in (
            (Op.LT, "<"),
            (Op.LE, "<="),
            (Op.GT, ">"),
            (Op.GE, ">="),
            (Op.EQ, "=="),
            (Op.NE, "!="),
        )
    },  # fmt: skip
    Op.FLOORDIV: _divmod("floordiv"),
    Op.MOD: _divmod("mod"),
    Op.POW: lambda o: f"({o(0)} ** {o(1)})" if o.floating else f"{o.t}(pow_int({o(0)}, {o(1)}))",
    Op.MAXIMUM: _extreme("max"),
    Op.MINIMUM: _extreme("min"),
    Op.WHERE: lambda o: f"({o(1)} if {o.args[0]} else {o(2)})",
    Op.NEG: lambda o: f"(-{o(0)})",
    Op.ABS: lambda o: f"abs({o(0)})",
    Op.INVERT: lambda o: f"(not {o(0)})" if o.out == np.dtype(bool) else f"(~{o(0)})",
    Op.SQUARE: lambda o: f"({o(0)} * {o(0)})",
    Op.CAST: lambda o: cast(o.args[0], o.n.srcs[0].dtype, np.dtype(o.n.arg), explicit=True),
    Op.ISNAN: _float_test(Op.ISNAN),
    Op.ISINF: _float_test(Op.ISINF),
    Op.ISFINITE: _float_test(Op.ISFINITE),
    Op.FLOOR: _rounding("floor"),
    Op.CEIL: _rounding("ceil"),
    **{
        op: _library(op.name.lower())
        for op in (
            Op.EXP,
            Op.EXP2,
            Op.LOG,
            Op.LOG2,
            Op.LOG1P,
            Op.EXPM1,
            Op.SQRT,
            Op.SIN,
            Op.COS,
            Op.TANH,
            Op.ERF,
        )
    },  # fmt: skip
    Op.RSQRT: lambda o: f"({o.const(1.0)} / {o.t}(sqrt({o(0)})))",
    Op.SIGMOID: lambda o: f"({o.const(1.0)} / ({o.const(1.0)} + {o.t}(exp(-{o(0)}))))",
    **{a.op: _activation(a) for a in ir.ACTIVATIONS.values()},
}
assert set(EMIT) == ir.ELEMENTWISE, "every elementwise op has an expression"


def emit_elementwise(n: Node, args: list[str]) -> str:
    """The expression of elementwise node ``n`` given its operands' expressions."""
    return EMIT[n.op](_Operands(n, args))


APPROX: dict[Op, Callable[[_Operands], str]] = {
    Op.EXP: lambda o: f"exp_approx({o(0)})",
    Op.RSQRT: lambda o: f"rsqrt_approx({o(0)})",
    Op.TRUEDIV: lambda o: f"({o(0)} * rcp_approx({o(1)}))",
    Op.SIGMOID: lambda o: f"rcp_approx_ftz({o.const(1.0)} + exp_approx(-{o(0)}))",
    **{a.op: lambda o, a=a: a.approx(o(0), o.t) for a in ir.ACTIVATIONS.values() if a.approx},
}


def emit_approx(n: Node, args: list[str]) -> str:
    """The hardware-approximated expression of ``n`` (float32; the schedule chose where)."""
    return APPROX[n.op](_Operands(n, args))


def reciprocal(expr: str, dtype: np.dtype, approx: bool) -> str:
    """``1 / expr`` in ``dtype``'s compute dtype: one ``rcp.approx`` for float32 when
    ``approx``, else an IEEE division."""
    t = TYPE_NAMES[compute_dtype(dtype)]
    if approx and compute_dtype(dtype) == np.dtype(np.float32):
        return f"rcp_approx({expr})"
    return f"{t}(1.0) / {expr}"


# --------------------------------------------------------------------------------------------
# reductions


def acc_dtype(r) -> np.dtype:
    """Accumulator dtype: shuffle-able (no bool), float16 widened to float32."""
    if r.op in (ONLINE, MOMENTS):
        return compute_dtype(r.dtype)
    src = compute_dtype(r.srcs[0].dtype)
    if r.op in ir.INDEX_REDUCE:
        return np.dtype(np.int32) if src == np.dtype(bool) else src
    if r.op in (Op.ANY, Op.ALL):
        return np.dtype(np.int32)
    d = compute_dtype(r.dtype)
    return np.dtype(np.int32) if d == np.dtype(bool) else d


def _bound(low: bool):
    """The identity of max / argmax (``low``) or min / argmin."""

    def identity(r, d: np.dtype) -> str:
        t = TYPE_NAMES[d]
        if is_float(d):
            return f"{t}({'-inf' if low else 'inf'})"
        if r.srcs[0].dtype == np.dtype(bool):
            return f"int32({0 if low else 1})"
        info = np.iinfo(d)
        return f"{t}({info.min if low else info.max})"

    return identity


def _fold(expr: str):
    return lambda a, b, ai, bi, d: [f"{a} = " + expr.format(a=a, b=b)]


def _pick(name: str):
    return lambda a, b, ai, bi, d: [f"{a} = {name}{'_nan' if is_float(d) else ''}({a}, {b})"]


def _arg_pick(better: str):
    """argmax / argmin: the better value wins, ties go to the lower index, the first NaN wins."""

    def combine(a, b, ai, bi, d):
        cond = f"({b} {better} {a}) or ({b} == {a} and {bi} < {ai})"
        if is_float(d):
            cond = f"({b} != {b} and ({a} == {a} or {bi} < {ai})) or ({a} == {a} and ({cond}))"
        return [f"if {cond}:", f"    {a} = {b}", f"    {ai} = {bi}"]

    return combine


def online_merge(m, s, m2, s2, d) -> list[str]:
    """Merge the partial (``m2``, ``s2``) into the running (max ``m``, sum ``s``)."""
    t = TYPE_NAMES[d]
    return [
        f"{m}_n = max({m}, {m2})",
        f"{s} = ({s} if {m} == {m}_n else {s} * {t}(exp({m} - {m}_n))) + "
        f"({s2} if {m2} == {m}_n else {s2} * {t}(exp({m2} - {m}_n)))",
        f"{m} = {m}_n",
    ]


def online_element(r, m: str, s: str, v: str) -> list[str]:
    """Fold element ``v`` into the running (max ``m``, sum ``s``)."""
    t = TYPE_NAMES[acc_dtype(r)]
    return [
        f"if {v} > {m}:",
        # exp(v - v) is 1, or NaN for v = inf, as exp(inf - max) is in the two-pass form
        f"    {s} = {s} * {t}(exp({m} - {v})) + {t}(exp({v} - {v}))",
        f"    {m} = {v}",
        f"elif {v} > {t}(-inf):",
        f"    {s} = {s} + {t}(exp({v} - {m}))",
    ]


@dataclass(frozen=True)
class Reduction:
    """A reduction's monoid, as source text."""

    identity: Callable  # (node, acc dtype) -> expression
    combine: Callable  # (acc, value, acc index, value index, acc dtype) -> statements
    warp: object = None  # tessera_tile.warp operator of the all-reduce (None: written inline)


REDUCTIONS: dict = {
    Op.SUM: Reduction(lambda r, d: f"{TYPE_NAMES[d]}(0)", _fold("{a} + {b}"), warp.add),
    Op.PROD: Reduction(lambda r, d: f"{TYPE_NAMES[d]}(1)", _fold("{a} * {b}"), warp.multiply),
    Op.MAX: Reduction(_bound(True), _pick("max"), device.maximum),
    Op.MIN: Reduction(_bound(False), _pick("min"), device.minimum),
    Op.ANY: Reduction(lambda r, d: "int32(0)", _fold("{a} | {b}"), device.bit_or),
    Op.ALL: Reduction(lambda r, d: "int32(1)", _fold("{a} & {b}"), device.bit_and),
    Op.ARGMAX: Reduction(_bound(True), _arg_pick(">")),
    Op.ARGMIN: Reduction(_bound(False), _arg_pick("<")),
    # the running maximum starts at -inf; its running sum at 0
    ONLINE: Reduction(
        lambda r, d: f"{TYPE_NAMES[d]}(-inf)",
        lambda a, b, ai, bi, d: online_merge(a, ai, b, bi, d),
    ),
}


def identity(r) -> str:
    return REDUCTIONS[r.op].identity(r, acc_dtype(r))


def combine(r, a: str, b: str, ai: str = "", bi: str = "") -> list[str]:
    """Statements that fold (b[, bi]) into the accumulator (a[, ai])."""
    return REDUCTIONS[r.op].combine(a, b, ai, bi, acc_dtype(r))


def second_accumulator(r) -> str | None:
    """The initial value of a reduction's second accumulator: the index of argmax/argmin, the
    running sum of an online normaliser; None when it has only one."""
    if r.op == ONLINE:
        return f"{TYPE_NAMES[acc_dtype(r)]}(0)"
    if r.op in ir.INDEX_REDUCE:
        return "int64(9223372036854775807)"
    return None


def element_value(r: Node, expr: str) -> str:
    """An element of the reduction's source, as the accumulator dtype."""
    src = r.srcs[0].dtype
    if r.op in (Op.ANY, Op.ALL):
        return f"int32({cast(expr, src, np.dtype(bool))})"
    return cast(expr, src, acc_dtype(r)) if src != np.dtype(bool) else f"int32({expr})"


def final_value(r, acc: str, acc_index: str, peak: str = "") -> str:
    """The reduction's result (its own compute dtype) from the accumulator(s).

    An online normaliser's sum is rescaled to the true maximum ``peak`` (which propagates NaN).
    """
    if r.op == ONLINE:
        t = TYPE_NAMES[acc_dtype(r)]
        return f"{acc_index} if {acc} == {peak} else {acc_index} * {t}(exp({acc} - {peak}))"
    if r.op in ir.INDEX_REDUCE:
        return f"int64({acc_index})"
    return cast(acc, acc_dtype(r), r.dtype)


def fold_partials(r, a: str, ai: str, guard: str, slot, count: str) -> list[str]:
    """Publish each partial to shared scratch, then every thread folds them in slot order.

    ``slot(w)`` is the scratch index of partial ``w``; ``guard`` says who publishes.
    """
    t = TYPE_NAMES[acc_dtype(r)]
    second = f"scratch_{t}_b" if r.op == ONLINE else "scratch_index"
    mine = slot(None)
    out = [f"if {guard}:", f"    scratch_{t}[{mine}] = {a}"]
    if ai:
        out.append(f"    {second}[{mine}] = {ai}")
    out += ["cuda.syncthreads()", f"{a} = {t}(scratch_{t}[{slot('0')}])"]
    if ai:
        out.append(f"{ai} = {second}[{slot('0')}]")
    out += ["w = 1", f"while w < {count}:", f"    {a}_w = {t}(scratch_{t}[{slot('w')}])"]
    if ai:
        out.append(f"    {a}_wi = {second}[{slot('w')}]")
    out += ["    " + line for line in combine(r, a, f"{a}_w", ai, f"{a}_wi" if ai else "")]
    out += ["    w += 1", "cuda.syncthreads()"]
    return out


# --------------------------------------------------------------------------------------------
# moments: var over split rows in one pass


def moment_sums(nodes) -> dict[str, Node]:
    """``var``'s ``SUM(d * d)`` with ``d = f - SUM(f, keepdims) / COUNT`` over the same axes
    (:func:`tessera_tile.fusion.var`): its key -> the ``SUM(f)``. Only where every value is
    float32, float64 or bfloat16 (held in float32, unrounded, as the two passes hold it): a
    float16 chain rounds each square to float16, which one pass would not reproduce."""
    out: dict[str, Node] = {}
    for q in nodes:
        if q.op is not Op.SUM or not is_float(q.dtype):
            continue
        sq = q.srcs[0]
        if not (sq.op is Op.MUL and sq.srcs[0].key == sq.srcs[1].key or sq.op is Op.SQUARE):
            continue
        d = sq.srcs[0]
        if d.op is not Op.SUB or d.srcs[1].op is not Op.TRUEDIV:
            continue
        f, (total, count) = d.srcs[0], d.srcs[1].srcs
        chain = (q, sq, d, d.srcs[1], total)
        if (
            total.op is Op.SUM
            and total.srcs[0].key == f.key
            and total.arg[1]
            and total.arg[0] == q.arg[0]
            and count.op is Op.COUNT
            and count.arg == (f.key, tuple(q.arg[0]))
            and all(np.dtype(n.dtype) != np.float16 for n in chain)
            and len({compute_dtype(n.dtype) for n in chain}) == 1
            and total.key not in {t.key for t in out.values()}
        ):
            out[q.key] = total
    return out


def welford_element(shift: str, m: str, q: str, v: str, rk: str) -> list[str]:
    """Fold ``v`` into a thread's (mean ``m``, M2 ``q``) of ``v - shift``; ``rk`` is one
    over the thread's count. The shift (the thread's first element) keeps ``m`` near 0, so
    its rounding scales with the spread, not with the mean (1e4 + N(0, 1) in float32)."""
    return [
        f"{m}_d = {v} - {shift}",
        f"{m}_e = {m}_d - {m}",
        f"{m} = {m} + {m}_e * {rk}",
        f"{q} = {q} + {m}_e * ({m}_d - {m})",
    ]


def chan_merge(dtype: np.dtype, a: tuple, b: tuple, approx: bool) -> list[str]:
    """Merge partial ``b`` into ``a``, each (count, shift, mean - shift, M2) as names (Chan,
    Golub and LeVeque): ``delta = mean_b - mean_a``, taken as the difference of the shifts
    plus that of the small means; ``mean_a += delta n_b / n``; ``M2_a += M2_b + delta^2
    n_a n_b / n``. Empty partials are skipped (no 0 / 0) and an empty ``a`` takes ``b``
    whole (no 0 * inf)."""
    t = TYPE_NAMES[dtype]
    (na, ka, ma, qa), (nb, kb, mb, qb) = a, b
    frac = f"{t}({nb}) * {reciprocal(f'{t}({na} + {nb})', dtype, approx)}"
    return [
        f"if {nb} > 0:",
        f"    if {na} == 0:",
        f"        {ka}, {ma}, {qa} = {kb}, {mb}, {qb}",
        "    else:",
        f"        {ma}_x = ({kb} - {ka}) + ({mb} - {ma})",
        f"        {ma}_f = {frac}",
        f"        {ma} = {ma} + {ma}_x * {ma}_f",
        f"        {qa} = {qa} + {qb} + {ma}_x * {ma}_x * ({t}({na}) * {ma}_f)",
        f"    {na} = {na} + {nb}",
    ]
