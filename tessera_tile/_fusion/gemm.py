"""GEMM stages: a matmul inside ``@tt.fuse``, with the elementwise epilogue the planner pulls in.

The planner makes a GEMM stage of one product ``p = a @ b`` (both read from memory, or either
an elementwise chain over one array: its *prologue*, below) and its
results: elementwise functions of ``p``, of other arrays that broadcast into ``p``'s shape (a
bias, a residual), of constants and of scalar arguments, each of ``p``'s shape, in any dtype.
It runs on the matmul ops' kernels (their tiles, pipelines and tuner), with an epilogue
generated here from the composer's expression tables::

    epilogue(x, z, row, col, extras) -> float32

gives the *stored* result at ``C[z, row, col]`` from ``x``, the float32 accumulator of ``p``
there (as the composer holds a float16 or bfloat16 value: unrounded, rounded once where it is
stored), and writes the other results itself, each once, into its own array at the same place
(the *side* results). ``extras`` holds the arrays read, as ``(z, M, N)`` views, then the side
results' arrays, then the scalars. The kernel stores the first result of ``p``'s dtype with its
own (paired) stores; when no result has that dtype (a cast: ``(x @ w).astype(np.float32)``),
the kernel stores nothing and every result is a side result. The kernels call the epilogue on
the edge elements they do not store too, so its reads and writes are guarded by the arrays'
bounds. A bias (``p + b``, ``b`` of shape ``(N,)``, the product's only use) takes the kernels'
own bias path, as ``ops.linear``'s does: staged or shuffled per column, added to ``x`` before
the call.

An operand that is an elementwise chain over one array (``tt.relu(x) @ w``, a cast of a
narrower array: :func:`.plan.prologue_leaf`) is a *prologue*: the kernel reads the array and
computes the chain on each element as its tile is staged, with a function generated here::

    prologue(v) -> the operand's element (float16, bfloat16 bits or float32)

of the array's element ``v`` as stored (``kernels.matmul.prologue``).

A *dual* stage has two products of one left operand, ``p = a @ b`` and ``p2 = a @ b2`` (``b2``
of ``b``'s shape and dtype: a gated MLP's ``silu(x @ w1) * (x @ w3)``). Its kernel reads each
tile of ``a`` once for both, and its epilogue takes both accumulators::

    epilogue(x, x2, z, row, col, extras) -> float32

with ``b2`` the first of ``extras`` (the epilogue's own start one further). It has no bias path.

A stage binds to the matmul plan (or, for attention, the attention plan) in :mod:`.stages`.
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass

import numpy as np

from .. import tile_ir as ir
from ..tile_ir import Node, Op
from .compile import _namespace
from .lower import (
    TYPE_NAMES,
    compute_dtype,
    emit_approx,
    emit_elementwise,
    literal,
    load_cast,
    store_cast,
    vector_element,
)


@dataclass(frozen=True)
class Parts:
    """A GEMM stage's roles: the product, its operands, the arrays and scalars its epilogue
    reads (leaves in the order the kernel takes them), and the results: the one the kernel
    stores (``stored``; None when no result has the product's dtype) and the ``sides`` the
    epilogue writes."""

    product: Node
    a: Node  # the arrays the kernel reads: an operand, or the one its prologue is computed from
    b: Node
    b2: Node | None  # a dual stage's second right operand (its product: product2)
    product2: Node | None
    bias: Node | None  # the kernels' bias, added to the accumulator
    extras: tuple[Node, ...]
    scalars: tuple[Node, ...]
    stored: Node | None
    sides: tuple[Node, ...]
    x: Node  # the value the epilogue starts from: the product, or product + bias
    # positions in stage.outputs: of the stored result (None: none), of the sides
    stored_at: int | None
    sides_at: tuple[int, ...]
    # the operands computed from a and b as their tiles land (plan.prologue_leaf), or None
    pro_a: Node | None = None
    pro_b: Node | None = None

    @property
    def generated(self) -> bool:
        """Whether the stage needs an epilogue beyond the kernels' own (bias, store)."""
        return bool(self.sides) or self.stored is not self.x

    @property
    def ops(self) -> int:
        """Elementwise ops the kernel runs on the accumulator (the bias add included)."""
        results = [n for n in (self.stored, *self.sides) if n is not None]
        products = {id(n) for n in ir.walk([m for m in (self.product, self.product2) if m])}
        return sum(1 for n in ir.walk(results) if n.op in ir.ELEMENTWISE and id(n) not in products)

    @property
    def prologues(self) -> tuple[tuple[str, Node], ...]:
        """``(operand name, operand)`` of each operand computed as its tiles land."""
        return tuple((side, n) for side, n in (("a", self.pro_a), ("b", self.pro_b)) if n)


def _bias(stage, product: Node) -> Node | None:
    """The ADD of the product and a ``(N,)`` array of its dtype, where it is the product's
    only use (the kernels add their bias to the accumulator itself)."""
    if any(n is product for n, _ in stage.outputs) or dual(stage):
        return None
    users = [n for n in stage.nodes if any(s is product for s in n.srcs)]
    if len(users) != 1 or users[0].op is not Op.ADD or users[0].dtype != product.dtype:
        return None
    add = users[0]
    (other,) = [s for s in add.srcs if s is not product] or [None]
    if other is None or other.op is not Op.INPUT or other.dtype != product.dtype:
        return None
    return add if tuple(other.shape) == tuple(product.shape[-1:]) else None


def dual(stage) -> bool:
    return sum(n.op is Op.MATMUL for n in stage.nodes) == 2


def parts(stage) -> Parts:
    results = [n for n, _ in stage.outputs]
    product, product2 = [n for n in stage.nodes if n.op is Op.MATMUL] + [None] * (not dual(stage))
    add = _bias(stage, product)
    bias = next(s for s in add.srcs if s is not product) if add is not None else None
    x = add if add is not None else product
    stored_at = next((i for i, n in enumerate(results) if n.dtype == product.dtype), None)
    sides_at = tuple(i for i in range(len(results)) if i != stored_at)
    # leaves the epilogue itself reads (an operand may be one too: x @ w + x), each once; the
    # kernel's own part (the products, their operands and views, the bias add) reads none
    kernel = {id(n) for n in ir.walk([m for m in (product, product2, add) if m is not None])}
    read = {id(s) for n in stage.nodes if id(n) not in kernel for s in n.srcs}

    def leaves(ops) -> tuple[Node, ...]:
        found = {n.key: n for n in stage.nodes if n.op in ops and id(n) in read}
        return tuple(found.values())

    a, b = product.srcs
    pro_a, pro_b = (n if n.op in ir.ELEMENTWISE else None for n in (a, b))
    # the planner kept a computed operand in the stage only as a prologue: the kernel reads its
    # leaf (plan.prologue_leaf)
    a, b = (n if pro is None else _leaf(pro) for n, pro in ((a, pro_a), (b, pro_b)))
    b2 = product2.srcs[1] if product2 is not None else None
    extras, scalars = leaves({Op.INPUT}), leaves({Op.SCALAR})
    stored = results[stored_at] if stored_at is not None else None
    sides = tuple(results[i] for i in sides_at)
    return Parts(
        product, a, b, b2, product2, bias, extras, scalars, stored, sides, x, stored_at, sides_at,
        pro_a, pro_b,
    )  # fmt: skip


def _leaf(operand: Node) -> Node:
    return next(n for n in ir.walk([operand]) if n.op is Op.INPUT)


def _emit(roots, env: dict, skip: set, math: str, lines: list[str]) -> None:
    """Statements computing ``roots`` into ``env`` (node key -> expression), one per
    elementwise node below them that is not in ``env`` or ``skip`` (ids); constants inline."""
    count = 0
    for n in ir.walk(roots):
        if n.key in env or id(n) in skip or n.op is Op.INPUT:
            continue
        if n.op is Op.CONST:
            value = literal(n.arg)
            env[n.key] = value if n.weak else f"{TYPE_NAMES[compute_dtype(n.dtype)]}({value})"
            continue
        args = [env[s.key] for s in n.srcs]
        # the numerics policy's one rcp.approx per sigmoid and silu (schedule.approximated)
        fast = math == "fast" and n.op in (Op.SIGMOID, Op.SILU)
        fast = fast and compute_dtype(n.dtype) == np.dtype(np.float32)
        lines.append(f"    t{count} = {(emit_approx if fast else emit_elementwise)(n, args)}")
        env[n.key] = f"t{count}"
        count += 1


def prologue_source(operand: Node, math: str) -> tuple[str, str]:
    """``(name, source)`` of the device function ``fn(v)`` computing one element of a
    prologue ``operand`` from its leaf's element ``v`` as stored, in the operand's dtype as the
    composer stores it (a bfloat16's bits: ``kernels.matmul.prologue``)."""
    digest = hashlib.blake2b(f"{operand.key}{math}".encode(), digest_size=4).hexdigest()
    name = f"prologue_{digest}"
    leaf = _leaf(operand)
    lines = [f"def {name}(v):", f"    x = {load_cast(leaf.dtype, 'v')}"]
    env = {leaf.key: "x"}
    _emit([operand], env, set(), math, lines)
    lines.append(f"    return {vector_element(operand, env[operand.key])}")
    return name, "\n".join(lines) + "\n"


def epilogue_source(stage, math: str) -> tuple[str, str]:
    """``(name, source)`` of the stage's epilogue device function."""
    p = parts(stage)
    digest = hashlib.blake2b(f"{stage.key}{math}".encode(), digest_size=4).hexdigest()
    name = f"epilogue_{digest}"
    second = p.product2 is not None
    lines = [f"def {name}(x, {'x2, ' if second else ''}z, row, col, extras):"]
    env = {p.x.key: "x"}  # the accumulator (+ bias), as the composer holds the product's dtype
    if second:
        env[p.product2.key] = "x2"
    at = int(second)  # a dual kernel's b2 comes first
    lines += [f"    e{i} = extras[{at + i}]" for i in range(len(p.extras))]
    lines += [f"    o{i} = extras[{at + len(p.extras) + i}]" for i in range(len(p.sides))]
    for j, leaf in enumerate(p.scalars):
        env[leaf.key] = f"s{j}"
        lines.append(f"    s{j} = extras[{at + len(p.extras) + len(p.sides) + j}]")
    first = "e0" if p.extras else "o0" if p.sides else None
    if first:  # an edge element past C's end: nothing to read or write, nothing stored
        lines.append(f"    if row >= {first}.shape[1] or col >= {first}.shape[2]:")
        lines.append("        return x")
    for i, leaf in enumerate(p.extras):  # unsigned indices: no negative-index wraparound code
        env[leaf.key] = f"v{i}"
        at = f"e{i}[uint64(z), uint64(row), uint64(col)]"
        lines.append(f"    v{i} = {load_cast(leaf.dtype, at)}")
    # the products (and bias, and operand prologues): the kernel's part
    below = {id(n) for n in ir.walk([p.x, *([p.product2] if second else [])])}
    results = [n for n in (p.stored, *p.sides) if n is not None]
    _emit(results, env, below, math, lines)
    for i, side in enumerate(p.sides):  # each side result written once, in its own dtype
        at = f"o{i}[uint64(z), uint64(row), uint64(col)]"
        lines.append(f"    {at} = {store_cast(side, env[side.key])}")
    lines.append(f"    return float32({env[p.stored.key] if p.stored is not None else 'x'})")
    return name, "\n".join(lines) + "\n"


@functools.cache
def epilogue_function(source: str, name: str):
    """The device function of an epilogue's source, made once per source."""
    from numba import cuda

    namespace = _namespace()
    exec(compile(source, f"<tessera_tile generated {name}>", "exec"), namespace)  # noqa: S102
    return cuda.jit(device=True)(namespace[name])
