"""The warp-level tensor-core intrinsics: ``ldmatrix``, ``mma.sync`` (float16, bfloat16, TF32)
and the accumulator and pair stores; the fragment layouts are in :mod:`tessera_tile.mma`."""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import cuda, types
from numba.cuda.extending import intrinsic

from .. import bfloat16
from .._device import twins
from .._device.intrinsics import check_index, element_pointer, shared_address
from .._runtime import config as _config
from .._runtime.compat import NumbaTypeError

if _config.SIMULATED:  # the twins, the simulator's (not imported outside it)
    from ..sim.mma_twins import (
        _ldmatrix_twin,
        _load_f32_shared_twin,
        _load_f32x2_shared_twin,
        _mma_bf16_twin,
        _mma_tf32_twin,
        _mma_twin,
        _pack_twin,
        _pair_twin,
        _to_tf32_twin,
    )
else:
    _load_f32_shared_twin = _load_f32x2_shared_twin = _mma_bf16_twin = _mma_tf32_twin = None
    _mma_twin = _pack_twin = _to_tf32_twin = None
    _ldmatrix_twin = _pair_twin = twins.absent

WARP_SIZE = 32


# --------------------------------------------------------------------------------------------
# Intrinsics (inline PTX)
# --------------------------------------------------------------------------------------------

_I32 = ir.IntType(32)


def _make_ldmatrix(count: int, trans: bool):
    name = f"ldmatrix_x{count}{'_trans' if trans else ''}"
    outs = ", ".join(f"${i}" for i in range(count))
    asm = (
        f"ldmatrix.sync.aligned.m8n8.x{count}{'.trans' if trans else ''}.shared.b16 "
        f"{{{outs}}}, [${count}];"
    )
    constraints = ",".join(["=r"] * count) + ",r,~{memory}"
    result = types.uint32 if count == 1 else types.UniTuple(types.uint32, count)

    def impl(typingctx, smem, index):
        check_index(name, smem, index)
        if smem.dtype.bitwidth != 16 and (trans or smem.dtype.bitwidth != 32):
            wanted = "16-bit elements" if trans else "16- or 32-bit elements"
            raise NumbaTypeError(f"{name} reads {wanted}, got {smem.dtype}")

        def codegen(context, builder, sig, args):
            ptr = element_pointer(context, builder, sig.args[0], args[0], sig.args[1], args[1])
            addr = shared_address(builder, ptr)
            ret = _I32 if count == 1 else ir.LiteralStructType([_I32] * count)
            fnty = ir.FunctionType(ret, [_I32])
            res = builder.call(ir.InlineAsm(fnty, asm, constraints, side_effect=True), [addr])
            if count == 1:
                return res
            values = [builder.extract_value(res, i) for i in range(count)]
            return context.make_tuple(builder, sig.return_type, values)

        return result(smem, types.unliteral(index)), codegen

    impl.__name__ = impl.__qualname__ = name
    layout = "(M[2t, g], M[2t+1, g])" if trans else "(M[g, 2t], M[g, 2t+1])"
    doc = (
        f"``{name}(smem, index)``: ``ldmatrix...x{count}{'.trans' if trans else ''}``, "
        f"{count} 8 x 8 matrices of 16-bit values. Lane ``8j + r`` (j < {count}) gives row r "
        f"of matrix j at ``&smem[index]`` (16 bytes, 16-byte aligned, shared memory); lane "
        f"``4g + t`` receives {layout} of matrix j in register j, low half first. A warp-wide "
        "``.aligned`` collective: all 32 lanes call it together."
    )
    twin_fn = _ldmatrix_twin(count, trans)
    if twin_fn is not None:  # (none outside the simulator)
        twin_fn.__name__ = twin_fn.__qualname__ = f"{name}_twin"
    fn = twins.twin(twin_fn)(intrinsic(impl))
    fn.__doc__ = doc
    return fn


