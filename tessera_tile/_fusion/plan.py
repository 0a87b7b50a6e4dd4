"""Planning: split a traced graph into as few kernels (stages) as the data allows.

Every stage iterates one index space F (a broadcast shape) and reduces over one axis set R:

* ``elementwise``: R is empty; one flat grid-stride loop over F;
* ``row``: R holds F's fastest axis; a warp or a block per kept index ("row"), a loop over R;
* ``column``: R lies before F's fastest axis; threads along the kept (contiguous) axis, the
  loop over R split across the block's y dimension and, for one pass of reductions, across
  blocks too (per-block partials folded in order: :mod:`.columns`);
* ``full``: R holds every axis; two-stage, one launch: blocks reduce chunks, the last block to
  finish combines the partials in block order (deterministic);
* ``gemm``: one matmul (operands read from memory, or computed from one array each as their
  tiles land: :func:`prologue_leaf`) and the elementwise epilogue over its product, on the
  matmul ops' kernels (:mod:`.gemm`);
* ``attention``: softmax(q @ k^T * scale) @ v, found by :mod:`.patterns`, on the flash kernel.

A reduction whose result is combined with F-space values again (softmax, layer norm) stays in
the same stage: the stage makes several passes over each row, one per dependency level of its
reductions, and keeps the row on chip between passes when it fits. A value that cannot be
computed inside a stage (a reduction over other axes, a full reduction broadcast back, an output
of another shape) is materialized by an earlier stage into a temporary array; each such split is
recorded with its reason.
"""

from __future__ import annotations

import enum
import functools
from dataclasses import dataclass, field

import numpy as np

from .. import tile_ir as ir
from ..tile_ir import Node, Op
from . import patterns


class StageKind(enum.Enum):
    """How a stage maps its index space to threads (the module docstring)."""

    ELEMENTWISE = "elementwise"
    ROW = "row"
    COLUMN = "column"
    FULL = "full"
    GEMM = "gemm"
    ATTENTION = "attention"

    @property
    def hand_written(self) -> bool:
        """Whether an ops kernel runs it (a matmul's, the flash kernel), not generated code."""
        return self in (StageKind.GEMM, StageKind.ATTENTION)

    @property
    def scratch(self) -> bool:
        """Whether its launch takes partials per block and a ticket (the two-stage full
        reduction)."""
        return self is StageKind.FULL

    def __repr__(self) -> str:  # variants, kernel names and cache keys spell the kind plainly
        return repr(self.value)

    def __str__(self) -> str:
        return self.value


@dataclass
class Stage:
    """One kernel launch."""

    kind: StageKind
    axes: tuple[int, ...]  # R
    outputs: list[tuple[Node, object]]  # (node, destination): ("out", k) or ("temp", k)
    space: dict[int, str] = field(default_factory=dict)  # id(node) -> "F", "row" or "const"

    # Derived once: a stage never changes after planning, and calls read these every time.
    @functools.cached_property
    def nodes(self) -> list[Node]:
        return ir.walk([n for n, _ in self.outputs])

    @functools.cached_property
    def reductions(self) -> list[Node]:
        """In dependency order; ``codegen.plan_passes`` groups them into passes."""
        return [n for n in self.nodes if n.op in ir.REDUCE]

    @functools.cached_property
    def leaves(self) -> list[Node]:
        """Input arrays, one per distinct value, in the order the kernel takes them."""
        return _unique([n for n in self.nodes if n.op is Op.INPUT])

    @functools.cached_property
    def scalars(self) -> list[Node]:
        """Run-time scalars (SCALAR and COUNT leaves), in the order the kernel takes them."""
        return _unique([n for n in self.nodes if n.op in (Op.SCALAR, Op.COUNT)])

    @functools.cached_property
    def key(self) -> str:
        return ir.fingerprint([n for n, _ in self.outputs])


def _unique(nodes: list[Node]) -> list[Node]:
    seen: set = set()
    return [n for n in nodes if not (n.key in seen or seen.add(n.key))]


@dataclass
class Plan:
    stages: list[Stage]
    temps: dict[int, Node]  # temp id -> the original node it holds
    reasons: list[str]


def _dual(products) -> bool:
    """Two products one kernel computes together: the same left operand, right operands of
    one shape and dtype (a gated MLP's ``x @ w1`` and ``x @ w3``)."""
    if len(products) != 2:
        return False
    (a, b), (a2, b2) = (p.srcs for p in products)
    return a.key == a2.key and b.shape == b2.shape and b.dtype == b2.dtype


