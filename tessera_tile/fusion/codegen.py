"""Code generation: the Python source of one ``@cuda.jit`` kernel per stage, and its cache.

Elementwise ops become expressions through small tables (operator symbols, library functions)
plus a few special cases; stages become one of four templates (elementwise, row, column, full).
Every value is computed in its compute dtype (float16 in float32) and every constant is cast to
it, so float32 kernels contain no float64 instruction. Loops are ``while`` loops: a ``range``
with a run-time step makes Numba divide in 64 bits to get the trip count.

Set ``TESSERA_TILE_DUMP=1`` to print every generated source.
"""

from __future__ import annotations

import hashlib
import linecache
import os
import threading
from dataclasses import dataclass

import numpy as np

from .. import memory, warp
from .. import tile_ir as ir
from ..tile_ir import Node, Op
from . import device
from .plan import Stage

WARP = 32
BLOCK = 256  # threads per block in every template but column
COLUMN_BLOCK = (32, 8)
WARP_ROW_MAX = 1024  # rows up to this long get a warp each, longer rows a block
CACHE_BYTES = 32768  # shared memory that keeps a row on chip between passes

TYPE_NAMES = {
    np.dtype(bool): "boolean",
    np.dtype(np.int32): "int32",
    np.dtype(np.int64): "int64",
    np.dtype(np.float16): "float16",
    np.dtype(np.float32): "float32",
    np.dtype(np.float64): "float64",
}


def compute_dtype(dtype: np.dtype) -> np.dtype:
    return np.dtype(np.float32) if dtype == np.float16 else np.dtype(dtype)


def is_float(dtype) -> bool:
    return np.dtype(dtype).kind == "f"


@dataclass(frozen=True)
class Variant:
    """Layout and strategy of one compiled kernel (part of its cache key)."""

    kind: str
    kept_rank: int  # index dimensions left after collapsing (elementwise: all in kept)
    red_rank: int
    mode: str = ""  # row: "warp" or "block"
    cache: bool = False  # row: keep multi-pass leaves in shared memory
    vector: int = 1  # elementwise: elements per 16-byte load/store (contiguous and aligned)


@dataclass
class Generated:
    name: str
    source: str
    kernel: object


# --------------------------------------------------------------------------------------------
# expressions


def _cast(expr: str, src: np.dtype, dst: np.dtype) -> str:
    """``expr`` (a value of dtype ``src``, held in its compute dtype) as ``dst``.

    float16 values live in float32 between float16 ops; where one flows into another dtype it
    is rounded to float16 first, as NumPy would have stored it.
    """
    src, dst = np.dtype(src), np.dtype(dst)
    held = compute_dtype(src)
    if src == np.float16 and dst != np.float16:
        expr, held = f"float16({expr})", src
    target = compute_dtype(dst)
    if held == target:
        return expr
    if target == np.dtype(bool):
        return f"({expr} != 0)"
    return f"{TYPE_NAMES[target]}({expr})"


def _common(srcs) -> np.dtype:
    """The dtype NumPy compares or selects operands in."""
    return ir.infer_dtype(Op.MAXIMUM, srcs)


ARITHMETIC = {Op.ADD: "+", Op.SUB: "-", Op.MUL: "*", Op.TRUEDIV: "/"}
BITWISE = {Op.AND: "&", Op.OR: "|", Op.XOR: "^"}
COMPARE = {Op.LT: "<", Op.LE: "<=", Op.GT: ">", Op.GE: ">=", Op.EQ: "==", Op.NE: "!="}
# math functions by the name the generated source calls (see device.MATH)
LIBRARY = {
    op: op.name.lower()
    for op in (
        Op.EXP, Op.EXP2, Op.LOG, Op.LOG2, Op.LOG1P, Op.EXPM1, Op.SQRT, Op.SIN, Op.COS, Op.TANH,
        Op.ERF,
    )
}  # fmt: skip


