"""The composer's hand-written stages (:mod:`.gemm`) bound to a call: a matmul inside
``@tt.fuse`` runs as the matmul ops' :class:`~tessera_tile.kernels.matmul.plan.Product`, with
the stage's generated epilogue in place of an activation; an attention pattern the planner
found runs as ``ops.attention``'s plan (:mod:`tessera_tile.kernels.attention.plan`).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from .. import tile_ir as ir
from .._runtime import arrays, launch
from .._runtime.launch import Value
from ..kernels.attention import plan as attention_plan
from ..kernels.epilogue import ElementEpilogue
from ..kernels.matmul import calls as matmul_calls
from ..kernels.matmul.choice import DUAL
from ..kernels.matmul.plan import Product
from ..kernels.matmul.prologue import ElementPrologue
from ..tile_ir import Op
from . import gemm
from .lower import TYPE_NAMES
from .plan import StageKind


@dataclass(frozen=True)
class Generated:
    """What explain shows of a stage: its name and its epilogue's generated source."""

    name: str
    source: str


def _name(leaf) -> str:
    return f"argument {leaf.arg}" if isinstance(leaf.arg, int) else "an intermediate result"


def _record(leaf, records: dict) -> arrays.Arg:
    """A leaf's record; a swapped view of an argument (``tt.swapaxes``) is made from its
    strides, read in place."""
    if leaf.op is not Op.SWAPAXES:
        return records[leaf.arg]
    rec = records[leaf.srcs[0].arg]
    shape, strides = list(rec.shape), list(rec.strides)
    i, j = leaf.arg
    shape[i], shape[j], strides[i], strides[j] = shape[j], shape[i], strides[j], strides[i]
    return rec._replace(shape=tuple(shape), strides=tuple(strides))


def _key(leaf):
    return leaf.srcs[0].arg if leaf.op is Op.SWAPAXES else leaf.arg


@dataclass
class GemmBound:
    """A GEMM stage bound to a call's array layouts: its product, and where its arrays are."""

    stage: object
    product: Product
    keys: tuple  # record keys of a, b (the bias), the extras, then the result
    scalars: tuple  # call positions of the epilogue's scalar arguments
    generated: Generated

    @property
    def empty(self) -> bool:
        return self.product.empty

    def _launches(self):
        p = self.product
        return p.plan_launches(p.a, p.b, p._c_record(None))[2]

    def predicted_bytes(self) -> int:
        """The product's bytes (operands per tile, C once unless the epilogue writes every
        result) and each array the epilogue reads or writes, once per C element (every lane
        its own)."""
        p = self.product
        launches = self._launches()
        first = launches[0][3] if launches else None
        config = first.config if first else p.tile_config()
        elements = math.prod(p.batch) * p.m * p.n
        unstored = 0 if p.epilogue is None or p.epilogue.stores else elements * p.dtype.itemsize
        extras = sum(elements * r.dtype.itemsize for r in p.extras)
        bias_reads = first.bias_reads if first else None
        return p.predicted_bytes(config, bias_reads) - unstored + extras

    def flops(self) -> int:
        """The product's, one per output element for each op of the epilogue, and one per
        operand element (in each batch) for each op of a prologue."""
        p, parts = self.product, gemm.parts(self.stage)
        total = p.product_flops() + parts.ops * math.prod(p.batch) * p.m * p.n
        for side, operand in parts.prologues:
            size = p.m * p.k if side == "a" else p.k * p.n
            ops = sum(n.op in ir.ELEMENTWISE for n in ir.walk([operand]))
            total += ops * math.prod(p.batch) * size
        return total

    def describe(self) -> str:
        parts = gemm.parts(self.stage)
        pieces = [
            f"{sum(n.op in ir.ELEMENTWISE for n in ir.walk([pro]))}-op prologue on {side}"
            for side, pro in parts.prologues
        ] + ([f"{parts.ops}-op epilogue"] if parts.ops else [])
        head = f"matmul + {' + '.join(pieces)} in one kernel" if pieces else "matmul"
        results = len(parts.sides) + (parts.stored is not None)
        if results > 1:
            head += f", {results} results each written once from the accumulator tile"
        elif parts.stored is None:
            head += ", its result written by the epilogue (no result of the product's dtype)"
        launches = self._launches()
        if not launches:
            return f"{head}: nothing to compute"
        text = f"{head}: " + self.product.stage_text(launches)[0].split(": ", 1)[1]
        reasons = sorted({r for *_, choice in launches for r in choice.reasons})  # the kernel's
        return "; ".join([text, *reasons])

    def launch(self, records: dict) -> StageLaunches:
        *inputs, result = self.records_of(records)
        return StageLaunches(self, launch.Kept(self.product.launches(inputs, result)))

    def records_of(self, records: dict) -> list:
        parts = gemm.parts(self.stage)
        operands = [parts.a, parts.b] + ([parts.bias] if parts.bias is not None else [])
        operands += [parts.b2] if parts.b2 is not None else []
        leaves = [_record(n, records) for n in (*operands, *parts.extras)]
        first_side = len(operands) + len(parts.extras)
        return [*leaves, *(records[k] for k in self.keys[first_side:])]