def prologue_leaf(operand: Node, nodes, outputs) -> Node | None:
    """The one array a matmul operand is computed from, where the GEMM kernel can compute the
    operand as the array's tiles are staged (an operand *prologue*), else None.

    That is an elementwise chain over one array of the operand's shape and constants (no
    scalar argument), whose values nothing but the product reads, the array of the operand's
    dtype or a number of no more bytes (``x16.astype(np.float32) @ w``: a cast on the way in).
    The kernel reads the array where it would have read the operand, as many bytes or fewer,
    and the operand is never written and read back; its elements are computed once per tile of
    C that reads them (``N / tile_n`` times for A) instead of once. An array of more bytes
    (float32 cast into a float16 operand) would be read at its width once per tile of C, more
    bytes than writing the narrow operand once past two tiles of C: it runs in a kernel of its
    own.
    """
    if operand.op not in ir.ELEMENTWISE:
        return None
    chain = list(ir.walk([operand]))
    leaves = {n.key: n for n in chain if n.op is Op.INPUT}
    if len(leaves) != 1 or any(
        n.op not in ir.ELEMENTWISE and n.op not in (Op.INPUT, Op.CONST) for n in chain
    ):
        return None
    (leaf,) = leaves.values()
    if tuple(leaf.shape) != tuple(operand.shape) or not _widens(leaf.dtype, operand.dtype):
        return None
    inner = {id(n) for n in chain if n.op in ir.ELEMENTWISE}  # a leaf or constant may be shared
    if any(id(n) in inner for n, _ in outputs):
        return None
    for n in nodes:  # read by nothing but the chain and the product
        if id(n) not in inner and n.op is not Op.MATMUL and any(id(s) in inner for s in n.srcs):
            return None
    return leaf


def _widens(src, dst) -> bool:
    """Whether a prologue may read an array of ``src`` for an operand of ``dst``: the same
    dtype, or a number of no more bytes (converted where it is loaded)."""
    src, dst = np.dtype(src), np.dtype(dst)
    numeric = src.kind in "biuf" or src == ir.BFLOAT16
    return src == dst or (numeric and src.itemsize <= dst.itemsize)


def _is_reduce(n: Node) -> bool:
    return n.op in ir.REDUCE


def _is_full(f_shape, axes) -> bool:
    """A reduction over every axis: many blocks share it (two-stage, one launch).

    A reduction over some axes whose kept axes all have length 1 (softmax of one row) is not
    full: it stays a row reduction, so that reduce-then-broadcast still fits one kernel.
    """
    return bool(axes) and len(axes) == len(f_shape)


def _fits(shape, f_shape) -> bool:
    """True when ``shape`` broadcasts into ``f_shape`` without growing it."""
    try:
        return ir.broadcast_shapes(shape, f_shape) == tuple(f_shape)
    except ValueError:
        return False


def _padded(shape, ndim) -> tuple[int, ...]:
    return (1,) * (ndim - len(shape)) + tuple(shape)