def emit_elementwise(n: Node, args: list[str]) -> str:
    """The expression of elementwise node ``n`` given its operands' expressions."""
    op, out = n.op, compute_dtype(n.dtype)
    t = TYPE_NAMES[out]
    srcs = n.srcs

    def c(i: int, to=None) -> str:
        return _cast(args[i], srcs[i].dtype, out if to is None else to)

    def k(value) -> str:
        return f"{t}({value!r})"

    floating = is_float(out)
    if op in ARITHMETIC:
        if out == np.dtype(bool):  # NumPy: + is "or", * is "and" on booleans
            return f"({c(0)} {'|' if op is Op.ADD else '&'} {c(1)})"
        return f"({c(0)} {ARITHMETIC[op]} {c(1)})"
    if op in BITWISE:
        return f"({c(0)} {BITWISE[op]} {c(1)})"
    if op in COMPARE:
        common = _common(srcs)
        return f"({c(0, common)} {COMPARE[op]} {c(1, common)})"
    if op in (Op.FLOORDIV, Op.MOD):
        helper = ("floordiv_" if op is Op.FLOORDIV else "mod_") + ("float" if floating else "int")
        return f"{t}({helper}({c(0)}, {c(1)}))"
    if op is Op.POW:
        return f"({c(0)} ** {c(1)})" if floating else f"{t}(pow_int({c(0)}, {c(1)}))"
    if op in (Op.MAXIMUM, Op.MINIMUM):
        name = "max" if op is Op.MAXIMUM else "min"
        return f"{name}_nan({c(0)}, {c(1)})" if floating else f"{name}({c(0)}, {c(1)})"
    if op is Op.WHERE:
        return f"({c(1)} if {args[0]} else {c(2)})"
    if op is Op.NEG:
        return f"(-{c(0)})"
    if op is Op.ABS:
        return f"abs({c(0)})"
    if op is Op.INVERT:
        return f"(not {c(0)})" if out == np.dtype(bool) else f"(~{c(0)})"
    if op is Op.SQUARE:
        return f"({c(0)} * {c(0)})"
    if op is Op.CAST:
        return _cast(args[0], srcs[0].dtype, np.dtype(n.arg))
    if op in (Op.ISNAN, Op.ISINF, Op.ISFINITE):
        if not is_float(srcs[0].dtype):
            return "True" if op is Op.ISFINITE else "False"
        x = args[0]
        return {Op.ISNAN: f"({x} != {x})", Op.ISINF: f"isinf({x})", Op.ISFINITE: f"isfinite({x})"}[
            op
        ]
    if op in (Op.FLOOR, Op.CEIL):
        if not floating:
            return c(0)
        fn = "floor" if op is Op.FLOOR else "ceil"
        return f"({t}({fn}({c(0)})) if isfinite({c(0)}) else {c(0)})"
    if op is Op.RELU:
        return f"max_nan({c(0)}, {k(0.0)})" if floating else f"max({c(0)}, {t}(0))"
    x = c(0)
    if op in LIBRARY:
        return f"{t}({LIBRARY[op]}({x}))"
    if op is Op.RSQRT:
        return f"({k(1.0)} / {t}(sqrt({x})))"
    if op is Op.SIGMOID:
        return f"({k(1.0)} / ({k(1.0)} + {t}(exp(-{x}))))"
    if op is Op.SILU:
        return f"({x} / ({k(1.0)} + {t}(exp(-{x}))))"
    if op is Op.GELU:
        return f"({k(0.5)} * {x} * ({k(1.0)} + {t}(erf({x} * {k(0.7071067811865476)}))))"
    if op is Op.GELU_TANH:
        inner = f"{k(0.7978845608028654)} * ({x} + {k(0.044715)} * {x} * {x} * {x})"
        return f"({k(0.5)} * {x} * ({k(1.0)} + {t}(tanh({inner}))))"
    raise NotImplementedError(f"no code generation for {op}")


# --------------------------------------------------------------------------------------------
# reductions

# The warp-level step of each reduction: tessera_tile.warp's xor-butterfly all-reduce with these
# operators (maximum/minimum propagate NaN like NumPy).
WARP_OPS = {
    Op.SUM: warp.add,
    Op.PROD: warp.multiply,
    Op.MAX: warp.maximum,
    Op.MIN: warp.minimum,
    Op.ANY: device.bit_or,
    Op.ALL: device.bit_and,
}


def acc_dtype(r: Node) -> np.dtype:
    """Accumulator dtype: shuffle-able (no bool), float16 widened to float32."""
    if isinstance(r, Online):
        return compute_dtype(r.dtype)
    src = compute_dtype(r.srcs[0].dtype)
    if r.op in ir.INDEX_REDUCE:
        return np.dtype(np.int32) if src == np.dtype(bool) else src
    if r.op in (Op.ANY, Op.ALL):
        return np.dtype(np.int32)
    d = compute_dtype(r.dtype)
    return np.dtype(np.int32) if d == np.dtype(bool) else d


def identity(r: Node) -> str:
    d = acc_dtype(r)
    t = TYPE_NAMES[d]
    if isinstance(r, Online):
        return f"{t}(-inf)"  # the running maximum; its running sum starts at 0
    if r.op is Op.SUM:
        return f"{t}(0)"
    if r.op is Op.PROD:
        return f"{t}(1)"
    if r.op in (Op.ANY,):
        return "int32(0)"
    if r.op in (Op.ALL,):
        return "int32(1)"
    low = r.op in (Op.MAX, Op.ARGMAX)
    if is_float(d):
        return f"{t}({'-inf' if low else 'inf'})"
    src = r.srcs[0].dtype
    if src == np.dtype(bool):
        return f"int32({0 if low else 1})"
    info = np.iinfo(d)
    return f"{t}({info.min if low else info.max})"


def combine(r: Node, a: str, b: str, ai: str = "", bi: str = "") -> list[str]:
    """Statements that fold (b[, bi]) into the accumulator (a[, ai])."""
    d = acc_dtype(r)
    if isinstance(r, Online):
        return online_merge(r, a, ai, b, bi)
    if r.op is Op.SUM:
        return [f"{a} = {a} + {b}"]
    if r.op is Op.PROD:
        return [f"{a} = {a} * {b}"]
    if r.op is Op.ANY:
        return [f"{a} = {a} | {b}"]
    if r.op is Op.ALL:
        return [f"{a} = {a} & {b}"]
    if r.op in (Op.MAX, Op.MIN):
        fn = ("max" if r.op is Op.MAX else "min") + ("_nan" if is_float(d) else "")
        return [f"{a} = {fn}({a}, {b})"]
    better = ">" if r.op is Op.ARGMAX else "<"
    cond = f"({b} {better} {a}) or ({b} == {a} and {bi} < {ai})"
    if is_float(d):
        cond = f"({b} != {b} and ({a} == {a} or {bi} < {ai})) or ({a} == {a} and ({cond}))"
    return [f"if {cond}:", f"    {a} = {b}", f"    {ai} = {bi}"]


