"""The split column template: a one-pass reduction over leading axes, its rows split across
blocks (see :func:`~.schedule.column_grid`), each thread loading 16 bytes of adjacent columns
per row, several rows ahead of its folds; per-block partials folded in split order by the last
block of each column tile (a ticket), so results are deterministic.

A mixin of :class:`~.reductions.ReductionWriter`: it renders a :class:`~.schedule.Schedule`
and decides nothing.
"""

from __future__ import annotations

from .lower import (
    TYPE_NAMES,
    acc_dtype,
    cast,
    chan_merge,
    combine,
    element_value,
    final_value,
    reciprocal,
    store_cast,
    welford_element,
)
from .passes import Moments, pass_leaves
from .schedule import COLUMN_UNROLL, column_block


class SplitColumns:
    """``write_column_split`` and its helpers (the writer's ``src``, ``v``, ``sched``...)."""

    def fold_partials(self, r, a: str, ai: str, ri: int, count: str, at) -> None:
        """``a`` (and its index ``ai``) folded from the ``count`` partials ``part{ri}`` in block
        order, partial ``b`` at ``part{ri}[at(b)]``: the last block's step of a reduction
        split across blocks (columns here, the full reduction's two stages too)."""
        s, t = self.src, TYPE_NAMES[acc_dtype(r)]
        s(f"{a} = {t}(part{ri}[{at(0)}])")
        if ai:
            s(f"{ai} = parti{ri}[{at(0)}]")
        s("b = 1")
        s(f"while b < {count}:")
        s(f"    {a}_b = {t}(part{ri}[{at('b')}])")
        if ai:
            s(f"    {a}_bi = parti{ri}[{at('b')}]")
        for line in combine(r, a, f"{a}_b", ai, f"{a}_bi" if ai else ""):
            s("    " + line)
        s("    b += 1")

    def write_column_split(self) -> None:
        """Rows split across blocks: block ``b`` reduces column tile ``b % tiles`` (``x``
        threads of ``vector`` adjacent columns) over row chunk ``b // tiles`` (``y`` threads
        interleaved over it). Each thread issues COLUMN_UNROLL independent 16-byte loads
        before folding any. With several splits the blocks write partials; the last block of
        each tile (a ticket) folds them in split order, so the result is deterministic. A
        variance (:class:`~.passes.Moments`) keeps (shift, mean - shift, M2) per column,
        its counts known from the geometry (rows per thread, per split)."""
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
        no_load = self.loader(set())
        accs = [[self.split_accumulator(r) for _ in range(width)] for r in p.reductions]
        # one row count per thread (and its reciprocal) serves every column's Welford fold
        self.counted = {acc_dtype(r): None for r in p.reductions if isinstance(r, Moments)}
        for d in self.counted:
            s(f"cnt_{TYPE_NAMES[d]} = {TYPE_NAMES[d]}(0)")
        # Software-pipelined: the loop loads the next `unroll` rows, then folds the rows the
        # previous iteration loaded, so their loads stay in flight across the back edge
        # whatever order ptxas picks (it keeps few registers live: two loads in flight on
        # sm_80 when a loop uses its own loads).
        step = unroll * by
        s("j = start + ty")
        s(f"if j + {step - by} < stop:")
        with s.block():
            held = self.load_rows(p, unroll, by, "j", "c")
            for lane in range(width):  # a variance's shift: the thread's first element
                env = self.lane_env(held[0], lane)
                for r, a, _ in (lanes[lane] for lanes in accs):
                    if isinstance(r, Moments):
                        s(f"{a}k = {element_value(r, self.value(r.srcs[0], env, no_load))}")
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
                self.fold_rows(self.load_rows(p, 1, by, "j", "r"), accs, by, "j", True)
                s(f"j += {by}")
        for lanes in accs:
            for r, a, ai in lanes:
                combined = self.moments_combine if isinstance(r, Moments) else self.column_combine
                for line in combined(r, a, ai):
                    s(line)
        slot = {r.key: i for i, r in enumerate(self.stage.reductions)}
        s("done = splits == 1")
        s("if not done:")
        with s.block():
            s("if active and ty == 0:")
            with s.block():
                for lanes in accs:
                    for lane, (r, a, ai) in enumerate(lanes):
                        at = f"split * nkept + col + {lane}"
                        if isinstance(r, Moments):
                            i, iq = slot[r.total.key], slot[r.node.key]
                            s(f"part{i}[{at}], parti{i}[{at}] = {a}, {a}k")
                            s(f"part{iq}[{at}] = {ai}")
                            continue
                        s(f"part{slot[r.key]}[{at}] = {a}")
                        if ai:
                            s(f"parti{slot[r.key]}[{at}] = {ai}")
            s("cuda.threadfence()")  # the partials are visible before the ticket moves
            s("cuda.syncthreads()")
            s("if tx == 0 and ty == 0:")
            s("    last[0] = cuda.atomic.add(ticket, tile, 1)")
            s("cuda.syncthreads()")
            s("done = last[0] == splits - 1")
            s("if done and active and ty == 0:")
            with s.block():
                for lanes in accs:
                    for lane, (r, a, ai) in enumerate(lanes):
                        at = f"col + {lane}"
                        if isinstance(r, Moments):
                            self.merge_splits(r, a, ai, at, slot)
                            continue
                        self.fold_partials(
                            r, a, ai, slot[r.key], "splits", lambda b, at=at: f"{b} * nkept + {at}"
                        )
        row_outs = [(i, n) for i, (n, _) in enumerate(self.outputs) if self.space[id(n)] == "row"]
        s("if done and active and ty == 0:")
        with s.block():
            for lane in range(width):
                env: dict = {}
                for lanes in accs:
                    r, a, ai = lanes[lane]
                    if isinstance(r, Moments):
                        self.moment_values(r, a, ai, env)
                        continue
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

    def lane_env(self, parts: dict, lane: int) -> dict:
        """Leaf key -> the loaded element of column ``lane`` of one row (compute dtype)."""
        env = {}
        for key, names in parts.items():
            leaf = next(n for n in self.leaves if n.key == key)
            (env[key],) = self.widened(leaf, [names[lane]])
        return env

    def fold_rows(self, loaded, accs, step: int, base: str, first: bool = False) -> None:
        """Fold loaded rows into each column's accumulators, row by row (ties resolve as in
        one loop over the rows). ``first``: a row may be the thread's first (the tails), which
        sets a variance's shift."""
        s = self.src
        no_load = self.loader(set())
        for u, parts in enumerate(loaded):
            for d in self.counted:
                t = TYPE_NAMES[d]
                s(f"cnt_{t} = cnt_{t} + {t}(1)")
                rk = reciprocal(f"cnt_{t}", d, self.sched.approx_reciprocal)
                # a count is at least 1: its reciprocal is never subnormal, flushing is exact
                s(f"rk_{t} = {rk.replace('rcp_approx(', 'rcp_approx_ftz(')}")
            for lane in range(self.v.vector):
                env = self.lane_env(parts, lane)
                for lanes in accs:
                    r, a, ai = lanes[lane]
                    if not isinstance(r, Moments):
                        index = f"({base} + {u * step})"
                        for line in self.fold_element(r, a, ai, env, no_load, index):
                            s(line)
                        continue
                    t = TYPE_NAMES[acc_dtype(r)]
                    v = self.fresh("e")
                    s(f"{v} = {element_value(r, self.value(r.srcs[0], env, no_load))}")
                    if first:
                        s(f"if cnt_{t} == {t}(1):")
                        s(f"    {a}k = {v}")
                    for line in welford_element(f"{a}k", a, ai, v, f"rk_{t}"):
                        s(line)

    # variances ------------------------------------------------------------------------------
    def split_accumulator(self, r) -> tuple:
        """A reduction's accumulators; a variance's are (mean - shift, M2, the shift ``k``)."""
        if not isinstance(r, Moments):
            return self.accumulator(r)
        a = self.fresh("acc")
        zero = f"{TYPE_NAMES[acc_dtype(r)]}(0)"
        self.src(f"{a}, {a}i, {a}k = {zero}, {zero}, {zero}")
        return r, a, a + "i"

    def merge(self, r, a: tuple, b: tuple) -> list[str]:
        return chan_merge(acc_dtype(r), a, b, self.sched.approx_reciprocal)

    def moments_combine(self, r, a: str, ai: str) -> list[str]:
        """The block's y threads of a column publish (shift, mean, M2); each thread merges
        them in y order. Thread ``w`` folded the rows ``start + w + y * i`` below ``stop``."""
        t = TYPE_NAMES[acc_dtype(r)]
        by = column_block(self.v.vector)[1]
        names = [f"scratch_{t}_c", f"scratch_{t}", f"scratch_{t}_b"]

        def rows(w: str) -> str:
            return f"max(0, (stop - start - {w} + {by - 1}) // {by})"

        out = [f"{n}[ty, tx] = {v}" for n, v in zip(names, (f"{a}k", a, ai), strict=True)]
        out += ["cuda.syncthreads()", f"{a}n = {rows('0')}"]
        out += [f"{v} = {t}({n}[0, tx])" for n, v in zip(names, (f"{a}k", a, ai), strict=True)]
        out += ["w = 1", f"while w < {by}:", f"    {a}_wn = {rows('w')}"]
        b = (f"{a}_wn", f"{a}_wk", f"{a}_w", f"{a}_wi")
        out += [f"    {v} = {t}({n}[w, tx])" for n, v in zip(names, b[1:], strict=True)]
        out += ["    " + line for line in self.merge(r, (f"{a}n", f"{a}k", a, ai), b)]
        return out + ["    w += 1", "cuda.syncthreads()"]

    def merge_splits(self, r, a: str, ai: str, at: str, slot: dict) -> None:
        """The last block of a tile merges every split's (shift, mean, M2) in split order;
        split ``b`` holds the rows ``b * chunk`` up to ``(b + 1) * chunk`` (fewer at the end)."""
        s = self.src
        t = TYPE_NAMES[acc_dtype(r)]
        i, iq = slot[r.total.key], slot[r.node.key]
        s(f"{a}n = min(chunk, nred)")
        s(f"{a}k, {a}, {ai} = {t}(parti{i}[{at}]), {t}(part{i}[{at}]), {t}(part{iq}[{at}])")
        s("b = 1")
        s("while b < splits:")
        with s.block():
            s(f"{a}_bn = max(0, min(chunk, nred - b * chunk))")
            where = f"b * nkept + {at}"
            s(f"{a}_bk, {a}_b = {t}(parti{i}[{where}]), {t}(part{i}[{where}])")
            s(f"{a}_bi = {t}(part{iq}[{where}])")
            b = (f"{a}_bn", f"{a}_bk", f"{a}_b", f"{a}_bi")
            for line in self.merge(r, (f"{a}n", f"{a}k", a, ai), b):
                s(line)
            s("b += 1")

    def moment_values(self, r, a: str, ai: str, env: dict) -> None:
        """M2 and ``mean * count`` as the variance's sum and its mean's sum."""
        s, d = self.src, acc_dtype(r)
        q, total = self.fresh("r"), self.fresh("r")
        s(f"{q} = {cast(ai, d, r.node.dtype)}")
        s(f"{total} = {cast(f'({a}k + {a}) * {TYPE_NAMES[d]}(nred)', d, r.total.dtype)}")
        env[r.node.key], env[r.total.key] = q, total