class _Planner:
    def __init__(self):
        self.stages: list[Stage] = []
        self.temps: dict[int, Node] = {}
        self.reasons: list[str] = []
        self.materialized: dict[str, Node] = {}  # node key -> temp leaf

    # graph rewriting ------------------------------------------------------------------------
    def substitute(self, node: Node, memo: dict) -> Node:
        """``node`` with every materialized sub-value replaced by its temp leaf."""
        got = memo.get(id(node))
        if got is not None:
            return got
        if node.key in self.materialized:
            out = self.materialized[node.key]
        elif not node.srcs:
            out = node
        else:
            srcs = tuple(self.substitute(s, memo) for s in node.srcs)
            if all(a is b for a, b in zip(srcs, node.srcs, strict=True)):
                out = node
            else:
                out = Node(node.op, node.dtype, srcs, node.arg, node.shape, node.weak)
        memo[id(node)] = out
        return out

    def materialize(self, node: Node, reason: str, outputs) -> None:
        """Plan ``node`` in earlier stages; later stages read it back from memory.

        A node that is also a result of the function goes straight to its output array.
        """
        if node.key in self.materialized:
            return
        assert node.op is not Op.INPUT, "an input is already in memory"
        dest = next((d for n, d in outputs if n.key == node.key), None)
        assert len(outputs) > 1 or dest is None, "planning a lone result again cannot progress"
        if dest is None:
            dest = ("temp", len(self.temps))
            self.temps[dest[1]] = node
        self.plan_group([(node, dest)])
        self.materialized[node.key] = Node(Op.INPUT, node.dtype, arg=dest, shape=node.shape)
        self.reasons.append(reason)

    # classification -----------------------------------------------------------------------
    @staticmethod
    def spaces(nodes) -> dict[int, str]:
        space: dict[int, str] = {}
        for n in nodes:
            if n.op is Op.INPUT or n.op in ir.GENERATED:
                space[id(n)] = "F"
            elif n.op in ir.LEAF:
                space[id(n)] = "const"
            elif _is_reduce(n):
                space[id(n)] = "row"
            else:
                kinds = {space[id(s)] for s in n.srcs}
                space[id(n)] = "F" if "F" in kinds else "row" if "row" in kinds else "const"
        return space

    def plan_group(self, outputs: list[tuple[Node, object]]) -> None:
        while True:
            memo: dict = {}
            outputs = [(self.substitute(n, memo), d) for n, d in outputs]
            # a result already written by an earlier stage needs nothing more
            outputs = [(n, d) for n, d in outputs if not (n.op is Op.INPUT and n.arg == d)]
            if not outputs:
                return
            nodes = ir.walk([n for n, _ in outputs])
            space = self.spaces(nodes)
            problem = self.find_problem(outputs, nodes, space)
            if problem is None:
                break
            kind, node, reason = problem
            if kind == "materialize":
                self.materialize(node, reason, outputs)
            else:  # an output planned on its own
                outputs = [(n, d) for n, d in outputs if n is not node]
                self.plan_group([(node, kind)])
                self.reasons.append(reason)
                if not outputs:
                    return
        self.stages.append(self.make_stage(outputs, nodes, space))

    def find_problem(self, outputs, nodes, space):
        """The first thing that keeps this group from being one stage, or None."""
        made = [n for n in nodes if n.op in ir.GENERATED]
        if made and not (len(outputs) == 1 and outputs[0][0].op in ir.GENERATED):
            reason = "tt.tri is written by a kernel of its own (from its indices)"
            dest = next((d for n, d in outputs if n is made[0]), None)
            if dest is not None:
                return (dest, made[0], reason)
            return ("materialize", made[0], reason + "; the kernels that use it read it")
        flash = [n for n in nodes if n.op is Op.ATTENTION]
        if flash:
            return self.attention_problem(outputs, flash)
        products = [n for n in nodes if n.op is Op.MATMUL]
        if products:
            return self.gemm_problem(outputs, nodes, products)
        if any(n.op is Op.SWAPAXES for n in nodes):
            raise ValueError(
                "tt.swapaxes is a view of an argument of the fused function for a matmul "
                "operand (or the attention pattern); it cannot feed other ops"
            )
        reductions = [n for n in nodes if _is_reduce(n)]
        for r in reductions:
            if space[id(r.srcs[0])] != "F":
                return (
                    "materialize",
                    r.srcs[0],
                    f"{r.op.name.lower()} reduces a value that is itself reduced: "
                    "the inner reduction runs in an earlier kernel",
                )
        f_shape, axes = self.index_space(outputs, nodes, space)
        for r in reductions:
            r_axes = r.arg[0]
            if tuple(r.srcs[0].shape) != f_shape or tuple(r_axes) != axes:
                return (
                    "materialize",
                    r,
                    f"{r.op.name.lower()} over axes {list(r_axes)} of shape "
                    f"{tuple(r.srcs[0].shape)} differs from the main reduction (axes "
                    f"{list(axes)} of {f_shape}): it runs in an earlier kernel",
                )
        ndim = len(f_shape)
        keep_shape = ir.reduced_shape(f_shape, axes, True)
        full = _is_full(f_shape, axes)
        for n in nodes:
            if space[id(n)] != "F" or _is_reduce(n):
                continue
            if n.op is not Op.INPUT and not _fits(n.shape, f_shape):
                dest = next((d for o, d in outputs if o is n), None)
                if dest is not None:
                    return (dest, n, f"an output of shape {n.shape} gets a kernel of its own")
                return (
                    "materialize",
                    n,
                    f"a value of shape {n.shape} does not fit the kernel's index space "
                    f"{f_shape}: it runs in an earlier kernel",
                )
            for s in n.srcs:
                if space[id(s)] != "row":
                    continue
                if full:
                    return (
                        "materialize",
                        s,
                        "a full reduction is broadcast back over the array: that needs a "
                        "grid-wide barrier, so the reduction runs in an earlier kernel",
                    )
                padded = _padded(s.shape, ndim)
                if any(p != 1 and p != k for p, k in zip(padded, keep_shape, strict=True)):
                    return (
                        "materialize",
                        s,
                        f"a reduced value of shape {s.shape} broadcasts along other axes than "
                        "it was reduced over: it runs in an earlier kernel",
                    )
        kept = int(np.prod(keep_shape))
        for n, dest in outputs:
            sp = space[id(n)]
            assert sp != "const", "results of scalars alone are computed on the host"
            if sp == "F" and tuple(n.shape) != f_shape:
                return (dest, n, f"an output of shape {n.shape} gets a kernel of its own")
            if sp == "row" and int(np.prod(n.shape)) != kept:
                return (dest, n, f"an output of shape {n.shape} gets a kernel of its own")
        return None

    @staticmethod
    def attention_problem(outputs, flash):
        """What keeps a group with an attention node from being one flash-kernel stage (its
        operands in memory, the node itself the one result), or None."""
        for a in flash:
            for s in a.srcs:
                if s.op is not Op.INPUT:
                    return ("materialize", s, "an attention operand that is computed runs in "
                            "an earlier kernel")  # fmt: skip
        a = flash[0]
        if len(outputs) == 1 and outputs[0][0] is a:
            return None
        dest = next((d for n, d in outputs if n is a), None)
        if dest is not None:
            return (dest, a, "attention's result gets the flash kernel of its own")
        return ("materialize", a, "the flash kernel writes attention's result; what follows "
                "runs in a kernel of its own")  # fmt: skip

    @staticmethod
    def gemm_problem(outputs, nodes, products):
        """What keeps a group with a matmul from being one GEMM stage (one product, its
        operands in memory, results that are elementwise epilogues of the product, of its
        shape, in any dtype), or None."""
        for p in products:
            for s in p.srcs:
                if s.op is Op.SWAPAXES and s.srcs[0].op is not Op.INPUT:
                    s = s.srcs[0]  # the view is read in place: what it views must be in memory
                elif s.op is Op.INPUT or s.op is Op.SWAPAXES:
                    continue
                elif len(products) == 1 and prologue_leaf(s, nodes, outputs) is not None:
                    continue  # applied to the tiles as they land: the kernel reads the leaf
                if s.op is not Op.INPUT:
                    return (
                        "materialize",
                        s,
                        "a matmul operand that is computed runs in an "
                        "earlier kernel (the GEMM computes only an elementwise chain over one "
                        "array of the operand's dtype, as its tiles land)",
                    )
        p = products[-1]
        if len(products) > 1 and not _dual(products):
            return (
                "materialize",
                products[0],
                "one matmul per kernel, or two of one left operand and same-shaped right "
                "operands: an earlier GEMM writes the other product, the last one's epilogue "
                "reads it",
            )
        uses = {id(n) for n, _ in outputs if any(m is q for m in ir.walk([n]) for q in products)}
        for n, dest in outputs:
            if id(n) not in uses:
                return (dest, n, "a result that does not read the product gets a kernel of its own")
        if len(outputs) == 1 and outputs[0][0] is p:
            return None
        for r in (n for n in nodes if _is_reduce(n)):
            if any(m is q for m in ir.walk([r]) for q in products):
                return (
                    "materialize",
                    p,
                    "a reduction of a product: the GEMM writes the product, "
                    "the reduction runs in a kernel of its own",
                )
            return (
                "materialize",
                r,
                "a reduction in a GEMM's epilogue runs in an earlier kernel; the epilogue "
                "reads its result",
            )
        for result, _ in outputs:
            if tuple(result.shape) != tuple(p.shape):
                return (
                    "materialize",
                    p,
                    f"a result of shape {result.shape} from a product of "
                    f"shape {p.shape}: the epilogue runs in a kernel of its own",
                )
        if any(s.ndim < 2 for q in products for s in q.srcs):
            return (
                "materialize",
                p,
                "a 1-D matmul operand: the epilogue runs in a kernel of its own",
            )
        return None

    @staticmethod
    def index_space(outputs, nodes, space):
        """(F, R) of a group.

        F is the broadcast shape of the group's F-space results; R the axes of the first
        reduction over exactly F. A group of reduced results only takes F and R from the
        first reduction they need. Every other reduction is materialized by an earlier stage.
        """
        f_outs = [tuple(n.shape) for n, _ in outputs if space[id(n)] == "F"]
        if f_outs:
            try:
                f_shape = ir.broadcast_shapes(*f_outs)
            except ValueError:
                f_shape = f_outs[0]
            for n in nodes:
                if _is_reduce(n) and tuple(n.srcs[0].shape) == f_shape:
                    return f_shape, tuple(n.arg[0])
            return f_shape, ()
        for n in reversed(nodes):  # the reduction nearest the results
            if _is_reduce(n) and space[id(n.srcs[0])] == "F":
                return tuple(n.srcs[0].shape), tuple(n.arg[0])
        return (), ()

    def make_stage(self, outputs, nodes, space) -> Stage:
        if any(n.op is Op.ATTENTION for n in nodes):
            return Stage(StageKind.ATTENTION, (), outputs, space)
        if any(n.op is Op.MATMUL for n in nodes):
            return Stage(StageKind.GEMM, (), outputs, space)
        f_shape, axes = self.index_space(outputs, nodes, space)
        ndim = len(f_shape)
        effective = [a for a in range(ndim) if f_shape[a] != 1]
        if not axes:
            kind = StageKind.ELEMENTWISE
        elif _is_full(f_shape, axes):
            kind = StageKind.FULL
        elif not effective or effective[-1] in axes:
            kind = StageKind.ROW
        else:
            kind = StageKind.COLUMN
        return Stage(kind, axes, outputs, space)


