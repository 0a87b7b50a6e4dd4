"""Rewrites the planner makes before it splits a graph: attention found from its algebra, and
factors of matmul operands that are the same all along K moved onto the product.

``softmax(q @ tt.swapaxes(k, -1, -2) * scale, axis=-1) @ v``, with the softmax written as
``e / tt.sum(e, axis=-1, keepdims=True)`` of ``e = tt.exp(s - tt.max(s, axis=-1,
keepdims=True))``, and ``q``, ``k``, ``v`` arguments of one dtype with one head dimension,
becomes one ``ATTENTION`` node: the flash kernel runs it and the ``Sq x Sk`` scores are never
written. The scale is a constant (``* c`` or ``/ c``; none is 1). The causal form masks the
scaled scores first, ``tt.where(tt.tri(Sq, Sk, Sk - Sq, bool), scores * c, -inf)``: the keys
``ops.attention(causal=True)`` hides (aligned to the bottom right); where ``Sq > Sk`` it is
not rewritten (NumPy gives NaN for a row that sees no key, the flash kernel zeros). Anything
else (another softmax axis, a scale passed at run time, another mask) is left as it is: GEMM
stages and the composer's kernels compute it.

The second: ``(c * a) @ b`` and ``a @ (b * c)``, ``c`` a constant or a scalar argument that
keeps the operand's dtype, become ``c * (a @ b)``: the factor is applied to the accumulator in
the GEMM's epilogue instead of by a kernel that writes the scaled operand (the operand is not
rounded after scaling, as the composer rounds once where it stores). So do factors that are
arrays the same all along K: a row scale of A, ``(a * d) @ b = d * (a @ b)`` with ``d`` of
shape ``(..., M, 1)``, and a column scale of B, ``a @ (b * e) = (a @ b) * e`` with ``e`` of
shape ``(N,)`` or ``(..., 1, N)`` (per-row and per-channel scales of quantized operands); the
epilogue reads them as it reads a bias or a residual. Both operands are 2-D or more, and the
product keeps its dtype and shape.
"""

from __future__ import annotations

from .. import tile_ir as ir
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
    mask = _causal_mask(s)
    if mask is not None:
        tri, s = mask
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
    causal = mask is not None
    if causal:
        sq, sk = q.shape[-2], k.shape[-2]
        if tri.arg != (sq, sk, sk - sq) or sq > sk:
            return None
    # a causal node keeps its mask's shape: a later call's shapes must still be the mask's
    mask_shape = (sq, sk) if causal else None
    return Node(Op.ATTENTION, o.dtype, operands, (scale, mask_shape), o.shape)


def _causal_mask(s: Node) -> tuple[Node, Node] | None:
    """``(tri, scores)`` of ``where(tri, scores, -inf)`` (``tri`` a ``tt.tri``, boolean or
    compared with 0), or None."""
    if s.op is not Op.WHERE:
        return None
    cond, scores, fill = s.srcs
    if cond.op is Op.NE and cond.srcs[1].op is Op.CONST and cond.srcs[1].arg == 0:
        cond = cond.srcs[0]
    if cond.op is not Op.TRI or fill.op is not Op.CONST or fill.arg != float("-inf"):
        return None
    return cond, scores


def _factor(operand: Node, side: int) -> tuple[Node, Node] | None:
    """``(array, factor)`` of ``factor * array`` or ``array * factor``, where the product keeps
    the array's dtype and the factor is the same all along K (``side`` 0: A, whose K axis is
    its last; 1: B, whose K axis is its second last): a constant or scalar argument, or an
    array of a row scale of A (``(M, 1)``) or a column scale of B (``(N,)``, ``(1, N)``)."""
    if operand.op is not Op.MUL:
        return None
    k_axis = -1 if side == 0 else -2
    for a, c in (operand.srcs, operand.srcs[::-1]):
        if operand.dtype != a.dtype or tuple(a.shape) != tuple(operand.shape):
            continue
        if c.ndim:  # broadcast against the operand (2-D or more): extent 1 along K
            padded = (1,) * max(0, operand.ndim - c.ndim) + tuple(c.shape)
            if padded[k_axis] == 1:
                return a, c
        elif c.op in (Op.CONST, Op.SCALAR):
            return a, c
    return None


def scaled_product(n: Node) -> Node | None:
    """``c * (a @ b)`` for a matmul ``n`` of an operand scaled by ``c`` (constant along K), or
    None."""
    if n.op is not Op.MATMUL or any(s.ndim < 2 for s in n.srcs):
        return None
    for i, operand in enumerate(n.srcs):
        found = _factor(operand, i)
        if found is None:
            continue
        array, c = found
        srcs = list(n.srcs)
        srcs[i] = array
        product = ir.matmul(*srcs)
        scaled = ir.elementwise(Op.MUL, product, c)
        if scaled.dtype == n.dtype and tuple(scaled.shape) == tuple(n.shape):
            return scaled
    return None


def rewrite(outputs) -> tuple[tuple[Node, ...], list[str]]:
    """``outputs`` with every attention pattern replaced, and a reason for each."""
    memo: dict[int, Node] = {}
    reasons: list[str] = []

    def visit(n: Node) -> Node:
        got = memo.get(id(n))
        if got is not None:
            return got
        found = attention(n)
        scaled = scaled_product(n) if found is None else None
        if found is not None:
            scale, causal = found.arg[0], found.arg[1] is not None
            masked = f"where(tri, q @ swapaxes(k) * {scale:g}, -inf)" if causal else None
            reasons.append(
                f"attention pattern -> flash kernel: softmax("
                f"{masked or f'q @ swapaxes(k) * {scale:g}'}) @ v in one kernel"
                f"{' (causal)' if causal else ''}, the score matrix never written"
            )
            out = found
        elif scaled is not None:
            reason = (
                "a row scale of A or column scale of B (the same all along K) is applied to "
                "the product in the GEMM's epilogue: (a * d) @ (b * e) = d * (a @ b) * e"
                if scaled.srcs[1].ndim
                else "a scalar factor of a matmul operand is applied to the product in the "
                "GEMM's epilogue: (c * a) @ b = c * (a @ b)"
            )
            if reason not in reasons:  # once, however many factors
                reasons.append(reason)
            out = visit(scaled)
        elif n.srcs:
            srcs = tuple(visit(s) for s in n.srcs)
            same = all(a is b for a, b in zip(srcs, n.srcs, strict=True))
            out = n if same else Node(n.op, n.dtype, srcs, n.arg, n.shape, n.weak)
        else:
            out = n
        memo[id(n)] = out
        return out

    return tuple(visit(o) for o in outputs), reasons