def element_value(r: Node, expr: str) -> str:
    """An element of the reduction's source, as the accumulator dtype."""
    src = r.srcs[0].dtype
    if r.op in (Op.ANY, Op.ALL):
        return f"int32({_cast(expr, src, np.dtype(bool))})"
    return _cast(expr, src, acc_dtype(r)) if src != np.dtype(bool) else f"int32({expr})"


def final_value(r: Node, acc: str, acc_index: str) -> str:
    """The reduction's result (its own compute dtype) from the accumulator."""
    if r.op in ir.INDEX_REDUCE:
        return f"int64({acc_index})"
    return _cast(acc, acc_dtype(r), r.dtype)


class Online:
    """``sum(exp(f - max(f)))`` folded into the pass that finds ``max(f)``.

    Each thread keeps a running maximum and a sum of ``exp(f - running max)``, rescaled by
    ``exp(old max - new max)`` whenever the maximum grows; partial pairs merge the same way.
    At the end the sum is rescaled to the true maximum (which propagates NaN), so the result
    agrees with the two-pass form. Used when the row does not stay on chip: it saves a pass.
    """

    op = "online"

    def __init__(self, node: Node, peak: Node):
        self.node, self.peak = node, peak
        self.key, self.dtype, self.srcs = node.key, node.dtype, node.srcs


def online_sums(nodes) -> dict[str, Node]:
    """SUM(EXP(SUB(f, MAX(f)))) nodes, over the same axes with keepdims: key -> the MAX."""
    out = {}
    for n in nodes:
        if n.op is not Op.SUM or not is_float(n.dtype):
            continue
        e = n.srcs[0]
        if e.op is not Op.EXP or e.srcs[0].op is not Op.SUB:
            continue
        f, peak = e.srcs[0].srcs
        if (
            peak.op is Op.MAX
            and peak.srcs[0].key == f.key
            and peak.arg[1]
            and (peak.arg[0] == n.arg[0] and is_float(f.dtype))
        ):
            out[n.key] = peak
    return out


def online_element(r: Online, m: str, s: str, v: str) -> list[str]:
    """Fold element ``v`` into the running (max ``m``, sum ``s``)."""
    t = TYPE_NAMES[compute_dtype(r.dtype)]
    return [
        f"if {v} > {m}:",
        # exp(v - v) is 1, or NaN for v = inf, as exp(inf - max) is in the two-pass form
        f"    {s} = {s} * {t}(exp({m} - {v})) + {t}(exp({v} - {v}))",
        f"    {m} = {v}",
        f"elif {v} > {t}(-inf):",
        f"    {s} = {s} + {t}(exp({v} - {m}))",
    ]


def online_merge(r: Online, m: str, s: str, m2: str, s2: str) -> list[str]:
    """Merge the partial (``m2``, ``s2``) into (``m``, ``s``)."""
    t = TYPE_NAMES[compute_dtype(r.dtype)]
    return [
        f"{m}_n = max({m}, {m2})",
        f"{s} = ({s} if {m} == {m}_n else {s} * {t}(exp({m} - {m}_n))) + "
        f"({s2} if {m2} == {m}_n else {s2} * {t}(exp({m2} - {m}_n)))",
        f"{m} = {m}_n",
    ]


# --------------------------------------------------------------------------------------------
# passes


def pass_leaves(targets) -> set:
    return {n.key for n in ir.walk(targets) if n.op is Op.INPUT}


def plan_passes(stage: Stage, online: bool = False):
    """(values the pass needs, reductions it completes, F outputs it writes) for each pass.

    With ``online``, a softmax-style normaliser (see :class:`Online`) completes in the pass of
    its maximum instead of the next one.
    """
    f_out = [(i, n) for i, (n, _) in enumerate(stage.outputs) if stage.space[id(n)] == "F"]
    merged = online_sums(stage.nodes) if online else {}
    level_of: dict[str, int] = {}
    for n in stage.nodes:
        base = max((level_of[s.key] for s in n.srcs), default=0)
        if n.key in merged:
            level_of[n.key] = level_of[merged[n.key].key]
        else:
            level_of[n.key] = base + 1 if n.op in ir.REDUCE else base
    reductions = [n for n in stage.nodes if n.op in ir.REDUCE]
    depth = max((level_of[r.key] for r in reductions), default=0)
    passes = []
    for k in range(depth):
        reds = [
            Online(r, merged[r.key]) if r.key in merged else r
            for r in reductions
            if level_of[r.key] == k + 1
        ]
        sources = [r.peak.srcs[0] if isinstance(r, Online) else r.srcs[0] for r in reds]
        outs = [(i, n) for i, n in f_out if level_of[n.key] == k]
        passes.append((sources + [n for _, n in outs], reds, outs))
    late = [(i, n) for i, n in f_out if level_of[n.key] >= depth]
    if late:
        passes.append(([n for _, n in late], [], late))
    return passes


def uses_online(variant) -> bool:
    """Rows that are not kept on chip are read once per pass: fold normalisers in."""
    return variant.kind in ("row", "column") and not variant.cache


def multi_pass_leaves(stage: Stage) -> list[Node]:
    """Leaves read by more than one pass: kept on chip when the row fits."""
    uses: dict[str, int] = {}
    for targets, _, _ in plan_passes(stage):  # the cached variant makes every pass
        for key in pass_leaves(targets):
            uses[key] = uses.get(key, 0) + 1
    seen, out = set(), []
    for n in stage.nodes:
        if n.op is Op.INPUT and uses.get(n.key, 0) > 1 and n.key not in seen:
            seen.add(n.key)
            out.append(n)
    return out


