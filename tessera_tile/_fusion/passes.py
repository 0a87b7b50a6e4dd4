"""The passes over each row of a reducing stage: one per dependency level of its reductions,
two of them folded into one where an online form exists (:class:`Online` for softmax's
normaliser, :class:`Moments` for a variance over split rows), and what each pass reads and what
later passes reuse from earlier ones. :mod:`.schedule` decides from these how a row is kept.
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import tile_ir as ir
from ..tile_ir import Node, Op
from . import lower
from .plan import Stage


class Online:
    """``sum(exp(f - max(f)))`` folded into the pass that finds ``max(f)``.

    Each thread keeps a running maximum and a sum of ``exp(f - running max)``, rescaled by
    ``exp(old max - new max)`` whenever the maximum grows; partial pairs merge the same way.
    At the end the sum is rescaled to the true maximum (which propagates NaN), so the result
    agrees with the two-pass form. Used when the row does not stay on chip: it saves a pass.
    """

    op = lower.ONLINE

    def __init__(self, node: Node, peak: Node):
        self.node, self.peak = node, peak
        self.key, self.dtype, self.srcs = node.key, node.dtype, node.srcs


class Moments:
    """``var``'s sum of squared deviations and the ``sum(f)`` of its mean (see
    :func:`.lower.moment_sums`) in one pass over split rows: each thread keeps Welford's
    (mean, M2) of ``f - shift``, and partials merge by Chan's formula
    (:func:`.lower.chan_merge`); ``M2`` and ``mean * count`` end the pass."""

    op = lower.MOMENTS

    def __init__(self, node: Node, total: Node):
        self.node, self.total = node, total
        self.key, self.dtype, self.srcs = node.key, node.dtype, total.srcs


def online_sums(nodes) -> dict[str, Node]:
    """SUM(EXP(SUB(f, MAX(f)))) nodes, over the same axes with keepdims: key -> the MAX."""
    out = {}
    for n in nodes:
        if n.op is not Op.SUM or not lower.is_float(n.dtype):
            continue
        e = n.srcs[0]
        if e.op is not Op.EXP or e.srcs[0].op is not Op.SUB:
            continue
        f, peak = e.srcs[0].srcs
        if (
            peak.op is Op.MAX
            and peak.srcs[0].key == f.key
            and peak.arg[1]
            and (peak.arg[0] == n.arg[0] and lower.is_float(f.dtype))
        ):
            out[n.key] = peak
    return out


@dataclass(frozen=True)
class Pass:
    targets: list  # values the pass needs
    reductions: list  # reductions it completes (nodes, or Online)
    outputs: list  # (output position, node) of the F outputs it writes


def pass_leaves(targets) -> set:
    return {n.key for n in ir.walk(targets) if n.op is Op.INPUT}


def plan_passes(stage: Stage, online: bool = False, moments: bool = False) -> list[Pass]:
    """The passes over each row. With ``online``, a softmax-style normaliser (see
    :class:`Online`) completes in the pass of its maximum instead of the next one; with
    ``moments`` (split columns), a variance in the pass of its mean (:class:`Moments`)."""
    f_out = [(i, n) for i, (n, _) in enumerate(stage.outputs) if stage.space[id(n)] == "F"]
    merged = online_sums(stage.nodes) if online else {}
    pairs = lower.moment_sums(stage.nodes) if moments else {}
    level_of: dict[str, int] = {}
    for n in stage.nodes:
        base = max((level_of[s.key] for s in n.srcs), default=0)
        if n.key in merged:
            level_of[n.key] = level_of[merged[n.key].key]
        elif n.key in pairs:
            level_of[n.key] = level_of[pairs[n.key].key]
        else:
            level_of[n.key] = base + 1 if n.op in ir.REDUCE else base
    totals = {t.key for t in pairs.values()}  # computed by their Moments
    reductions = [n for n in stage.nodes if n.op in ir.REDUCE and n.key not in totals]
    depth = max((level_of[r.key] for r in reductions), default=0)
    passes = []
    for k in range(depth):
        reds = [
            Online(r, merged[r.key]) if r.key in merged else r
            for r in reductions
            if level_of[r.key] == k + 1
        ]
        reds = [Moments(r, pairs[r.key]) if r.key in pairs else r for r in reds]
        sources = [r.peak.srcs[0] if isinstance(r, Online) else r.srcs[0] for r in reds]
        outs = [(i, n) for i, n in f_out if level_of[n.key] == k]
        passes.append(Pass(sources + [n for _, n in outs], reds, outs))
    late = [(i, n) for i, n in f_out if level_of[n.key] >= depth]
    if late:
        passes.append(Pass([n for _, n in late], [], late))
    return passes


def multi_pass_leaves(stage: Stage) -> list[Node]:
    """Leaves read by more than one pass: kept on chip when the row fits."""
    uses: dict[str, int] = {}
    for p in plan_passes(stage):  # the cached variant makes every pass
        for key in pass_leaves(p.targets):
            uses[key] = uses.get(key, 0) + 1
    return [n for n in stage.leaves if uses.get(n.key, 0) > 1]


def kept_values(stage: Stage) -> list[Node]:
    """The row values a register row keeps from one pass to the next, at the boundary between
    passes that keeps the most words: the largest values later passes need that earlier ones
    computed (the sum ``x + r`` of a residual layer norm, then its deviation from the mean), not
    the leaves behind them. A leaf one pass reads (a norm's weight) is loaded where it is used."""
    passes = plan_passes(stage)
    widest: list[Node] = []
    for b in range(1, len(passes)):
        earlier = {n.key for p in passes[:b] for n in ir.walk(p.targets)}
        kept: dict[str, Node] = {}
        stack, seen = [t for p in passes[b:] for t in p.targets], set()
        while stack:
            n = stack.pop()
            if n.key in seen or stage.space[id(n)] != "F":  # a row value or a constant
                continue
            seen.add(n.key)
            if n.key in earlier:
                kept[n.key] = n
            elif n.op is not Op.INPUT:
                stack.extend(n.srcs)
        if words(kept.values()) > words(widest):
            widest = list(kept.values())
    return widest


def words(nodes) -> int:
    """4-byte registers per element of these values (float16 and bfloat16 are held as float32)."""
    return sum(max(4, n.dtype.itemsize) // 4 for n in nodes)


def cached_leaves(stage: Stage, broadcast: frozenset = frozenset()) -> list[Node]:
    """The multi-pass leaves a row cache keeps: all but those the block stages once
    (``broadcast``), which every pass reads from the block's shared copy."""
    return [n for n in multi_pass_leaves(stage) if n.key not in broadcast]