@dataclass
class FlashBound:
    """An attention stage bound to a call's layouts: ``ops.attention``'s validated call."""

    stage: object
    call: object  # kernels.attention.plan.Attention
    keys: tuple  # record keys of q, k, v, then the result
    generated: Generated
    scalars: tuple = ()

    @property
    def empty(self) -> bool:
        return self.call.empty

    def predicted_bytes(self) -> int:
        return self.call.report().bytes_fused

    def flops(self) -> int:
        return self.call.flops()

    def describe(self) -> str:
        return "attention pattern -> flash kernel: " + self.call.report().stages[0]

    def launch(self, records: dict) -> StageLaunches:
        *inputs, result = (records[k] for k in self.keys)
        return StageLaunches(self, launch.Kept(self.call.launches(inputs, result)))


@dataclass(frozen=True)
class StageLaunches:
    """A hand-written stage in a launch plan: its kernel launches, made once per layout and
    kept (direct after their first run)."""

    bound: object
    kept: launch.Kept

    def run(self, handles: dict, place) -> None:
        b = self.bound
        params = [handles[k] for k in b.keys] + [handles[pos] for pos in b.scalars]
        self.kept.run(params, place.stream, self.label)

    def label(self) -> launch.Label:
        b = self.bound
        kernels = dict.fromkeys(k.kernel.py_func.__name__ for k in self.kept.launches)
        return launch.Label(
            f"{' + '.join(kernels)} ({b.generated.name})", b.predicted_bytes(), b.flops()
        )

    def signatures(self) -> list[tuple]:
        return [(k.kernel, k.signature, k.threads, k.shared) for k in self.kept.launches]


def bind(stage, records: dict, math_mode: str, precision: str | None):
    """A GEMM or attention stage bound to a call's records."""
    if stage.kind is StageKind.ATTENTION:
        return bind_attention(stage, records)
    return bind_gemm(stage, records, math_mode, precision)


def bind_attention(stage, records: dict) -> FlashBound:
    ((node, dest),) = stage.outputs
    q, k, v = (records[n.arg] for n in node.srcs)
    scale, mask_shape = node.arg
    call = attention_plan.attention(q, k, v, scale=scale, causal=mask_shape is not None)
    keys = (*(n.arg for n in node.srcs), dest)
    return FlashBound(stage, call, keys, Generated("flash_attention", "# ops.attention\n"))


def bind_gemm(stage, records: dict, math_mode: str, precision: str | None) -> GemmBound:
    parts = gemm.parts(stage)
    dests = [d for _, d in stage.outputs]
    sides = tuple(dests[i] for i in parts.sides_at)
    # C: the stored result, else (the epilogue writes them all) the first, for its shape
    dest = dests[parts.stored_at if parts.stored_at is not None else 0]
    arrays_read = _record(parts.a, records), _record(parts.b, records)
    # the operands as the kernel stages them: a prologue's array may be a narrower dtype
    dtype = np.dtype(parts.product.srcs[0].dtype)
    a, b = (r._replace(dtype=dtype) for r in arrays_read)
    bias = records[parts.bias.arg] if parts.bias is not None else None
    product = matmul_calls.product(
        a, b, (_name(parts.a), _name(parts.b)), "matmul", None, bias, None,
        _name(parts.bias) if bias is not None else "bias", precision,
    )  # fmt: skip
    if parts.b2 is not None:  # its own tile (twice the accumulators), not tuned
        kind = product.tuner.expected(a, b).dtype
        b2 = _record(parts.b2, records)
        product = dataclasses.replace(product, b2=b2, config=DUAL[kind])
    elif any(r.value is None for r in (a, b)):  # host inputs' copies: nothing to time yet
        product = dataclasses.replace(product, config=product.tuner.expected(a, b))
    name, source = f"{product.name}_product", "# no epilogue: C = a @ b (+ bias)\n"
    if parts.generated:
        name, source = gemm.epilogue_source(stage, math_mode)
        fn = gemm.epilogue_function(source, name)
        # a, b, the bias, b2, the extras, the sides, the result, then the scalars
        first = len(parts.extras) + len(sides) + 3 + (bias is not None)
        first += parts.b2 is not None
        product = dataclasses.replace(
            product,
            epilogue=ElementEpilogue(fn, name, stores=parts.stored is not None),
            extras=tuple(records[k] for k in (*(n.arg for n in parts.extras), *sides)),
            scalars=tuple(Value(first + j) for j in range(len(parts.scalars))),
            scalar_types=tuple(TYPE_NAMES[np.dtype(n.dtype)] for n in parts.scalars),
        )
    prologues = {}  # each computed operand's, applied to its tiles as they land
    for side, operand in parts.prologues:
        pro_name, pro_source = gemm.prologue_source(operand, math_mode)
        fn = gemm.epilogue_function(pro_source, pro_name)
        prologues[side] = ElementPrologue(fn, pro_name)
        source = pro_source + source
    if prologues:
        product = dataclasses.replace(
            product, prologue=(prologues.get("a"), prologues.get("b")), a=arrays_read[0],
            b=arrays_read[1], operand_dtype=dtype,
        )  # fmt: skip
    operands = (parts.a, parts.b) + ((parts.bias,) if bias is not None else ())
    operands += (parts.b2,) if parts.b2 is not None else ()
    keys = (*(_key(n) for n in operands), *(n.arg for n in parts.extras), *sides, dest)
    return GemmBound(
        stage, product, keys, tuple(n.arg for n in parts.scalars), Generated(name, source)
    )
