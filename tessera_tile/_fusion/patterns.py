"""Rewrites the planner makes before it splits a graph: attention found from its algebra.

``softmax(q @ tt.swapaxes(k, -1, -2) * scale, axis=-1) @ v``, with the softmax written as
``e / tt.sum(e, axis=-1, keepdims=True)`` of ``e = tt.exp(s - tt.max(s, axis=-1,
keepdims=True))``, and ``q``, ``k``, ``v`` arguments of one dtype with one head dimension,
becomes one ``ATTENTION`` node: the flash kernel runs it and the ``Sq x Sk`` scores are never
written. The scale is a constant (``* c`` or ``/ c``; none is 1). Anything else (another softmax
axis, a scale passed at run time, a mask) is left as it is: GEMM stages and the composer's
kernels compute it.
"""

from __future__ import annotations

from ..tile_ir import Node, Op


def _last_axis_reduce(n: Node, op: Op) -> Node | None:
    """The source of ``op(src, axis=-1, keepdims=True)``, or None."""
    if n.op is not op:
        return None
    axes, keepdims, flat = n.arg
    src = n.srcs[0]
    return src if axes == (src.ndim - 1,) and keepdims and not flat else None


def _scale(s: Node) -> tuple[Node, float] | None:
    """``(scores, scale)`` of ``scores * c``, ``c * scores``, ``scores / c`` or ``scores``."""
    if s.op is Op.MATMUL:
        return s, 1.0
    if s.op not in (Op.MUL, Op.TRUEDIV):
        return None
    a, b = s.srcs
    if s.op is Op.MUL and a.op is Op.CONST:
        a, b = b, a
    if a.op is not Op.MATMUL or b.op is not Op.CONST or isinstance(b.arg, bool):
        return None
    value = float(b.arg)
    return a, (value if s.op is Op.MUL else 1.0 / value)


def attention(o: Node) -> Node | None:
    """The ATTENTION node that computes ``o``, or None where ``o`` is not the pattern."""
    if o.op is not Op.MATMUL:
        return None
    p, v = o.srcs
    if p.op is not Op.TRUEDIV:
        return None
    e, total = p.srcs
    summed = _last_axis_reduce(total, Op.SUM)
    if summed is None or summed.key != e.key or e.op is not Op.EXP:
        return None
    shifted = e.srcs[0]
    if shifted.op is not Op.SUB:
        return None
    s, peak = shifted.srcs
    top = _last_axis_reduce(peak, Op.MAX)
    if top is None or top.key != s.key:
        return None
    found = _scale(s)
    if found is None:
        return None
    scores, scale = found
    q, kt = scores.srcs
    if kt.op is not Op.SWAPAXES or kt.arg != (kt.ndim - 2, kt.ndim - 1):
        return None
    k = kt.srcs[0]
    operands = (q, k, v)
    if any(n.op is not Op.INPUT or n.ndim < 2 for n in operands):
        return None
    if len({n.dtype for n in (*operands, o)}) != 1 or len({n.shape[-1] for n in operands}) != 1:
        return None
    return Node(Op.ATTENTION, o.dtype, operands, scale, o.shape)


def rewrite(outputs) -> tuple[tuple[Node, ...], list[str]]:
    """``outputs`` with every attention pattern replaced, and a reason for each."""
    memo: dict[int, Node] = {}
    reasons: list[str] = []

    def visit(n: Node) -> Node:
        got = memo.get(id(n))
        if got is not None:
            return got
        found = attention(n)
        if found is not None:
            reasons.append(
                f"attention pattern -> flash kernel: softmax(q @ swapaxes(k) * {found.arg:g}) "
                "@ v in one kernel, the score matrix never written"
            )
            out = found
        elif n.srcs:
            srcs = tuple(visit(s) for s in n.srcs)
            same = all(a is b for a, b in zip(srcs, n.srcs, strict=True))
            out = n if same else Node(n.op, n.dtype, srcs, n.arg, n.shape, n.weak)
        else:
            out = n
        memo[id(n)] = out
        return out

    return tuple(visit(o) for o in outputs), reasons