def _reduction_class(node: Node):
    """(source shape, axes) of the reduction nearest ``node``, or None."""
    for n in reversed(ir.walk([node])):
        if _is_reduce(n):
            return (tuple(n.srcs[0].shape), tuple(n.arg[0]))
    return None


def group_outputs(outputs) -> list[list]:
    """Outputs grouped by the reductions they need, so that each group can be one stage.

    Outputs without reductions join a group whose index space has their shape.
    """
    groups: dict = {}
    for n, dest in outputs:
        cls = _reduction_class(n)
        groups.setdefault(cls or ("shape", tuple(n.shape)), []).append((n, dest))
    for key in [k for k in groups if k[0] == "shape"]:
        home = next((k for k in groups if k[0] != "shape" and k[0] == key[1]), None)
        if home is not None:
            groups[home] += groups.pop(key)
    return list(groups.values())


def plan(trace) -> Plan:
    """Stages for a trace, in launch order. Results that depend on no array get none: the
    call computes them on the host (``tile_ir.evaluate``), as NumPy gives them."""
    planner = _Planner()
    rewritten, planner.reasons = patterns.rewrite(trace.outputs)
    outputs = [(n, ("out", k)) for k, n in enumerate(rewritten) if not ir.on_host(n)]
    for i, group in enumerate(group_outputs(outputs)):
        if i:
            which = ", ".join(str(d[1]) for _, d in group)
            cls = _reduction_class(group[0][0])
            why = (
                f"reduce over axes {list(cls[1])} of shape {cls[0]}"
                if cls
                else f"have shape {tuple(group[0][0].shape)}"
            )
            planner.reasons.append(f"result(s) {which} {why}: a kernel of their own")
        planner.plan_group(group)
    # each temporary as the stage that writes it has it (a node materialized before its own
    # sources were has new sources there)
    temps = {d[1]: n for st in planner.stages for n, d in st.outputs if d[0] == "temp"}
    return Plan(planner.stages, dict(sorted(temps.items())), planner.reasons)


