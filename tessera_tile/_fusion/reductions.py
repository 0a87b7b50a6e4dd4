"""Templates of the reducing stages: rows (a warp or a block per row; the row in a warp's
registers, in shared memory, or read once per pass), columns and full reductions.

:class:`ReductionWriter` extends the elementwise :class:`~.templates.KernelWriter` with the
passes over each row and the warp, block and grid combines; like it, it renders a
:class:`~.schedule.Schedule` and decides nothing.
"""

from __future__ import annotations

import numpy as np

from .. import tile_ir as ir
from .. import warp
from ..tile_ir import Node, Op
from .columns import SplitColumns
from .lower import (
    REDUCTIONS,
    TYPE_NAMES,
    acc_dtype,
    cast,
    combine,
    element_value,
    final_value,
    fold_partials,
    identity,
    load_cast,
    online_element,
    reciprocal,
    second_accumulator,
    store_cast,
    vector_element,
)
from .passes import Online, pass_leaves
from .schedule import COLUMN_BLOCK, WARP
from .templates import KernelWriter


class ReductionWriter(SplitColumns, KernelWriter):
    """Writes the kernel of a row, column or full stage."""

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
        for key in sorted(first):  # cached as stored (bfloat16 as its bits), then widened
            leaf = next(n for n in self.leaves if n.key == key)
            raw = self.fresh("e")
            s(f"{raw} = {load(leaf)}")
            s(f"cache_{self.names[key]}[{self.cache_index}] = {raw}")
            env[key] = self.fresh("v")
            s(f"{env[key]} = {load_cast(leaf.dtype, raw)}")
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
            elif key in self.sched.broadcast:
                red_at = f"({self.index(False, True)},)"
                s(f"{', '.join(parts)} = load16_shared(bcast_{name}, {red_at})")
            elif key in self.sched.invariant:  # a 1-D row
                s(f"{', '.join(parts)} = load16({name}, ({self.index(False, True)},))")
            else:
                s(f"{', '.join(parts)} = load16({name}, {at})")
            if key in first:  # whatever it was read from (a 1-D row too)
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
            vals = [vector_element(n, self.value(n, lanes[lane], no_load)) for lane in range(width)]
            s(f"store16(out{i}, {at}, ({', '.join(vals)}))")

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
        self.stage_broadcast()  # before any thread may leave: every thread takes part
        s(f"row = {ix('cuda.blockIdx.x * groups + group')}")
        if self.v.chunks and not self.v.reuses_invariants:
            # one row per warp (or block), no loop over rows: the shuffles then sit in straight
            # code, and ptxas emits no divergent fallback copy of the row's code
            s("if row >= nkept:")
            s("    return")
            for line in self.unravel("row", kept, "k"):
                s(line)
            self.write_register_row(self.register_row_columns())
            return
        if self.v.chunks:  # rows in turn, each thread's columns and weights loaded once
            held = self.register_row_columns()
            s("while row < nkept:")
            with s.block():
                for line in self.unravel("row", kept, "k"):
                    s(line)
                self.write_register_row(held)
                s(f"row = {ix('row + cuda.gridDim.x * groups')}")
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

    def register_row_columns(self) -> list[dict]:
        """Each thread's columns of a register row (``jc``, and ``ok`` below the bucket's
        length), the same for every row, and its elements of the held row-invariant leaves:
        one dict per element, leaf key -> the variable holding it."""
        s = self.src
        width, chunks = self.v.vector, self.v.chunks
        lanes = WARP if self.v.mode == "warp" else self.v.threads
        for c in range(chunks):
            s(f"jc{c} = {self.ix(f'({c * lanes} + lane) * {width}')}")
            if not self.v.exact:
                s(f"ok{c} = jc{c} < nred")
        held = [dict() for _ in range(chunks * width)]
        for leaf in self.leaves:
            if leaf.key in self.sched.held:
                for c in range(chunks):
                    chunk = held[c * width : (c + 1) * width]
                    for env, part in zip(chunk, self.load_chunk(leaf, c, f"jc{c}"), strict=True):
                        env[leaf.key] = part
        return held

    def load_chunk(self, leaf: Node, c: int, at: str) -> list[str]:
        """Load access ``c`` (``vector`` elements at ``at``) of ``leaf``: zeros past the row
        below the bucket's length; the elements in their compute dtype."""
        s = self.src
        width = self.v.vector
        name = self.names[leaf.key]
        parts = [self.fresh(f"{name}_") for _ in range(width)]
        where = f"jc{c}" if leaf.key in self.sched.invariant else at  # a 1-D row
        load = f"load16({name}, ({where},))" if width > 1 else f"{name}[{where}]"
        if leaf.key in self.sched.broadcast:  # the block's shared copy
            shared = f"bcast_{name}"
            load = f"load16_shared({shared}, (jc{c},))" if width > 1 else f"{shared}[jc{c}]"
        if self.v.exact:
            s(f"{', '.join(parts)} = {load}")
        else:
            zero = f"{TYPE_NAMES[np.dtype(leaf.dtype)]}(0)"
            s(f"if ok{c}:")
            s(f"    {', '.join(parts)} = {load}")
            s("else:")
            s(f"    {', '.join(parts)} = {', '.join([zero] * width)}")
        return self.widened(leaf, parts)

    def write_register_row(self, held: list[dict]) -> None:
        """A row in the registers of the warp (or block) that owns it: each thread loads its
        ``chunks`` accesses of ``vector`` elements once, every pass is unrolled over them, and
        a value two passes need (softmax's ``exp``) is computed once. Below the bucket's length,
        an access past the row loads nothing (its elements are zeros) and is left out of folds
        and stores. ``held``: the thread's elements of the held leaves, loaded before."""
        s = self.src
        width, chunks, exact = self.v.vector, self.v.chunks, self.v.exact
        kept = [f"k{i}" for i in range(self.v.kept_rank)]
        envs = [dict(env) for env in held]
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
                for key in sorted(pass_leaves(p.targets) - loaded - self.sched.held):
                    leaf = next(n for n in self.leaves if n.key == key)
                    for env, part in zip(chunk, self.load_chunk(leaf, c, at), strict=True):
                        env[key] = part
                guarded: list[str] = []
                for lane, env in enumerate(chunk):
                    for r, a, ai in accs:
                        guarded += self.fold_element(r, a, ai, env, no_load, f"(jc{c} + {lane})")
                for i, n in p.outputs:
                    vals = [vector_element(n, self.value(n, env, no_load)) for env in chunk]
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
                lines = self.warp_allreduce(r, a, ai)
                if self.v.mode == "block":
                    lines += self.block_combine(r, a, ai)
                for line in lines:
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
        if self.v.mode == "split":
            self.write_column_split()
            return
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
                    self.fold_partials(r, a, ai, ri, "cuda.gridDim.x", str)
                    row_env[r.key] = self.fresh("r")
                    s(f"{row_env[r.key]} = {final_value(r, a, ai)}")
                for i, n in row_outs:
                    val = self.value(n, row_env, self.loader(set()))
                    s(f"out{i}[{self.index(True, False)}] = {store_cast(n, val)}")
                s("ticket[0] = 0")
