"""The split column template: a one-pass reduction over leading axes, its rows split across
blocks (see :func:`~.schedule.column_grid`), each thread loading 16 bytes of adjacent columns
per row, several rows ahead of its folds; per-block partials folded in split order by the last
block of each column tile (a ticket), so results are deterministic.

A mixin of :class:`~.reductions.ReductionWriter`: it renders a :class:`~.schedule.Schedule`
and decides nothing.
"""

from __future__ import annotations

from .lower import TYPE_NAMES, acc_dtype, combine, final_value, store_cast
from .schedule import COLUMN_UNROLL, column_block, pass_leaves


class SplitColumns:
    """``write_column_split`` and its helpers (the writer's ``src``, ``v``, ``sched``...)."""

    def write_column_split(self) -> None:
        """Rows split across blocks: block ``b`` reduces column tile ``b % tiles`` (``x``
        threads of ``vector`` adjacent columns) over row chunk ``b // tiles`` (``y`` threads
        interleaved over it). Each thread issues COLUMN_UNROLL independent 16-byte loads
        before folding any. With several splits the blocks write partials; the last block of
        each tile (a ticket) folds them in split order, so the result is deterministic."""
        s = self.src
        width, unroll = self.v.vector, COLUMN_UNROLL
        bx, by = column_block(width)
        kept = [f"dk{i}" for i in range(self.v.kept_rank)]
        red = [f"dr{i}" for i in range(self.v.red_rank)]
        s(f"nred = {' * '.join(red)}")
        s(f"nkept = {' * '.join(kept)}")
        self.declare_shared(f"({by}, {bx})")
        s("last = cuda.shared.array(1, int32)")
        s(f"ngroups = nkept // {width}")
        s("tx = cuda.threadIdx.x")
        s("ty = cuda.threadIdx.y")
        s(f"tiles = (ngroups + {bx - 1}) // {bx}")
        s("tile = cuda.blockIdx.x % tiles")
        s("split = cuda.blockIdx.x // tiles")
        s("splits = cuda.gridDim.x // tiles")
        s(f"g = tile * {bx} + tx")
        s("active = g < ngroups")
        s("if not active:")
        s("    g = ngroups - 1")
        s(f"col = g * {width}")
        for line in self.unravel("col", kept, "k"):
            s(line)
        s("chunk = (nred + splits - 1) // splits")
        s("start = split * chunk")
        s("stop = min(start + chunk, nred)")
        s("if not active:")
        s("    stop = start")
        (p,) = self.sched.passes
        accs = [[self.accumulator(r) for _ in range(width)] for r in p.reductions]
        # Software-pipelined: the loop loads the next `unroll` rows, then folds the rows the
        # previous iteration loaded, so their loads stay in flight across the back edge
        # whatever order ptxas picks (it keeps few registers live: two loads in flight on
        # sm_80 when a loop uses its own loads).
        step = unroll * by
        s("j = start + ty")
        s(f"if j + {step - by} < stop:")
        with s.block():
            held = self.load_rows(p, unroll, by, "j", "c")
            s(f"jn = j + {step}")
            s(f"while jn + {step - by} < stop:")
            with s.block():
                ahead = self.load_rows(p, unroll, by, "jn", "n")
                self.fold_rows(held, accs, by, "j")
                for cur, nxt in zip(held, ahead, strict=True):
                    for key in cur:
                        s(f"{', '.join(cur[key])} = {', '.join(nxt[key])}")
                s("j = jn")
                s(f"jn = j + {step}")
            self.fold_rows(held, accs, by, "j")
            s("j = jn")
        for _ in range(unroll - 1):  # the thread's last rows: ifs, not a loop LLVM unrolls
            s("if j < stop:")
            with s.block():
                self.fold_rows(self.load_rows(p, 1, by, "j", "r"), accs, by, "j")
                s(f"j += {by}")
        for lanes in accs:
            for r, a, ai in lanes:
                for line in self.column_combine(r, a, ai):
                    s(line)
        s("done = splits == 1")
        s("if not done:")
        with s.block():
            s("if active and ty == 0:")
            with s.block():
                for ri, lanes in enumerate(accs):
                    for lane, (_, a, ai) in enumerate(lanes):
                        s(f"part{ri}[split * nkept + col + {lane}] = {a}")
                        if ai:
                            s(f"parti{ri}[split * nkept + col + {lane}] = {ai}")
            s("cuda.threadfence()")  # the partials are visible before the ticket moves
            s("cuda.syncthreads()")
            s("if tx == 0 and ty == 0:")
            s("    last[0] = cuda.atomic.add(ticket, tile, 1)")
            s("cuda.syncthreads()")
            s("done = last[0] == splits - 1")
            s("if done and active and ty == 0:")
            with s.block():
                for ri, lanes in enumerate(accs):
                    t = TYPE_NAMES[acc_dtype(p.reductions[ri])]
                    for lane, (r, a, ai) in enumerate(lanes):
                        at = f"col + {lane}"
                        s(f"{a} = {t}(part{ri}[{at}])")
                        if ai:
                            s(f"{ai} = parti{ri}[{at}]")
                        s("b = 1")
                        s("while b < splits:")
                        s(f"    {a}_b = {t}(part{ri}[b * nkept + {at}])")
                        if ai:
                            s(f"    {a}_bi = parti{ri}[b * nkept + {at}]")
                        for line in combine(r, a, f"{a}_b", ai, f"{a}_bi" if ai else ""):
                            s("    " + line)
                        s("    b += 1")
        row_outs = [(i, n) for i, (n, _) in enumerate(self.outputs) if self.space[id(n)] == "row"]
        s("if done and active and ty == 0:")
        with s.block():
            for lane in range(width):
                env: dict = {}
                for lanes in accs:
                    r, a, ai = lanes[lane]
                    env[r.key] = self.fresh("r")
                    s(f"{env[r.key]} = {final_value(r, a, ai)}")
                self.emit_row_values(env)
                at = ", ".join(
                    [
                        *[f"k{i}" for i in range(self.v.kept_rank - 1)],
                        f"k{self.v.kept_rank - 1} + {lane}",
                    ]
                )
                for i, n in row_outs:
                    val = self.value(n, env, self.loader(set()))
                    s(f"out{i}[{at}] = {store_cast(n, val)}")

    def load_rows(self, p, rows: int, step: int, base: str, prefix: str) -> list[dict]:
        """Load rows ``base``, ``base + step``, ...: per row, leaf key -> its loaded parts (the
        ``vector`` adjacent columns), named ``prefix``, row, leaf, lane."""
        s = self.src
        width = self.v.vector
        red = [f"dr{i}" for i in range(self.v.red_rank)]
        kept = [f"k{i}" for i in range(self.v.kept_rank)]
        loaded = []
        for u in range(rows):
            row = f"{base} + {u * step}" if u else base
            for line in self.unravel(row, red, f"{prefix}{u}_"):
                s(line)
            at = ", ".join([f"{prefix}{u}_{i}" for i in range(self.v.red_rank)] + kept)
            parts = {}
            for key in sorted(pass_leaves(p.targets)):
                name = self.names[key]
                parts[key] = [f"{prefix}{u}_{name}_{lane}" for lane in range(width)]
                load = f"load16({name}, ({at},))" if width > 1 else f"{name}[{at}]"
                s(f"{', '.join(parts[key])} = {load}")
            loaded.append(parts)
        return loaded

    def fold_rows(self, loaded: list[dict], accs, step: int, base: str) -> None:
        """Fold loaded rows into each column's accumulators, row by row (ties resolve as in
        one loop over the rows)."""
        no_load = self.loader(set())
        for u, parts in enumerate(loaded):
            for lane in range(self.v.vector):
                env = {}
                for key, names in parts.items():
                    leaf = next(n for n in self.leaves if n.key == key)
                    (env[key],) = self.widened(leaf, [names[lane]])
                for lanes in accs:
                    r, a, ai = lanes[lane]
                    index = f"({base} + {u * step})"
                    for line in self.fold_element(r, a, ai, env, no_load, index):
                        self.src(line)