# --------------------------------------------------------------------------------------------
# shapes at call time


def propagate_shapes(nodes, input_shapes, shapes: dict[str, tuple] | None = None) -> dict:
    """Shapes, by node key, of ``nodes`` (sources first) for these input shapes.

    Runs at every call (no tracing, no code generation). ``input_shapes`` maps an INPUT's
    ``arg`` (a position, or ``("temp", k)``) to its shape. Raises NumPy's errors: shapes that
    do not broadcast, max of an empty axis.
    """
    shapes = {} if shapes is None else shapes
    for n in nodes:
        if n.key in shapes:
            continue
        if n.op is Op.INPUT:
            shapes[n.key] = tuple(input_shapes[n.arg])
        elif n.op in ir.LEAF:
            shapes[n.key] = ()
        elif _is_reduce(n):
            src = shapes[n.srcs[0].key]
            axes, keepdims, flat = n.arg
            if n.op in (Op.MAX, Op.MIN, Op.ARGMAX, Op.ARGMIN) and any(src[a] == 0 for a in axes):
                raise ValueError(
                    f"zero-size array to reduction operation {n.op.name.lower()} which has "
                    "no identity"
                )
            if flat:
                shapes[n.key] = (1,) * len(src) if keepdims else ()
            else:
                shapes[n.key] = ir.reduced_shape(src, axes, keepdims)
        else:
            srcs = [shapes[s.key] for s in n.srcs]
            shapes[n.key] = ir.operands_shape(n.op, n.srcs, srcs, n.arg)
    return shapes


def count_values(trace, shapes) -> dict[tuple, int]:
    """Values of the COUNT leaves (elements per mean), by their ``arg``."""
    out = {}
    for n in trace.nodes:
        if n.op is Op.COUNT:
            src, axes = trace.counts[id(n)]
            out[n.arg] = int(np.prod([shapes[src.key][a] for a in axes], dtype=np.int64))
    return out
