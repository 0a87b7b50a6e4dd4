"""Templates: the Python source of one ``@cuda.jit`` kernel per scheduled stage.

A stage becomes one of four templates (elementwise here; row, column and full in
:mod:`.reductions`), written top to bottom by one writer from a :class:`~.schedule.Schedule`,
which has made every decision beforehand; expressions and reductions come from the tables of
:mod:`.lower`. Loops are ``while`` loops: a ``range`` with a run-time step makes Numba divide in
64 bits to get the trip count.
"""

from __future__ import annotations

import numpy as np

from .. import tile_ir as ir
from ..tile_ir import Node, Op
from .lower import (
    TYPE_NAMES,
    cast,
    compute_dtype,
    emit_approx,
    emit_elementwise,
    literal,
    load_cast,
    store_cast,
    vector_element,
)
from .plan import StageKind
from .schedule import BLOCK, Schedule, parameters


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
    """Writes the kernel of one :class:`~.schedule.Schedule`, top to bottom."""

    def __init__(self, sched: Schedule, name: str):
        stage = sched.stage
        self.sched = sched
        self.stage = stage
        self.v = sched.variant
        self.name = name
        self.src = _Source()
        self.nodes = stage.nodes
        self.space = stage.space
        self.leaves = stage.leaves
        self.scalars = stage.scalars
        self.names: dict[str, str] = {n.key: f"in{i}" for i, n in enumerate(self.leaves)}
        self.names.update({n.key: f"s{i}" for i, n in enumerate(self.scalars)})
        consts = {n.key: n for n in self.nodes if n.op is Op.CONST}
        self.consts = {key: f"C{i}" for i, key in enumerate(consts)}
        self.const_values = {self.consts[key]: n.arg for key, n in consts.items()}
        self.outputs = stage.outputs
        self.reductions = stage.reductions
        self.helpers: dict = {}  # name -> device function the source calls
        self.counter = 0
        self.cache_index = "group, j" if self.v.mode == "warp" else "j"
        # Elementwise and row kernels index with unsigned integers: no wraparound code for
        # negative indices. Elementwise loop counters are 64-bit (Numba marks no add as
        # non-wrapping, so a 32-bit counter stops LLVM from turning it into a pointer
        # increment: measured worse); row loops, which LLVM does not turn into pointer
        # increments either way, use the variant's width (measured on layer norm's three row
        # loops: 73 -> 63 instructions per 4 elements). Coordinates split off a linear index use the
        # variant's width, so the divisions and remainders of strided views are 32-bit.
        indexed = self.v.kind in (StageKind.ELEMENTWISE, StageKind.ROW)
        narrow_rows = self.v.kind is StageKind.ROW and self.v.index_bits == 32
        self.index_type = ("uint32" if narrow_rows else "uint64") if indexed else ""
        self.coord_type = f"uint{self.v.index_bits}" if indexed else ""
        self.red_dims = [f"dr{i}" for i in range(self.v.red_rank)]

    def ix(self, expr: str) -> str:
        """``expr`` as a loop index of this kernel."""
        return f"{self.index_type}({expr})" if self.index_type else expr

    def coord(self, expr: str) -> str:
        """``expr`` as a coordinate split off a linear index."""
        return f"{self.coord_type}({expr})" if self.coord_type else expr

    def dims(self, prefix: str, rank: int) -> list[str]:
        """The names of the index space's extents, declared as coordinates where they are."""
        names = [f"{prefix}{i}" for i in range(rank)]
        if not self.coord_type:
            return names
        for name in names:
            self.src(f"u{name} = {self.coord(name)}")
        return [f"u{name}" for name in names]

    # naming -------------------------------------------------------------------------------
    def fresh(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"

    def out_name(self, i: int) -> str:
        return f"out{i}"

    # params -------------------------------------------------------------------------------
    def params(self) -> list[str]:
        return [p.name for p in parameters(self.sched.stage, self.v)]

    # values -------------------------------------------------------------------------------
    def const_expr(self, n: Node) -> str:
        name = self.consts[n.key]
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
        if n.op is Op.TRI:  # alone in an elementwise stage (the planner's rule): i is its
            rows, cols, k = n.arg  # C-order index, row i // cols, column i % cols
            expr = cast(f"(int64(i) % {cols} <= int64(i) // {cols} + {k})", np.bool_, n.dtype)
            env[n.key] = expr
            return expr
        if n.op is Op.INPUT:
            var = self.fresh("v")
            self.src(f"{var} = {load_cast(n.dtype, load(n))}")
            env[n.key] = var
            return var
        if n.op in ir.REDUCE:
            raise AssertionError("reduction results are set when their pass ends")
        args = [self.value(s, env, load) for s in n.srcs]
        var = self.fresh("t")
        rcp = env.get("rcp:" + n.key)
        if rcp is not None:  # divide by a per-row value: multiply by its reciprocal
            self.src(f"{var} = {cast(args[0], n.srcs[0].dtype, n.dtype)} * {rcp}")
        elif n.key in self.sched.approx:
            self.src(f"{var} = {emit_approx(n, args)}")
        else:
            self.src(f"{var} = {emit_elementwise(n, args)}")
        env[n.key] = var
        return var

    # templates ----------------------------------------------------------------------------
    def write(self) -> str:
        s = self.src
        chain = ", ".join(n.op.name.lower() for n in self.nodes if n.op not in ir.LEAF)
        s(f"# tessera_tile fused kernel: {chain}")
        s(f"# stage: {self.v.kind}, variant: {self.v}")
        for name, value in self.const_values.items():
            s(f"{name} = {literal(value)}")
        s("")
        s("")
        # past 256 threads a block could ask for more registers than an SM has: ptxas is
        # told the block's size, so it keeps to 65,536 / threads registers a thread
        s(f"@cuda.jit(launch_bounds={self.v.threads})" if self.v.threads > BLOCK else "@cuda.jit")
        s(f"def {self.name}({', '.join(self.params())}):")
        with s.block():
            getattr(self, f"write_{self.v.kind}")()
        return s.text()

    def declare_shared(self, scratch_shape: str) -> None:
        """The shared scratch of block-wide combines and the on-chip row caches."""
        for name, t in self.sched.scratch.items():
            self.src(f"{name} = cuda.shared.array({scratch_shape}, {t})")
        length = self.sched.cache_length  # (register rows declare no cache)
        shape = f"({self.sched.rows_per_block}, {length})" if self.v.mode == "warp" else length
        for n in self.leaves:
            if n.key in self.sched.cached:
                t = TYPE_NAMES[np.dtype(n.dtype)]
                self.src(
                    f"cache_{self.names[n.key]} = cuda.shared.array({shape}, {t}, alignment=16)"
                )
        for n in self.leaves:
            if n.key in self.sched.broadcast:
                t = TYPE_NAMES[np.dtype(n.dtype)]
                length = self.v.broadcast_length
                self.src(
                    f"bcast_{self.names[n.key]} = cuda.shared.array({length}, {t}, alignment=16)"
                )

    def stage_broadcast(self) -> None:
        """Every thread of the block copies its share of each row-invariant leaf into the
        block's shared array, once, before any row; then the block waits for the copy."""
        if not self.sched.broadcast:
            return
        s = self.src
        s(f"jb = {self.ix('cuda.threadIdx.x')}")
        s("while jb < nred:")
        with s.block():
            for n in self.leaves:
                if n.key in self.sched.broadcast:
                    name = self.names[n.key]
                    s(f"bcast_{name}[jb] = {name}[jb]")
            s(f"jb = {self.ix('jb + cuda.blockDim.x')}")
        s("cuda.syncthreads()")

    # index helpers
    def unravel(self, linear: str, dims: list[str], prefix: str) -> list[str]:
        """Statements splitting ``linear`` into coordinates over ``dims`` (C order)."""
        if len(dims) == 1:
            return [f"{prefix}0 = {linear}"]
        out = [f"{prefix}rem = {self.coord(linear)}"]
        for i in range(len(dims) - 1, 0, -1):
            out.append(f"{prefix}{i} = {self.coord(f'{prefix}rem % {dims[i]}')}")
            out.append(f"{prefix}rem = {self.coord(f'{prefix}rem // {dims[i]}')}")
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
            if n.key in self.sched.broadcast:
                return f"bcast_{name}[{self.index(False, True)}]"
            if n.key in self.sched.invariant:
                return f"{name}[{self.index(False, True)}]"
            return f"{name}[{self.index(True, True)}]"

        return load

    def write_elementwise(self) -> None:
        s = self.src
        dims = self.dims("dk", self.v.kept_rank)
        s(f"n = {self.ix(' * '.join(dims))}")
        s(f"step = {self.ix('cuda.gridsize(1)')}")
        s(f"i = {self.ix('cuda.grid(1)')}")
        if self.v.vector > 1:
            width = self.v.vector
            s(f"nv = {self.ix(f'n // {width}')}")
            self.write_vector_loop(width)
            # fewer than `vector` elements remain and a grid has more threads than that: an
            # `if`, not a loop (a loop makes LLVM unroll it behind a 64-bit trip-count division)
            s(f"i = {self.ix(f'nv * {width} + cuda.grid(1)')}")
            s("if i < n:")
            with s.block():
                self.write_scalar_element(dims)
            return
        s("while i < n:")
        with s.block():
            self.write_scalar_element(dims)
            s(f"i = {self.ix('i + step')}")

    def write_scalar_element(self, dims: list[str]) -> None:
        """Element ``i`` of an elementwise stage: unravel, compute, store."""
        s = self.src
        for line in self.unravel("i", dims, "k"):
            s(line)
        env: dict = {}
        load = self.loader(set())
        for i, (n, _) in enumerate(self.outputs):
            val = self.value(n, env, load)
            s(f"{self.out_name(i)}[{self.index(True, False)}] = {store_cast(n, val)}")

    def write_vector_loop(self, width: int) -> None:
        """Whole 16-byte vectors: one LDG.E.128 per input and one STG.E.128 per output."""
        s = self.src
        s("while i < nv:")
        with s.block():
            s(f"b = {self.ix(f'i * {width}')}")
            lanes = [dict() for _ in range(width)]
            for leaf in self.leaves:
                name = self.names[leaf.key]
                parts = [f"{name}_{lane}" for lane in range(width)]
                s(f"{', '.join(parts)} = load16({name}, b)")
                for lane, part in enumerate(self.widened(leaf, parts)):
                    lanes[lane][leaf.key] = part
            load = self.loader(set())
            for i, (n, _) in enumerate(self.outputs):
                vals = [vector_element(n, self.value(n, env, load)) for env in lanes]
                s(f"store16({self.out_name(i)}, b, ({', '.join(vals)}))")
            s(f"i = {self.ix('i + step')}")

    # passes shared by row / column / full ----------------------------------------------------

    def widened(self, leaf: Node, parts: list[str]) -> list[str]:
        """Loaded elements in their compute dtype (float16 is computed in float32)."""
        if compute_dtype(leaf.dtype) == np.dtype(leaf.dtype):
            return parts
        for part in parts:
            self.src(f"{part}w = {load_cast(leaf.dtype, part)}")
        return [f"{part}w" for part in parts]