ldmatrix_x1 = _make_ldmatrix(1, False)
ldmatrix_x2 = _make_ldmatrix(2, False)
ldmatrix_x4 = _make_ldmatrix(4, False)
ldmatrix_x1_trans = _make_ldmatrix(1, True)
ldmatrix_x2_trans = _make_ldmatrix(2, True)
ldmatrix_x4_trans = _make_ldmatrix(4, True)

_MMA_ASM = (
    "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
    "{$0, $1, $2, $3}, {$4, $5, $6, $7}, {$8, $9}, {$10, $11, $12, $13};"
)
_MMA_CONSTRAINTS = "=f,=f,=f,=f,r,r,r,r,r,r,f,f,f,f"


def _f16_operand(context, builder, value, ty):
    """A register of two packed float16: the integer as uint32."""
    return context.cast(builder, value, ty, types.uint32)


def _mma_codegen(asm: str, operand):
    """Codegen of an mma whose A and B tuples hold 6 32-bit registers (``operand`` makes each)
    and C 4 float32: one inline-asm call returning the 4 float32 of D."""

    def codegen(context, builder, sig, args):
        ops = []
        for k, (tup_t, arg) in enumerate(zip(sig.args, args, strict=True)):
            for i, t in enumerate(tup_t):
                value = builder.extract_value(arg, i)
                if k == 2:
                    ops.append(context.cast(builder, value, t, types.float32))
                else:
                    ops.append(operand(context, builder, value, t))
        f32 = ir.FloatType()
        fnty = ir.FunctionType(ir.LiteralStructType([f32] * 4), [_I32] * 6 + [f32] * 4)
        res = builder.call(ir.InlineAsm(fnty, asm, _MMA_CONSTRAINTS), ops)
        values = [builder.extract_value(res, i) for i in range(4)]
        return context.make_tuple(builder, sig.return_type, values)

    return codegen


def _registers(what: str, tup, count: int, kind, name: str = "mma_m16n8k16") -> None:
    if not isinstance(tup, types.BaseTuple) or len(tup) != count:
        raise NumbaTypeError(f"{name}: {what} must be a tuple of {count}, got {tup}")
    if not all(isinstance(t, kind) for t in tup):
        raise NumbaTypeError(f"{name}: {what} holds {tup}, expected {kind.__name__}s")


@twins.twin(_mma_twin)
@intrinsic
def mma_m16n8k16(typingctx, a, b, c):
    """``mma_m16n8k16(a, b, c) -> d``: ``d = a @ b + c`` on the tensor cores
    (``mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32``).

    ``a``: 4 ``uint32`` (the 16 x 16 float16 A fragment), ``b``: 2 ``uint32`` (16 x 8 float16 B),
    ``c``: 4 ``float32`` (16 x 8 accumulators); returns 4 ``float32``. Layouts in the module
    doc. A warp-wide ``.aligned`` collective: all 32 lanes call it together.
    """
    _registers("a", a, 4, types.Integer)
    _registers("b", b, 2, types.Integer)
    _registers("c", c, 4, types.Number)

    return types.UniTuple(types.float32, 4)(a, b, c), _mma_codegen(_MMA_ASM, _f16_operand)


_MMA_BF16_ASM = _MMA_ASM.replace(".f16.f16.", ".bf16.bf16.")


@twins.twin(_mma_bf16_twin)
@intrinsic
def mma_m16n8k16_bf16(typingctx, a, b, c):
    """``mma_m16n8k16_bf16(a, b, c) -> d``: ``d = a @ b + c`` on the tensor cores with bfloat16
    inputs (``mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32``): the fragments of
    :func:`mma_m16n8k16`, each ``uint32`` of ``a`` and ``b`` two packed bfloat16 (low half
    first: ``ldmatrix`` of a bfloat16 tile, or ``bfloat16.pack_bf16x2``); ``c`` and the result
    4 ``float32``. A warp-wide ``.aligned`` collective."""
    name = "mma_m16n8k16_bf16"
    _registers("a", a, 4, types.Integer, name)
    _registers("b", b, 2, types.Integer, name)
    _registers("c", c, 4, types.Number, name)
    return types.UniTuple(types.float32, 4)(a, b, c), _mma_codegen(_MMA_BF16_ASM, _f16_operand)