def cache_length(stage: Stage, groups: int) -> int:
    """Row elements the on-chip cache holds for ``groups`` rows per block (0: no cache)."""
    per = sum(n.dtype.itemsize for n in multi_pass_leaves(stage))
    return CACHE_BYTES // (groups * per) if per else 0


# --------------------------------------------------------------------------------------------
# the generator


class _Source:
    def __init__(self):
        self.lines: list[str] = []
        self.depth = 0

    def __call__(self, line: str = "") -> None:
        self.lines.append("    " * self.depth + line if line else "")

    def block(self):
        src = self

        class _Indent:
            def __enter__(self):
                src.depth += 1

            def __exit__(self, *exc):
                src.depth -= 1

        return _Indent()

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


class KernelWriter:
    """Writes the kernel of one stage for one variant."""

    def __init__(self, stage: Stage, variant: Variant, name: str):
        self.stage = stage
        self.v = variant
        self.name = name
        self.src = _Source()
        self.nodes = stage.nodes
        self.space = stage.space
        self.leaves = stage.leaves
        self.scalars = stage.scalars
        self.consts: dict[str, str] = {}
        self.names: dict[str, str] = {n.key: f"in{i}" for i, n in enumerate(self.leaves)}
        self.names.update({n.key: f"s{i}" for i, n in enumerate(self.scalars)})
        self.outputs = stage.outputs
        self.reductions = stage.reductions
        self.counter = 0

    # naming -------------------------------------------------------------------------------
    def fresh(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"

    def out_name(self, i: int) -> str:
        return f"out{i}"

    # params -------------------------------------------------------------------------------
    def params(self) -> list[str]:
        names = [f"in{i}" for i in range(len(self.leaves))]
        names += [self.out_name(i) for i in range(len(self.outputs))]
        if self.v.kind == "full":
            for i, r in enumerate(self.reductions):
                names.append(f"part{i}")
                if r.op in ir.INDEX_REDUCE:
                    names.append(f"parti{i}")
            names.append("ticket")
        names += [f"s{i}" for i in range(len(self.scalars))]
        names += [f"dk{i}" for i in range(self.v.kept_rank)]
        names += [f"dr{i}" for i in range(self.v.red_rank)]
        return names

    # values -------------------------------------------------------------------------------
    def const_expr(self, n: Node) -> str:
        name = self.consts.get(n.key)
        if name is None:
            name = f"C{len(self.consts)}"
            self.consts[n.key] = name
            self.const_values[name] = n.arg
        return f"{TYPE_NAMES[compute_dtype(n.dtype)]}({name})" if not n.weak else name

    def value(self, n: Node, env: dict, load) -> str:
        """Expression for ``n`` in ``env`` (emitting statements for F/row nodes as needed)."""
        got = env.get(n.key)
        if got is not None:
            return got
        if n.op is Op.CONST:
            expr = self.const_expr(n)
            env[n.key] = expr
            return expr
        if n.op in (Op.SCALAR, Op.COUNT):
            return self.names[n.key]
        if n.op is Op.INPUT:
            var = self.fresh("v")
            loaded = load(n)
            if n.dtype == np.dtype(np.float16):
                loaded = f"float32({loaded})"
            self.src(f"{var} = {loaded}")
            env[n.key] = var
            return var
        if n.op in ir.REDUCE:
            raise AssertionError("reduction results are set when their pass ends")
        args = [self.value(s, env, load) for s in n.srcs]
        var = self.fresh("t")
        rcp = env.get("rcp:" + n.key)
        if rcp is not None:  # divide by a per-row value: multiply by its reciprocal
            self.src(f"{var} = {_cast(args[0], n.srcs[0].dtype, n.dtype)} * {rcp}")
        else:
            self.src(f"{var} = {emit_elementwise(n, args)}")
        env[n.key] = var
        return var

    # templates ----------------------------------------------------------------------------
    def write(self) -> str:
        self.const_values: dict[str, object] = {}
        body = _Source()
        self.src = body
        self.cached: list[str] = []
        self.online_used = False
        self.helpers: dict = {}  # name -> device function the source calls
        with body.block():
            getattr(self, f"write_{self.v.kind}")()
        head = _Source()
        chain = ", ".join(n.op.name.lower() for n in self.nodes if n.op not in ir.LEAF)
        head(f"# tessera_tile fused kernel: {chain}")
        head(f"# stage: {self.v.kind}, variant: {self.v}")
        for name, value in self.const_values.items():
            head(f"{name} = {value!r}")
        head("")
        head("")
        head("@cuda.jit")
        head(f"def {self.name}({', '.join(self.params())}):")
        return head.text() + body.text()

    # index helpers
    def unravel(self, linear: str, dims: list[str], prefix: str) -> list[str]:
        """Statements splitting ``linear`` into coordinates over ``dims`` (C order)."""
        if len(dims) == 1:
            return [f"{prefix}0 = {linear}"]
        out = [f"{prefix}rem = {linear}"]
        for i in range(len(dims) - 1, 0, -1):
            out.append(f"{prefix}{i} = {prefix}rem % {dims[i]}")
            out.append(f"{prefix}rem = {prefix}rem // {dims[i]}")
        out.append(f"{prefix}0 = {prefix}rem")
        return out

    def index(self, kept: bool, red: bool) -> str:
        if kept and not red and self.v.kept_rank == 0:
            return "0"  # the one element of a full reduction's output
        parts = []
        if kept:
            parts += [f"k{i}" for i in range(self.v.kept_rank)]
        if red:
            parts += [f"j{i}" for i in range(self.v.red_rank)]
        return ", ".join(parts)

    def loader(self, cache_reads: set):
        def load(n: Node) -> str:
            name = self.names[n.key]
            if n.key in cache_reads:
                return f"cache_{name}[{self.cache_index}]"
            return f"{name}[{self.index(True, True)}]"

        return load

    def write_elementwise(self) -> None:
        s = self.src
        dims = [f"dk{i}" for i in range(self.v.kept_rank)]
        s(f"n = {' * '.join(dims)}")
        s("step = cuda.gridsize(1)")
        s("i = cuda.grid(1)")
        if self.v.vector > 1:
            self.write_vector_loop(self.v.vector)
            s(f"i = (n // {self.v.vector}) * {self.v.vector} + cuda.grid(1)  # the tail")
        s("while i < n:")
        with s.block():
            for line in self.unravel("i", dims, "k"):
                s(line)
            env: dict = {}
            load = self.loader(set())
            for i, (n, _) in enumerate(self.outputs):
                val = self.value(n, env, load)
                s(f"{self.out_name(i)}[{self.index(True, False)}] = {self._store_cast(n, val)}")
            s("i += step")

    def write_vector_loop(self, width: int) -> None:
        """Whole 16-byte vectors: one LDG.E.128 per input and one STG.E.128 per output."""
        s = self.src
        s(f"while i < n // {width}:")
        with s.block():
            s(f"b = i * {width}")
            lanes = [dict() for _ in range(width)]
            for leaf in self.leaves:
                name = self.names[leaf.key]
                parts = [f"{name}_{lane}" for lane in range(width)]
                s(f"{', '.join(parts)} = load16({name}, b)")
                for lane, part in enumerate(parts):
                    lanes[lane][leaf.key] = part
            load = self.loader(set())
            for i, (n, _) in enumerate(self.outputs):
                vals = [self.value(n, lanes[lane], load) for lane in range(width)]
                t = TYPE_NAMES[np.dtype(n.dtype)]
                s(f"store16({self.out_name(i)}, b, ({', '.join(f'{t}({v})' for v in vals)}))")
            s("i += step")

    @staticmethod
    def _store_cast(n: Node, val: str) -> str:
        if n.dtype == np.dtype(np.float16):
            return f"float16({val})"
        return val

    # passes shared by row / column / full ----------------------------------------------------
    def write_reduce_body(self, group_reduce, group_lead, red_index_setup):
        """Row and column templates: passes over the reduced index of one kept index."""
        s = self.src
        passes = plan_passes(self.stage, uses_online(self.v))
        cache = {n.key for n in multi_pass_leaves(self.stage)} if self.v.cache else set()
        self.cached = sorted(cache)
        seen: set = set()
        row_env: dict = {}
        for targets, reds, outs in passes:
            accs = []
            for r in reds:
                a = self.fresh("acc")
                s(f"{a} = {identity(r)}")
                ai = ""
                if isinstance(r, Online):
                    ai = a + "s"
                    s(f"{ai} = {TYPE_NAMES[acc_dtype(r)]}(0)")
                    self.online_used = True
                elif r.op in ir.INDEX_REDUCE:
                    ai = a + "i"
                    s(f"{ai} = int64(9223372036854775807)")
                accs.append((r, a, ai))
            first = {k for k in pass_leaves(targets) if k in cache and k not in seen}
            reads = {k for k in pass_leaves(targets) if k in cache and k in seen}
            seen |= pass_leaves(targets)
            for line in red_index_setup():
                s(line)
            width = self.v.vector
            if width > 1:
                s(f"j = j * {width}")
            s("while j < nred:")
            with s.block():
                for line in self.unravel("j", [f"dr{i}" for i in range(self.v.red_rank)], "j"):
                    s(line)
                if width > 1:
                    self.write_vector_elements(targets, accs, outs, row_env, first, reads)
                else:
                    self.write_elements(accs, outs, row_env, first, reads)
                s(f"j += jstep * {width}" if width > 1 else "j += jstep")
            for r, a, ai in accs:
                for line in group_reduce(r, a, ai):
                    s(line)
                row_env[r.key] = self.fresh("r")
                if isinstance(r, Online):  # rescale to the true maximum (NaN propagates)
                    peak, t = row_env[r.peak.key], TYPE_NAMES[acc_dtype(r)]
                    rescaled = f"{ai} * {t}(exp({a} - {peak}))"
                    s(f"{row_env[r.key]} = {ai} if {a} == {peak} else {rescaled}")
                else:
                    s(f"{row_env[r.key]} = {final_value(r, a, ai)}")
            # row-space values that are now computable
            self.emit_row_values(row_env)
        lead = group_lead()
        row_outs = [(i, n) for i, (n, _) in enumerate(self.outputs) if self.space[id(n)] == "row"]
        if row_outs:
            s(f"if {lead}:")
            with s.block():
                for i, n in row_outs:
                    val = self.value(n, row_env, self.loader(set()))
                    s(f"out{i}[{self.index(True, False)}] = {self._store_cast(n, val)}")

    def write_elements(self, accs, outs, row_env, first, reads) -> None:
        """One element per thread per step: load or recall, accumulate, write."""
        s = self.src
        env = dict(row_env)
        load = self.loader(reads)
        for key in sorted(first):
            leaf = next(n for n in self.leaves if n.key == key)
            var = self.value(leaf, env, load)
            s(f"cache_{self.names[key]}[{self.cache_index}] = {var}")
        for r, a, ai in accs:
            for line in self.fold_element(r, a, ai, env, load, "j"):
                s(line)
        for i, n in outs:
            val = self.value(n, env, load)
            s(f"out{i}[{self.index(True, True)}] = {self._store_cast(n, val)}")

    def fold_element(self, r, a: str, ai: str, env: dict, load, index: str) -> list[str]:
        """Statements folding this element of ``r``'s source into its accumulator."""
        if isinstance(r, Online):
            f = r.peak.srcs[0]
            v = _cast(self.value(f, env, load), f.dtype, r.dtype)
            return online_element(r, a, ai, v)
        return combine(r, a, element_value(r, self.value(r.srcs[0], env, load)), ai, index)

    def write_vector_elements(self, targets, accs, outs, row_env, first, reads) -> None:
        """``vector`` consecutive elements per thread per step, through 16-byte loads and
        stores; the elements are folded in index order, so ties resolve as in the scalar loop."""
        s = self.src
        width = self.v.vector
        lanes = [dict(row_env) for _ in range(width)]
        at = f"({self.index(True, True)},)"
        for key in sorted(pass_leaves(targets)):
            name = self.names[key]
            parts = [self.fresh(f"{name}_") for _ in range(width)]
            if key in reads:
                for lane, part in enumerate(parts):
                    s(f"{part} = cache_{name}[{self.cache_at(lane)}]")
            else:
                s(f"{', '.join(parts)} = load16({name}, {at})")
                if key in first:
                    for lane, part in enumerate(parts):
                        s(f"cache_{name}[{self.cache_at(lane)}] = {part}")
            for lane, part in enumerate(parts):
                lanes[lane][key] = part
        no_load = self.loader(set())
        for lane in range(width):
            for r, a, ai in accs:
                for line in self.fold_element(r, a, ai, lanes[lane], no_load, f"(j + {lane})"):
                    s(line)
        for i, n in outs:
            t = TYPE_NAMES[np.dtype(n.dtype)]
            vals = [f"{t}({self.value(n, lanes[lane], no_load)})" for lane in range(width)]
            s(f"store16(out{i}, {at}, ({', '.join(vals)}))")

    def cache_at(self, lane: int) -> str:
        return self.cache_index.replace("j", f"j + {lane}")

    def emit_row_values(self, env: dict) -> None:
        """Compute, once per row, every row-space value whose operands are now known, and the
        reciprocal of every per-row divisor (one division per row instead of one per element;
        the result may differ from an IEEE division in the last bit)."""
        for n in self.nodes:
            if n.key in env or self.space[id(n)] != "row" or n.op in ir.REDUCE:
                continue
            if all(s.key in env or self.space[id(s)] == "const" for s in n.srcs):
                self.value(n, env, self.loader(set()))
        for n in self.nodes:
            if n.op is not Op.TRUEDIV or self.space[id(n)] != "F" or "rcp:" + n.key in env:
                continue
            divisor = n.srcs[1]
            if self.space[id(divisor)] == "row" and divisor.key in env and is_float(n.dtype):
                t = TYPE_NAMES[compute_dtype(n.dtype)]
                var = self.fresh("rcp")
                self.src(f"{var} = {t}(1.0) / {_cast(env[divisor.key], divisor.dtype, n.dtype)}")
                env["rcp:" + n.key] = var

    # row template ---------------------------------------------------------------------------
    def write_row(self) -> None:
        s = self.src
        warp = self.v.mode == "warp"
        kept = [f"dk{i}" for i in range(self.v.kept_rank)]
        s(f"nred = {' * '.join(f'dr{i}' for i in range(self.v.red_rank))}")
        s(f"nkept = {' * '.join(kept)}")
        if warp:
            s("lane = cuda.threadIdx.x & 31")
            s("group = cuda.threadIdx.x >> 5")
            s("groups = cuda.blockDim.x >> 5")
            s("jstep = 32")
            self.cache_index = "group, j"
            rows_per_block = BLOCK // WARP
        else:
            s("lane = cuda.threadIdx.x")
            s("group = 0")
            s("groups = 1")
            s("jstep = cuda.blockDim.x")
            s(f"#SCRATCH {WARP}")  # declared by _fix_scratch once the reductions are known
            self.cache_index = "j"
            rows_per_block = 1
        self._declare_caches(rows_per_block)
        s("row = cuda.blockIdx.x * groups + group")
        s("while row < nkept:")
        with s.block():
            for line in self.unravel("row", kept, "k"):
                s(line)

            def setup():
                return ["j = lane"]

            def reduce(r, a, ai):
                lines = self.warp_allreduce(r, a, ai)
                if not warp:
                    lines += self.block_combine(r, a, ai)
                return lines

            self.write_reduce_body(reduce, lambda: "lane == 0", setup)
            s("row += cuda.gridDim.x * groups")
        self._fix_scratch()

    def _declare_caches(self, groups: int) -> None:
        if not self.v.cache:
            return
        self._cache_decl_at = len(self.src.lines)
        self._cache_groups = groups

    def _fix_scratch(self) -> None:
        """Declare the shared scratch and the row caches now that the body is known.

        One scratch array per accumulator dtype: int64 and float64 partials must not share one.
        """
        lines = self.src.lines
        if self.v.cache and self.cached:
            leaves = [n for n in self.leaves if n.key in self.cached]
            length = cache_length(self.stage, self._cache_groups)
            indent = "    "
            decl = []
            for n in leaves:
                shape = (
                    f"({self._cache_groups}, {length})" if self.v.mode == "warp" else str(length)
                )
                decl.append(
                    f"{indent}cache_{self.names[n.key]} = cuda.shared.array({shape}, "
                    f"{TYPE_NAMES[np.dtype(n.dtype)] if n.dtype != np.float16 else 'float16'})"
                )
            lines[self._cache_decl_at : self._cache_decl_at] = decl
            self.cache_length = length
        for i, line in enumerate(lines):
            if line.strip().startswith("#SCRATCH"):
                indent, shape = line.split("#SCRATCH")[0], line.split("#SCRATCH")[1].strip()
                dtypes = sorted({TYPE_NAMES[acc_dtype(r)] for r in self.reductions})
                decl = {f"scratch_{t}": t for t in dtypes}
                if any(r.op in ir.INDEX_REDUCE for r in self.reductions):
                    decl["scratch_index"] = "int64"
                if self.online_used:  # the running sums of online normalisers
                    decl.update({f"scratch_{t}_b": t for t in dtypes if t.startswith("float")})
                lines[i : i + 1] = [
                    f"{indent}{name} = cuda.shared.array({shape}, {t})" for name, t in decl.items()
                ]
                break

    def warp_allreduce(self, r: Node, a: str, ai: str) -> list[str]:
        """Every lane of the warp gets the warp's result, through tessera_tile.warp."""
        mask = "0xFFFFFFFF"
        if isinstance(r, Online):  # a (max, sum) pair: xor butterfly with the online merge
            b = a + "_o"
            out = ["off = 16", "while off > 0:"]
            out.append(f"    {b} = cuda.shfl_xor_sync({mask}, {a}, off)")
            out.append(f"    {b}i = cuda.shfl_xor_sync({mask}, {ai}, off)")
            out += ["    " + line for line in combine(r, a, b, ai, b + "i")]
            out.append("    off >>= 1")
            return out
        if r.op in ir.INDEX_REDUCE:
            fn = "warp_argmax" if r.op is Op.ARGMAX else "warp_argmin"
            return [f"{a}, {ai} = {fn}({a}, {ai}, {mask})"]
        dtype = acc_dtype(r)
        name = f"warp_all{r.op.name.lower()}_{TYPE_NAMES[dtype]}"
        self.helpers[name] = warp.make_warp_allreduce(WARP_OPS[r.op], dtype)
        return [f"{a} = {name}({a}, {mask})"]

    @staticmethod
    def fold_partials(r: Node, a: str, ai: str, guard: str, slot, count: str) -> list[str]:
        """Publish each partial to shared scratch, then every thread folds them in slot order.

        ``slot(w)`` is the scratch index of partial ``w``; ``guard`` says who publishes.
        """
        t = TYPE_NAMES[acc_dtype(r)]
        second = f"scratch_{t}_b" if isinstance(r, Online) else "scratch_index"
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

    def block_combine(self, r: Node, a: str, ai: str) -> list[str]:
        """Lane 0 of each warp publishes the warp's result; warps fold in order."""
        return self.fold_partials(
            r, a, ai, "(cuda.threadIdx.x & 31) == 0",
            lambda w: "cuda.threadIdx.x >> 5" if w is None else w,
            "(cuda.blockDim.x + 31) >> 5",
        )  # fmt: skip

    # column template ------------------------------------------------------------------------
    def write_column(self) -> None:
        s = self.src
        kept = [f"dk{i}" for i in range(self.v.kept_rank)]
        s(f"nred = {' * '.join(f'dr{i}' for i in range(self.v.red_rank))}")
        s(f"nkept = {' * '.join(kept)}")
        s(f"#SCRATCH ({COLUMN_BLOCK[1]}, {COLUMN_BLOCK[0]})")
        s("tx = cuda.threadIdx.x")
        s("ty = cuda.threadIdx.y")
        s("jstep = cuda.blockDim.y")
        s("base = cuda.blockIdx.x * cuda.blockDim.x")
        s("while base < nkept:")
        with s.block():
            s("row = base + tx")
            s("active = row < nkept")
            s("if not active:")
            s("    row = nkept - 1")
            for line in self.unravel("row", kept, "k"):
                s(line)

            def setup():
                return ["j = ty if active else nred"]

            def reduce(r, a, ai):
                return self.column_combine(r, a, ai)

            self.write_reduce_body(reduce, lambda: "active and ty == 0", setup)
            s("base += cuda.gridDim.x * cuda.blockDim.x")
        self._fix_scratch()

    def column_combine(self, r: Node, a: str, ai: str) -> list[str]:
        """Every y thread of a column publishes; the column's partials fold in y order."""
        return self.fold_partials(
            r, a, ai, "True", lambda w: "ty, tx" if w is None else f"{w}, tx", "cuda.blockDim.y"
        )

    # full template --------------------------------------------------------------------------
    def write_full(self) -> None:
        s = self.src
        red = [f"dr{i}" for i in range(self.v.red_rank)]
        s(f"nred = {' * '.join(red)}")
        s(f"#SCRATCH {WARP}")
        for i in range(self.v.kept_rank):
            s(f"k{i} = 0")
        passes = plan_passes(self.stage)
        assert len(passes) <= 1 or not passes[1][1], "full stages have one reduction level"
        targets, reds, outs = passes[0] if passes else ([], [], [])
        accs = []
        for r in reds:
            a = self.fresh("acc")
            ai = a + "i" if r.op in ir.INDEX_REDUCE else ""
            s(f"{a} = {identity(r)}")
            if ai:
                s(f"{ai} = int64(9223372036854775807)")
            accs.append((r, a, ai))
        s("j = cuda.grid(1)")
        s("jstep = cuda.gridsize(1)")
        s("while j < nred:")
        with s.block():
            for line in self.unravel("j", red, "j"):
                s(line)
            env: dict = {}
            load = self.loader(set())
            for r, a, ai in accs:
                val = element_value(r, self.value(r.srcs[0], env, load))
                for line in combine(r, a, val, ai, "j"):
                    s(line)
            for i, n in outs:
                val = self.value(n, env, load)
                s(f"out{i}[{self.index(True, True)}] = {self._store_cast(n, val)}")
            s("j += jstep")
        for ri, (r, a, ai) in enumerate(accs):
            for line in self.warp_allreduce(r, a, ai) + self.block_combine(r, a, ai):
                s(line)
            s("if cuda.threadIdx.x == 0:")
            s(f"    part{ri}[cuda.blockIdx.x] = {a}")
            if ai:
                s(f"    parti{ri}[cuda.blockIdx.x] = {ai}")
        row_outs = [(i, n) for i, (n, _) in enumerate(self.outputs) if self.space[id(n)] == "row"]
        if not accs:
            self._fix_scratch()
            return
        s("if cuda.threadIdx.x == 0:")
        with s.block():
            s("cuda.threadfence()")
            s("done = cuda.atomic.add(ticket, 0, 1)")
            s("if done == cuda.gridDim.x - 1:")
            with s.block():
                row_env: dict = {}
                for ri, (r, a, ai) in enumerate(accs):
                    t = TYPE_NAMES[acc_dtype(r)]
                    s(f"{a} = {t}(part{ri}[0])")
                    if ai:
                        s(f"{ai} = parti{ri}[0]")
                    s("b = 1")
                    s("while b < cuda.gridDim.x:")
                    s(f"    {a}_b = {t}(part{ri}[b])")
                    if ai:
                        s(f"    {a}_bi = parti{ri}[b]")
                    for line in combine(r, a, f"{a}_b", ai, f"{a}_bi" if ai else ""):
                        s("    " + line)
                    s("    b += 1")
                    row_env[r.key] = self.fresh("r")
                    s(f"{row_env[r.key]} = {final_value(r, a, ai)}")
                for i, n in row_outs:
                    val = self.value(n, row_env, self.loader(set()))
                    s(f"out{i}[{self.index(True, False)}] = {self._store_cast(n, val)}")
                s("ticket[0] = 0")
        self._fix_scratch()


# --------------------------------------------------------------------------------------------
# compile and cache


class KernelCache:
    """Compiled kernels by (stage fingerprint, variant, target); counts hits and misses."""

    def __init__(self):
        self._kernels: dict = {}
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, stage: Stage, variant: Variant) -> Generated:
        key = (stage.key, variant, "sim" if device.SIMULATED else "cuda")
        with self._lock:
            got = self._kernels.get(key)
            if got is not None:
                self.hits += 1
                return got
            self.misses += 1
            got = generate(stage, variant)
            self._kernels[key] = got
            return got

    def clear(self) -> None:
        with self._lock:
            self._kernels.clear()
            self.hits = self.misses = 0


