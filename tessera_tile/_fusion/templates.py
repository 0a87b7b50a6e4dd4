"""Templates: the Python source of one ``@cuda.jit`` kernel per scheduled stage.

A stage becomes one of four templates (elementwise, row, column, full), written top to bottom by
one :class:`KernelWriter` from a :class:`~.schedule.Schedule`, which has made every decision
beforehand; expressions and reductions come from the tables of :mod:`.lower`. Loops are
``while`` loops: a ``range`` with a run-time step makes Numba divide in 64 bits to get the trip
count.
"""

from __future__ import annotations

import numpy as np

from .. import tile_ir as ir
from .. import warp
from ..tile_ir import Node, Op
from .lower import (
    REDUCTIONS,
    TYPE_NAMES,
    acc_dtype,
    cast,
    combine,
    compute_dtype,
    element_value,
    emit_approx,
    emit_elementwise,
    final_value,
    fold_partials,
    identity,
    online_element,
    reciprocal,
    second_accumulator,
    store_cast,
)
from .schedule import COLUMN_BLOCK, WARP, Online, Schedule, pass_leaves


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
        # negative indices. Loop counters are 64-bit (Numba marks no add as non-wrapping, so a
        # 32-bit counter would stop LLVM from turning it into a pointer increment: measured
        # worse); coordinates split off a linear index use the variant's width, so the
        # divisions and remainders of strided views are 32-bit where sizes allow.
        indexed = self.v.kind in ("elementwise", "row")
        self.index_type = "uint64" if indexed else ""
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
            s(f"{name} = {value!r}")
        s("")
        s("")
        s("@cuda.jit")
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
                self.src(f"cache_{self.names[n.key]} = cuda.shared.array({shape}, {t})")

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
                vals = [self.value(n, lanes[lane], load) for lane in range(width)]
                t = TYPE_NAMES[np.dtype(n.dtype)]
                s(f"store16({self.out_name(i)}, b, ({', '.join(f'{t}({v})' for v in vals)}))")
            s(f"i = {self.ix('i + step')}")

    # passes shared by row / column / full ----------------------------------------------------
    def write_reduce_body(self, group_reduce, group_lead, red_index_setup):
        """Row and column templates: passes over the reduced index of one kept index."""
        s = self.src
        cache = self.sched.cached
        seen: set = set()
        row_env: dict = {}
        for p in self.sched.passes:
            targets, outs = p.targets, p.outputs
            accs = [self.accumulator(r) for r in p.reductions]
            first = {k for k in pass_leaves(targets) if k in cache and k not in seen}
            reads = {k for k in pass_leaves(targets) if k in cache and k in seen}
            seen |= pass_leaves(targets)
            for line in red_index_setup():
                s(line)
            width = self.v.vector
            if width > 1:
                s(f"j = {self.ix(f'j * {width}')}")
            s("while j < nred:")
            with s.block():
                for line in self.unravel("j", self.red_dims, "j"):
                    s(line)
                if width > 1:
                    self.write_vector_elements(targets, accs, outs, row_env, first, reads)
                else:
                    self.write_elements(accs, outs, row_env, first, reads)
                s(f"j = {self.ix(f'j + jstep * {width}' if width > 1 else 'j + jstep')}")
            for r, a, ai in accs:
                for line in group_reduce(r, a, ai):
                    s(line)
                row_env[r.key] = self.fresh("r")
                peak = row_env[r.peak.key] if isinstance(r, Online) else ""
                s(f"{row_env[r.key]} = {final_value(r, a, ai, peak)}")
            # row-space values that are now computable
            self.emit_row_values(row_env)
        lead = group_lead()
        row_outs = [(i, n) for i, (n, _) in enumerate(self.outputs) if self.space[id(n)] == "row"]
        if row_outs:
            s(f"if {lead}:")
            with s.block():
                for i, n in row_outs:
                    val = self.value(n, row_env, self.loader(set()))
                    s(f"out{i}[{self.index(True, False)}] = {store_cast(n, val)}")

    def accumulator(self, r) -> tuple:
        """Declare the accumulator(s) of reduction ``r``: (r, name, second name or "")."""
        a = self.fresh("acc")
        self.src(f"{a} = {identity(r)}")
        second = second_accumulator(r)
        ai = ""
        if second is not None:
            ai = a + ("s" if isinstance(r, Online) else "i")
            self.src(f"{ai} = {second}")
        return r, a, ai

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
            s(f"out{i}[{self.index(True, True)}] = {store_cast(n, val)}")

    def fold_element(self, r, a: str, ai: str, env: dict, load, index: str) -> list[str]:
        """Statements folding this element of ``r``'s source into its accumulator."""
        if isinstance(r, Online):
            f = r.peak.srcs[0]
            v = cast(self.value(f, env, load), f.dtype, r.dtype)
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
            # the row cache is read and written 16 bytes at a time too (LDS.128 / STS.128:
            # no bank conflicts, a quarter of the instructions)
            cache_at = f"({self.cache_index},)"
            if key in reads:
                s(f"{', '.join(parts)} = load16_shared(cache_{name}, {cache_at})")
            else:
                s(f"{', '.join(parts)} = load16({name}, {at})")
                if key in first:
                    s(f"store16_shared(cache_{name}, {cache_at}, ({', '.join(parts)},))")
            leaf = next(n for n in self.leaves if n.key == key)
            for lane, part in enumerate(self.widened(leaf, parts)):
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

    def widened(self, leaf: Node, parts: list[str]) -> list[str]:
        """Loaded elements in their compute dtype (float16 is computed in float32)."""
        if compute_dtype(leaf.dtype) == np.dtype(leaf.dtype):
            return parts
        t = TYPE_NAMES[compute_dtype(leaf.dtype)]
        for part in parts:
            self.src(f"{part}w = {t}({part})")
        return [f"{part}w" for part in parts]

    def cache_at(self, lane: int) -> str:
        return self.cache_index.replace("j", f"j + {lane}")

    def emit_row_values(self, env: dict) -> None:
        """Compute, once per row, every row-space value whose operands are now known, and the
        reciprocal of every per-row divisor the schedule chose."""
        for n in self.nodes:
            if n.key in env or self.space[id(n)] != "row" or n.op in ir.REDUCE:
                continue
            if all(s.key in env or self.space[id(s)] == "const" for s in n.srcs):
                self.value(n, env, self.loader(set()))
        for key, divisor in self.sched.reciprocals.items():
            if "rcp:" + key in env or divisor.key not in env:
                continue
            dtype = next(n.dtype for n in self.nodes if n.key == key)
            var = self.fresh("rcp")
            value = cast(env[divisor.key], divisor.dtype, dtype)
            self.src(f"{var} = {reciprocal(value, dtype, self.sched.approx_reciprocal)}")
            env["rcp:" + key] = var

    # row template ---------------------------------------------------------------------------
    def write_row(self) -> None:
        s = self.src
        warp = self.v.mode == "warp"
        ix = self.ix
        kept = self.dims("dk", self.v.kept_rank)
        self.red_dims = self.dims("dr", self.v.red_rank)
        s(f"nred = {ix(' * '.join(self.red_dims))}")
        s(f"nkept = {ix(' * '.join(kept))}")
        if warp:
            s(f"lane = {ix('cuda.threadIdx.x & 31')}")
            s(f"group = {ix('cuda.threadIdx.x >> 5')}")
            s(f"groups = {ix('cuda.blockDim.x >> 5')}")
            s(f"jstep = {ix('32')}")
        else:
            s(f"lane = {ix('cuda.threadIdx.x')}")
            s(f"group = {ix('0')}")
            s(f"groups = {ix('1')}")
            s(f"jstep = {ix('cuda.blockDim.x')}")
        self.declare_shared(str(WARP))
        s(f"row = {ix('cuda.blockIdx.x * groups + group')}")
        if self.v.chunks:
            # one row per warp, no loop over rows: the warp's shuffles then sit in straight
            # code, and ptxas emits no divergent fallback copy of the row's code
            s("if row >= nkept:")
            s("    return")
            for line in self.unravel("row", kept, "k"):
                s(line)
            self.write_register_row()
            return
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
            s(f"row = {ix('row + cuda.gridDim.x * groups')}")

    def write_register_row(self) -> None:
        """A warp's row in registers: each lane loads its ``chunks`` accesses of ``vector``
        elements once, every pass is unrolled over them, and a value two passes need (softmax's
        ``exp``) is computed once. Below the bucket's length, an access past the row loads
        nothing (its elements are zeros) and is left out of folds and stores."""
        s = self.src
        width, chunks, exact = self.v.vector, self.v.chunks, self.v.exact
        kept = [f"k{i}" for i in range(self.v.kept_rank)]
        for c in range(chunks):
            s(f"jc{c} = {self.ix(f'({c * WARP} + lane) * {width}')}")
            if not exact:
                s(f"ok{c} = jc{c} < nred")
        envs = [dict() for _ in range(chunks * width)]
        loaded: set = set()
        row_env: dict = {}
        no_load = self.loader(set())
        for p in self.sched.passes:
            accs = [self.accumulator(r) for r in p.reductions]
            for c in range(chunks):
                chunk = envs[c * width : (c + 1) * width]
                for env in chunk:
                    env.update(row_env)
                at = ", ".join([*kept, f"jc{c}"])
                for key in sorted(pass_leaves(p.targets) - loaded):
                    leaf = next(n for n in self.leaves if n.key == key)
                    name = self.names[key]
                    parts = [self.fresh(f"{name}_") for _ in range(width)]
                    load = f"load16({name}, ({at},))" if width > 1 else f"{name}[{at}]"
                    if exact:
                        s(f"{', '.join(parts)} = {load}")
                    else:
                        zero = f"{TYPE_NAMES[np.dtype(leaf.dtype)]}(0)"
                        s(f"if ok{c}:")
                        s(f"    {', '.join(parts)} = {load}")
                        s("else:")
                        s(f"    {', '.join(parts)} = {', '.join([zero] * width)}")
                    for env, part in zip(chunk, self.widened(leaf, parts), strict=True):
                        env[key] = part
                guarded: list[str] = []
                for lane, env in enumerate(chunk):
                    for r, a, ai in accs:
                        guarded += self.fold_element(r, a, ai, env, no_load, f"(jc{c} + {lane})")
                for i, n in p.outputs:
                    t = TYPE_NAMES[np.dtype(n.dtype)]
                    vals = [f"{t}({self.value(n, env, no_load)})" for env in chunk]
                    if width > 1:
                        guarded.append(f"store16(out{i}, ({at},), ({', '.join(vals)}))")
                    else:
                        guarded.append(f"out{i}[{at}] = {vals[0]}")
                if not exact and guarded:
                    s(f"if ok{c}:")
                    guarded = ["    " + line for line in guarded]
                for line in guarded:
                    s(line)
            loaded |= pass_leaves(p.targets)
            for r, a, ai in accs:
                for line in self.warp_allreduce(r, a, ai):
                    s(line)
                row_env[r.key] = self.fresh("r")
                s(f"{row_env[r.key]} = {final_value(r, a, ai)}")
            self.emit_row_values(row_env)
        row_outs = [(i, n) for i, (n, _) in enumerate(self.outputs) if self.space[id(n)] == "row"]
        if row_outs:
            s("if lane == 0:")
            with s.block():
                for i, n in row_outs:
                    val = self.value(n, row_env, no_load)
                    s(f"out{i}[{self.index(True, False)}] = {store_cast(n, val)}")

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
        self.helpers[name] = warp.make_warp_allreduce(REDUCTIONS[r.op].warp, dtype)
        return [f"{a} = {name}({a}, {mask})"]

    def block_combine(self, r: Node, a: str, ai: str) -> list[str]:
        """Lane 0 of each warp publishes the warp's result; every warp then all-reduces the
        partials with shuffles (one shared load and 5 shuffles per thread, where folding the
        partials one by one costs a load and a combine per warp), in a fixed order, so the
        result is deterministic. Reductions without a warp operator fold in order."""
        if not isinstance(r, Online) and REDUCTIONS[r.op].warp is not None:
            t = TYPE_NAMES[acc_dtype(r)]
            name = f"warp_all{r.op.name.lower()}_{t}"
            self.helpers[name] = warp.make_warp_allreduce(REDUCTIONS[r.op].warp, acc_dtype(r))
            return [
                "if (cuda.threadIdx.x & 31) == 0:",
                f"    scratch_{t}[cuda.threadIdx.x >> 5] = {a}",
                "cuda.syncthreads()",
                f"{a} = {identity(r)}",
                "if (cuda.threadIdx.x & 31) < (cuda.blockDim.x + 31) >> 5:",
                f"    {a} = {t}(scratch_{t}[cuda.threadIdx.x & 31])",
                f"{a} = {name}({a}, 0xFFFFFFFF)",
                "cuda.syncthreads()",
            ]
        return fold_partials(
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
        self.declare_shared(f"({COLUMN_BLOCK[1]}, {COLUMN_BLOCK[0]})")
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

    def column_combine(self, r: Node, a: str, ai: str) -> list[str]:
        """Every y thread of a column publishes; the column's partials fold in y order."""
        return fold_partials(
            r, a, ai, "True", lambda w: "ty, tx" if w is None else f"{w}, tx", "cuda.blockDim.y"
        )

    # full template --------------------------------------------------------------------------
    def write_full(self) -> None:
        s = self.src
        red = [f"dr{i}" for i in range(self.v.red_rank)]
        s(f"nred = {' * '.join(red)}")
        self.declare_shared(str(WARP))
        for i in range(self.v.kept_rank):
            s(f"k{i} = 0")
        first = self.sched.passes[0] if self.sched.passes else None
        outs = first.outputs if first else []
        accs = [self.accumulator(r) for r in (first.reductions if first else [])]
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
                s(f"out{i}[{self.index(True, True)}] = {store_cast(n, val)}")
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
                    s(f"out{i}[{self.index(True, False)}] = {store_cast(n, val)}")
                s("ticket[0] = 0")