_MMA_TF32_ASM = (
    "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
    "{$0, $1, $2, $3}, {$4, $5, $6, $7}, {$8, $9}, {$10, $11, $12, $13};"
)


def _tf32_operand(context, builder, value, ty):
    """A 32-bit operand register: uint32 as is, float32 reinterpreted (a bitcast, no move)."""
    return builder.bitcast(value, _I32) if isinstance(ty, types.Float) else value


@twins.twin(_mma_tf32_twin)
@intrinsic
def mma_m16n8k8_tf32(typingctx, a, b, c):
    """``mma_m16n8k8_tf32(a, b, c) -> d``: ``d = a @ b + c`` on the tensor cores with TF32
    inputs (``mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32``).

    ``a``: 4 32-bit registers (the 16 x 8 A fragment), ``b``: 2 (8 x 8 B), each ``uint32`` (a
    float32 bit pattern, as ``ldmatrix`` on a float32 tile gives) or ``float32`` (reinterpreted,
    no instruction); ``c``: 4 ``float32`` (16 x 8 accumulators); returns 4 ``float32``. Layouts in
    the module doc. The tensor core ignores the low 13 bits of each input (truncation toward
    zero for a float32 that is not a TF32 value; ``to_tf32`` rounds to nearest first). A
    warp-wide ``.aligned`` collective: all 32 lanes call it together.
    """
    name = "mma_m16n8k8_tf32"
    _registers("a", a, 4, types.Number, name)
    _registers("b", b, 2, types.Number, name)
    _registers("c", c, 4, types.Number, name)
    for t in (*a, *b):
        if t.bitwidth != 32 or not isinstance(t, types.Integer | types.Float):
            raise NumbaTypeError(f"{name}: a and b take float32 or 32-bit integers, got {t}")

    return types.UniTuple(types.float32, 4)(a, b, c), _mma_codegen(_MMA_TF32_ASM, _tf32_operand)


def _make_shared_f32_load(count: int, twin):
    """``load_f32_shared`` (``ld.shared.f32``) or ``load_f32x2_shared`` (``.v2``): inline
    PTX, so that the loads keep their place between the mma around them (indexing the array
    lets the compiler hoist a k-tile's loads, and the registers they hold spill)."""
    name = f"load_f32{'x2' if count == 2 else ''}_shared"
    text = "ld.shared.f32 $0, [$1];" if count == 1 else "ld.shared.v2.f32 {$0, $1}, [$2];"

    def typer(typingctx, smem, index):
        check_index(name, smem, index)
        if smem.dtype != types.float32:
            raise NumbaTypeError(f"{name} reads a float32 array, got {smem.dtype}")

        def codegen(context, builder, sig, args):
            ptr = element_pointer(context, builder, sig.args[0], args[0], sig.args[1], args[1])
            f32 = ir.FloatType()
            result = f32 if count == 1 else ir.LiteralStructType([f32] * count)
            fnty = ir.FunctionType(result, [_I32])
            asm = ir.InlineAsm(fnty, text, ",".join(["=f"] * count + ["r", "~{memory}"]),
                               side_effect=True)  # fmt: skip
            res = builder.call(asm, [shared_address(builder, ptr)])
            if count == 1:
                return res
            values = [builder.extract_value(res, i) for i in range(count)]
            return context.make_tuple(builder, sig.return_type, values)

        result = types.float32 if count == 1 else types.UniTuple(types.float32, count)
        return result(smem, types.unliteral(index)), codegen

    typer.__name__ = name
    return twins.twin(twin)(intrinsic(typer))