def kernel_name(stage: Stage, variant: Variant) -> str:
    ops = [n.op.name.lower() for n in stage.nodes if n.op not in ir.LEAF]
    head = "_".join(dict.fromkeys(ops))[:40] or "copy"
    digest = hashlib.blake2b(f"{stage.key}{variant}".encode(), digest_size=4).hexdigest()
    return f"fused_{variant.kind}_{head}_{digest}"


def generate(stage: Stage, variant: Variant) -> Generated:
    """Source and compiled (lazy) kernel of one stage variant."""
    from numba import cuda, types

    name = kernel_name(stage, variant)
    writer = KernelWriter(stage, variant, name)
    source = writer.write()
    filename = f"<tessera_tile generated {name}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    if os.environ.get("TESSERA_TILE_DUMP"):
        print(source)
    namespace = {
        "cuda": cuda,
        "np": np,
        "inf": float("inf"),
        "boolean": types.boolean,
        "int32": types.int32,
        "int64": types.int64,
        "float16": types.float16,
        "float32": types.float32,
        "float64": types.float64,
        "max_nan": device.max_nan,
        "min_nan": device.min_nan,
        "floordiv_int": device.floordiv_int,
        "floordiv_float": device.floordiv_float,
        "mod_int": device.mod_int,
        "mod_float": device.mod_float,
        "pow_int": device.pow_int,
        "load16": memory.load16,
        "store16": memory.store16,
        "warp_argmax": warp.warp_argmax,
        "warp_argmin": warp.warp_argmin,
        **writer.helpers,
        **device.MATH,
    }
    exec(compile(source, filename, "exec"), namespace)  # noqa: S102 - our own generated code
    return Generated(name, source, namespace[name])