load_f32_shared = _make_shared_f32_load(1, _load_f32_shared_twin)
load_f32_shared.__doc__ = """``load_f32_shared(smem, index) -> x``: ``smem[index]`` of a
float32 shared array in one 4-byte load (``ld.shared.f32``, ``LDS``) that keeps its place
among the inline PTX around it (a transposed A's TF32 fragments)."""
load_f32x2_shared = _make_shared_f32_load(2, _load_f32x2_shared_twin)
load_f32x2_shared.__doc__ = """``load_f32x2_shared(smem, index) -> (x0, x1)``: ``smem[index]``
and the next float32 in one 8-byte shared load (``ld.shared.v2.f32``, ``LDS.64``);
``&smem[index]`` must be 8-byte aligned (the twin checks; the GPU faults). Two of them fill a
TF32 fragment of 4 consecutive registers without moves (the TF32 matmul's B tiles)."""


@twins.twin(_to_tf32_twin)
@intrinsic
def to_tf32(typingctx, x):
    """``to_tf32(x)``: float32 ``x`` rounded to TF32 (``cvt.rna.tf32.f32``: to nearest, ties
    away from zero; the low 13 bits of the result are 0), returned as a float32 (its bit
    pattern is the TF32 operand ``mma_m16n8k8_tf32`` reads). Finite values past the TF32 range
    round to infinity; inf and NaN stay inf and NaN."""
    if not isinstance(x, types.Number):
        raise NumbaTypeError(f"to_tf32 takes a float32, got {x}")

    def codegen(context, builder, sig, args):
        value = context.cast(builder, args[0], sig.args[0], types.float32)
        f32 = ir.FloatType()
        fnty = ir.FunctionType(_I32, [f32])
        res = builder.call(ir.InlineAsm(fnty, "cvt.rna.tf32.f32 $0, $1;", "=r,f"), [value])
        return builder.bitcast(res, f32)

    return types.float32(x), codegen


def _check_pair_store(name: str, dtype, out, index, x0, x1) -> None:
    """Typing errors of a two-element store ``name`` into a ``dtype`` array."""
    check_index(name, out, index)
    if out.dtype != dtype:
        raise NumbaTypeError(f"{name} stores into a {dtype} array, got {out.dtype}")
    for x in (x0, x1):
        if not isinstance(x, types.Number):
            raise NumbaTypeError(f"{name} stores numbers, got {x}")


def _make_pair_store(space: str, kind: str = "f16"):
    """``store_f16x2`` (float16 arrays) or ``store_bf16x2`` (a bfloat16 array's ``uint16``
    bits) into ``space`` memory."""
    name = f"store_{kind}x2"
    element = types.float16 if kind == "f16" else types.uint16

    def impl(typingctx, out, index, x0, x1):
        _check_pair_store(name, element, out, index, x0, x1)

        def codegen(context, builder, sig, args):
            ptr = element_pointer(context, builder, sig.args[0], args[0], sig.args[1], args[1])
            f32 = ir.FloatType()
            lo = context.cast(builder, args[2], sig.args[2], types.float32)
            hi = context.cast(builder, args[3], sig.args[3], types.float32)
            # cvt packs its first source in the upper half.
            if space == "shared":
                addr, cons = shared_address(builder, ptr), "r,f,f,~{memory}"
                st = "st.shared.b32"
            else:
                addr, cons = ptr, "l,f,f,~{memory}"
                st = "st.global.b32"
            asm = f"{{ .reg .b32 p; cvt.rn.{kind}x2.f32 p, $2, $1; {st} [$0], p; }}"
            fnty = ir.FunctionType(ir.VoidType(), [addr.type, f32, f32])
            builder.call(ir.InlineAsm(fnty, asm, cons, side_effect=True), [addr, lo, hi])
            return context.get_dummy_value()

        return types.void(out, types.unliteral(index), x0, x1), codegen

    impl.__name__ = impl.__qualname__ = f"{name}{'_shared' if space == 'shared' else ''}"
    if kind == "f16":
        twin = _pair_twin(name, np.float16, space)
    else:
        twin = _pair_twin(name, np.uint16, space, bfloat16.float32_to_bits)
    fn = twins.twin(twin)(intrinsic(impl))
    what = "float16" if kind == "f16" else "bfloat16 (into its uint16 bits)"
    fn.__doc__ = (
        f"``{impl.__name__}(out, index, x0, x1)``: ``out[index]``, the next element = ``x0``, "
        f"``x1`` rounded to {what}, in one 4-byte {space} store (``cvt.rn.{kind}x2.f32`` + "
        "``st.b32``). ``&out[index]`` must be 4-byte aligned (the twin checks)."
    )
    return fn


@twins.twin(_pack_twin)
@intrinsic
def pack_f16x2(typingctx, lo, hi):
    """``pack_f16x2(lo, hi) -> uint32``: ``lo`` and ``hi`` rounded to float16 (nearest even) in
    one register, ``lo`` in the low 16 bits (``cvt.rn.f16x2.f32``, one ``F2FP`` in SASS). Two
    neighbouring accumulators ``(c0, c1)`` of a 16 x 8 tile packed this way are an A-fragment
    register of the next product (flash attention's ``P @ V``)."""
    for x in (lo, hi):
        if not isinstance(x, types.Number):
            raise NumbaTypeError(f"pack_f16x2 packs numbers, got {x}")

    def codegen(context, builder, sig, args):
        f32 = ir.FloatType()
        lo_v = context.cast(builder, args[0], sig.args[0], types.float32)
        hi_v = context.cast(builder, args[1], sig.args[1], types.float32)
        fnty = ir.FunctionType(_I32, [f32, f32])
        # cvt packs its first source in the upper half.
        asm = ir.InlineAsm(fnty, "cvt.rn.f16x2.f32 $0, $2, $1;", "=r,f,f")
        return builder.call(asm, [lo_v, hi_v])

    return types.uint32(lo, hi), codegen


store_f16x2 = _make_pair_store("global")
store_f16x2_shared = _make_pair_store("shared")
store_bf16x2 = _make_pair_store("global", "bf16")
store_bf16x2_shared = _make_pair_store("shared", "bf16")


@twins.twin(_pair_twin("store_f32x2", np.float32, "global"))
@intrinsic
def store_f32x2(typingctx, out, index, x0, x1):
    """``store_f32x2(out, index, x0, x1)``: ``out[index]``, the next element = ``x0``, ``x1``
    in one 8-byte global store (``st.global.v2.f32``, ``STG.E.64``). ``&out[index]`` must be
    8-byte aligned (the twin checks; the GPU faults)."""
    _check_pair_store("store_f32x2", types.float32, out, index, x0, x1)

    def codegen(context, builder, sig, args):
        ptr = element_pointer(context, builder, sig.args[0], args[0], sig.args[1], args[1])
        lo = context.cast(builder, args[2], sig.args[2], types.float32)
        hi = context.cast(builder, args[3], sig.args[3], types.float32)
        f32 = ir.FloatType()
        fnty = ir.FunctionType(ir.VoidType(), [ptr.type, f32, f32])
        asm = "st.global.v2.f32 [$0], {$1, $2};"
        builder.call(ir.InlineAsm(fnty, asm, "l,f,f,~{memory}", side_effect=True), [ptr, lo, hi])
        return context.get_dummy_value()

    return types.void(out, types.unliteral(index), x0, x1), codegen


@cuda.jit(device=True)
def store_accumulator(acc, out, row0, col0):
    """Write the 16 x 8 accumulator tile ``acc`` (4 float32 per lane, layout C) to
    ``out[row0:row0 + 16, col0:col0 + 8]`` of a 2-d ``out`` (global or shared, any dtype: the
    values are cast), skipping elements outside ``out.shape``. Plain stores: per lane, rows
    ``row0 + g`` and ``row0 + g + 8``, columns ``col0 + 2t`` and ``col0 + 2t + 1``."""
    lane = cuda.laneid
    r = row0 + (lane >> 2)
    c = col0 + 2 * (lane & 3)
    m, n = out.shape
    for h in range(2):
        rr = r + 8 * h
        if rr < m:
            if c < n:
                out[rr, c] = acc[2 * h]
            if c + 1 < n:
                out[rr, c + 1] = acc[2 * h + 1]


# --------------------------------------------------------------------------------------------
# Warpgroup MMA (wgmma, sm_90a): see the "Warpgroup MMA" section of docs/tensor_cores.md
