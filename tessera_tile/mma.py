"""Warp-level tensor-core fragments: ``ldmatrix``, ``mma.sync.m16n8k16`` (float16 in, float32
accumulate), ``mma.sync.m16n8k8`` (TF32 in, float32 accumulate) and accumulator stores, as Numba
CUDA device functions (inline PTX, sm_80+); and Hopper's warpgroup MMA (``wgmma_fence``,
``wgmma_async``, ``wgmma_async_bf16``, ``wgmma_commit_group``, ``wgmma_wait_group``,
``wgmma_descriptor``, ``wgmma_zeros``: sm_90a, described in docs/tensor_cores.md, "Warpgroup
MMA", with its simulator twin's rules).

numba-cuda has no tensor-core API; these intrinsics reach the tensor cores through inline PTX
and each has a simulator twin (in :mod:`tessera_tile._mma_twins`) that reproduces the PTX ISA's
fragment layouts lane by lane, so one kernel runs in the simulator (checked against NumPy) and
on the GPU.

Fragments (one warp holds one fragment; each lane holds the registers below)
===========================================================================

``groupID = lane >> 2`` and ``tig = lane % 4`` (the thread in its group of four). A ``uint32``
register holds two float16 values, the lower-numbered element in its low 16 bits.

A: 16 x 16 float16, row-major (``mma...row``), ``UniTuple(uint32, 4)`` = (a0a1, a2a3, a4a5, a6a7)::

    a_i at row = groupID + 8 * ((i >> 1) & 1),  col = 2 * tig + (i & 1) + 8 * (i >> 2)

            cols 0..7          cols 8..15
          +-----------------+-----------------+
    0..7  | reg 0 (a0, a1)  | reg 2 (a4, a5)  |    lane 4g+t holds row g (or g+8),
          +-----------------+-----------------+    columns 2t, 2t+1 of each 8 x 8 quarter
    8..15 | reg 1 (a2, a3)  | reg 3 (a6, a7)  |
          +-----------------+-----------------+

B: 16 x 8 float16 indexed [k, n] (``...col``), ``UniTuple(uint32, 2)`` = (b0b1, b2b3)::

    b_i at k = 2 * tig + (i & 1) + 8 * (i >> 1),  n = groupID

    k 0..7   | reg 0 (b0, b1) |    lane 4g+t holds column n = g, rows k = 2t, 2t+1
    k 8..15  | reg 1 (b2, b3) |    (two consecutive k of one column per register)

C and D: 16 x 8 float32, ``UniTuple(float32, 4)`` = (c0, c1, c2, c3)::

    c_i at row = groupID + 8 * (i >> 1),  col = 2 * tig + (i & 1)

    rows 0..7   | c0 c1 at (g, 2t), (g, 2t+1)         |
    rows 8..15  | c2 c3 at (g+8, 2t), (g+8, 2t+1)     |

TF32 (``mma_m16n8k8_tf32``): A 16 x 8, B 8 x 8 [k, n], C and D as above. Each register holds one
32-bit value (a float32 bit pattern; the tensor core reads it as TF32)::

    A, UniTuple(uint32 or float32, 4) = (a0, a1, a2, a3):
    a_i at row = groupID + 8 * (i & 1),  col = tig + 4 * (i >> 1)

            cols 0..3   cols 4..7
    0..7  |   a0     |   a2     |       lane 4g+t holds rows g, g+8, columns t, t+4
    8..15 |   a1     |   a3     |

    B, UniTuple(uint32 or float32, 2) = (b0, b1):   b_i at k = tig + 4 * i,  n = groupID

An A fragment of a row-major float32 tile is one ``ldmatrix_x4`` on the float32 array (each
float32 a pair of b16: lane ``4g + t`` receives row ``g``, float32 column ``t`` of each 8 x 4
matrix): ``ldmatrix_x4(s, (r0 + lane % 16, c0 + 4 * (lane // 16)))``. ``.trans`` moves 16-bit
halves, so it cannot transpose 32-bit elements: B fragments of a row-major [k, n] tile are two
scalar loads, ``s[k0 + t, n0 + g]`` and ``s[k0 + t + 4, n0 + g]``; or, with the operands swapped
(``C^T = B^T A^T``, the TF32 matmul), 16 columns of B are an A fragment whose row ``g`` is
column ``2g`` and row ``g + 8`` column ``2g + 1``: two ``load_f32x2_shared`` of ``(k0 + t, n0 +
2g)`` and ``(k0 + t + 4, n0 + 2g)`` fill ``(a0, a1)`` and ``(a2, a3)``.

This representation compiles to registers (HMMA.16816.F32 takes them directly): no local
memory, no packing instructions. Keep many fragments (a warp's accumulator tile) in
``cuda.local.array`` indexed only by constants (loops over constants, which LLVM unrolls).

Intrinsics
==========

==========================================  ================================================
``ldmatrix_x1/x2/x4(smem, index)``          ``ldmatrix.sync.aligned.m8n8.x{1,2,4}.shared.b16``:
                                            1, 2 or 4 8 x 8 matrices of 16-bit values from
                                            shared memory -> ``uint32`` / 2- / 4-tuple
``ldmatrix_x1/x2/x4_trans(smem, index)``    the same, each matrix transposed (``.trans``)
``mma_m16n8k16(a, b, c) -> d``              ``mma.sync.aligned.m16n8k16.row.col.f32.f16.f16
                                            .f32``: ``d = a @ b + c``
``mma_m16n8k8_tf32(a, b, c) -> d``         ``mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32
                                            .f32``: ``d = a @ b + c`` on TF32 inputs
``load_f32x2_shared(smem, index)``          ``ld.shared.v2.f32``: ``smem[index]`` and the next
                                            float32 (8-byte aligned) -> 2-tuple (``LDS.64``)
``to_tf32(x)``                              ``cvt.rna.tf32.f32``: ``x`` rounded to TF32
                                            (nearest, ties away from zero), as float32
``pack_f16x2(lo, hi) -> uint32``            ``cvt.rn.f16x2.f32``: two float32 rounded to float16
                                            in one register (``lo`` in the low half), e.g. an
                                            accumulator pair as an A-fragment register
``store_f16x2(out, index, x0, x1)``         ``out[index], out[index + 1] = x0, x1`` rounded to
                                            float16 in one 4-byte store (``.global``; use
                                            ``store_f16x2_shared`` for shared memory)
``store_f32x2(out, index, x0, x1)``          ``out[index], out[index + 1] = x0, x1`` (float32)
                                            in one 8-byte global store (``st.global.v2.f32``)
``store_accumulator(acc, out, row0, col0)``  the 16 x 8 tile ``acc`` at ``out[row0:, col0:]``,
                                            masked by ``out.shape`` (plain stores, any dtype)
==========================================  ================================================

ldmatrix addressing: lane ``8 * j + r`` gives the address of row ``r`` of matrix ``j``
(``&smem[index]``: 8 consecutive 16-bit elements, or 4 32-bit ones, 16 bytes, 16-byte aligned,
in shared memory);
``.x1`` uses lanes 0..7, ``.x2`` lanes 0..15 and ``.x4`` all 32 (the other lanes' addresses are
ignored). Register ``j`` of lane ``4 * g + t`` receives row ``g``, columns ``2t, 2t + 1`` of
matrix ``j`` (with ``.trans``: column ``g``, rows ``2t, 2t + 1``)::

    matrix j, 8 rows of 16 bytes        lane 4g+t, register j
    row r  <- address from lane 8j + r  (M[g, 2t], M[g, 2t+1])      no .trans
                                        (M[2t, g], M[2t+1, g])      .trans

So an A fragment of a row-major 16 x 16 tile at ``(r0, c0)`` is ``ldmatrix_x4(s, (r0 + lane %
16, c0 + 8 * (lane // 16)))``, and the B fragments of two n8 tiles of a row-major [k, n] tile
at ``(k0, n0)`` are ``ldmatrix_x4_trans(s, (k0 + lane % 8 + 8 * (lane // 8 % 2), n0 + 8 *
(lane // 16)))`` -> ``(b[0] of n0, b[1] of n0, b[0] of n0+8, b[1] of n0+8)``.

Every intrinsic is warp-wide and ``.aligned``: all 32 lanes of the warp must execute the same
call convergently (not under a condition some lanes take and others do not). The twins run as
warp collectives of :mod:`tessera_tile.sim` and raise :class:`tessera_tile.sim.SimulationError`
for a partial warp, exited lanes or a divergent call, and for an ldmatrix row address that is
not 16-byte aligned, out of bounds, or whose 16 bytes leave the shared array (a row may cross a
row end of the array: it is an address, as on the GPU). Shared-memory traffic
of ``ldmatrix`` is recorded per lane (one 16-byte row each), so the profiler counts its bank
conflicts as the hardware serves it: a quarter-warp (one 8 x 8 matrix) per 128-byte phase.

The simulated ``mma`` computes in float64 from the float16 inputs and rounds once to float32;
the tensor core keeps at least float32 precision in its sums, so results agree to float32
rounding of the accumulation (tests allow ``1e-6`` relative to the sum of absolute products).
The simulated TF32 ``mma`` multiplies the inputs' TF32 values: the tensor core reads only
the upper 19 bits of each 32-bit input (sign, 8 exponent bits, 10 mantissa bits) and ignores the
low 13, so a float32 that is not a TF32 value is truncated toward zero; the twin masks the low 13
bits the same way. Round first with ``to_tf32`` for round-to-nearest.

The TF32 twin sums as the hardware does, probed on an H200 (640 of 640 results matched): every
addend is aligned to the largest one's exponent (a product's taken as the sum of its operands'
exponents) and truncated toward zero to 2 bits below float32's last place there, the addends
are added exactly, and the sum is rounded toward zero. Subnormal addends were not probed. The
PTX ISA guarantees only "at least single precision" with order and rounding unspecified; the
tests check that bound on both tiers, and this model bit for bit.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import cuda, types
from numba.cuda.extending import intrinsic

from . import bfloat16, sim
from ._mma_twins import (
    ROW_BYTES,  # noqa: F401 - public constants of this module, re-exported
    TF32_MASK,  # noqa: F401
    _ldmatrix_twin,
    _load_f32x2_shared_twin,
    _mma_bf16_twin,
    _mma_tf32_twin,
    _mma_twin,
    _pack_twin,
    _pair_twin,
    _to_tf32_twin,
    _wgmma_commit_twin,
    _wgmma_descriptor_twin,
    _wgmma_fence_twin,
    _wgmma_wait_twin,
    wgmma_async_twin,
)
from ._mma_twins import SWIZZLE_32B as SWIZZLE_32B  # the wgmma helpers, re-exported
from ._mma_twins import SWIZZLE_64B as SWIZZLE_64B
from ._mma_twins import SWIZZLE_128B as SWIZZLE_128B
from ._mma_twins import SWIZZLE_NONE as SWIZZLE_NONE
from ._mma_twins import WGMMA_N as WGMMA_N
from ._mma_twins import MatrixDescriptor as MatrixDescriptor
from ._mma_twins import WgmmaAccumulator as WgmmaAccumulator
from ._mma_twins import WgmmaError as WgmmaError
from ._mma_twins import decode_descriptor as decode_descriptor
from ._mma_twins import encode_descriptor as encode_descriptor
from .intrinsics import (
    check_index,
    element_pointer,
    shared_address,
    target_compute_capability,
    void_asm,
)
from .sim.compat import NumbaTypeError

__all__ = [
    "fence_proxy_async",
    "ldmatrix_x1",
    "ldmatrix_x1_trans",
    "ldmatrix_x2",
    "ldmatrix_x2_trans",
    "ldmatrix_x4",
    "ldmatrix_x4_trans",
    "load_f32x2_shared",
    "mma_m16n8k16",
    "mma_m16n8k16_bf16",
    "mma_m16n8k8_tf32",
    "pack_f16x2",
    "store_accumulator",
    "store_bf16x2",
    "store_bf16x2_shared",
    "store_f16x2",
    "store_f16x2_shared",
    "store_f32x2",
    "to_tf32",
    "wgmma_async",
    "wgmma_async_bf16",
    "wgmma_commit_group",
    "wgmma_descriptor",
    "wgmma_fence",
    "wgmma_wait_group",
    "wgmma_zeros",
]

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
    twin_fn.__name__ = twin_fn.__qualname__ = f"{name}_twin"
    fn = sim.twin(twin_fn)(intrinsic(impl))
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


@sim.twin(_mma_twin)
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


@sim.twin(_mma_bf16_twin)
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


@sim.twin(_mma_tf32_twin)
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


@sim.twin(_load_f32x2_shared_twin)
@intrinsic
def load_f32x2_shared(typingctx, smem, index):
    """``load_f32x2_shared(smem, index) -> (x0, x1)``: ``smem[index]`` and the next float32 in
    one 8-byte shared load (``ld.shared.v2.f32``, ``LDS.64``); ``&smem[index]`` must be 8-byte
    aligned (the twin checks; the GPU faults). Two of them fill a TF32 fragment of 4
    consecutive registers without moves (the TF32 matmul's B tiles)."""
    name = "load_f32x2_shared"
    check_index(name, smem, index)
    if smem.dtype != types.float32:
        raise NumbaTypeError(f"{name} reads a float32 array, got {smem.dtype}")

    def codegen(context, builder, sig, args):
        ptr = element_pointer(context, builder, sig.args[0], args[0], sig.args[1], args[1])
        f32 = ir.FloatType()
        fnty = ir.FunctionType(ir.LiteralStructType([f32, f32]), [_I32])
        asm = ir.InlineAsm(fnty, "ld.shared.v2.f32 {$0, $1}, [$2];", "=f,=f,r,~{memory}",
                           side_effect=True)  # fmt: skip
        res = builder.call(asm, [shared_address(builder, ptr)])
        values = [builder.extract_value(res, i) for i in range(2)]
        return context.make_tuple(builder, sig.return_type, values)

    return types.UniTuple(types.float32, 2)(smem, types.unliteral(index)), codegen


@sim.twin(_to_tf32_twin)
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
    fn = sim.twin(twin)(intrinsic(impl))
    what = "float16" if kind == "f16" else "bfloat16 (into its uint16 bits)"
    fn.__doc__ = (
        f"``{impl.__name__}(out, index, x0, x1)``: ``out[index]``, the next element = ``x0``, "
        f"``x1`` rounded to {what}, in one 4-byte {space} store (``cvt.rn.{kind}x2.f32`` + "
        "``st.b32``). ``&out[index]`` must be 4-byte aligned (the twin checks)."
    )
    return fn


@sim.twin(_pack_twin)
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


@sim.twin(_pair_twin("store_f32x2", np.float32, "global"))
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
# --------------------------------------------------------------------------------------------

_I64 = ir.IntType(64)


def _require_sm90a(name: str) -> None:
    """Codegen: refuse a wgmma instruction for a target below sm_90 (where the target is known)
    with our message rather than ptxas's."""
    cc = target_compute_capability()
    if cc is not None and cc < (9, 0):
        raise NumbaTypeError(
            f"{name}: wgmma needs compute capability 9.0 (sm_90a: numba-cuda adds the 'a' on "
            f"9.0 and later); this compile targets sm_{cc[0]}{cc[1]}. Use mma_m16n8k16 there"
        )


@sim.twin(_wgmma_fence_twin)
@intrinsic
def wgmma_fence(typingctx):
    """``wgmma.fence.sync.aligned``: orders this warpgroup's register and shared-memory accesses
    before the ``wgmma_async`` that follow. Needed before the first ``wgmma_async`` and between
    a thread's access to registers (accumulators, A fragments) and a ``wgmma_async`` using
    them; chained ``wgmma_async`` of one shape on the same accumulators need none. A
    warpgroup-wide ``.aligned`` collective: all 128 threads of the warpgroup call it together."""

    def codegen(context, builder, sig, args):
        _require_sm90a("wgmma_fence")
        void_asm(builder, "wgmma.fence.sync.aligned;")
        return context.get_dummy_value()

    return types.void(), codegen


@sim.twin(_wgmma_commit_twin)
@intrinsic
def wgmma_commit_group(typingctx):
    """``wgmma.commit_group.sync.aligned``: the ``wgmma_async`` issued since the last commit
    become one group (an empty group when there are none). Warpgroup-wide, ``.aligned``."""

    def codegen(context, builder, sig, args):
        _require_sm90a("wgmma_commit_group")
        void_asm(builder, "wgmma.commit_group.sync.aligned;")
        return context.get_dummy_value()

    return types.void(), codegen


def _fence_proxy_async_twin():
    """The simulator has one view of shared memory (no proxies): nothing to order."""


@sim.twin(_fence_proxy_async_twin)
@intrinsic
def fence_proxy_async(typingctx):
    """``fence.proxy.async.shared::cta``: orders this thread's earlier generic-proxy accesses
    to shared memory (stores, and the ``cp.async`` copies it has waited for) before later
    async-proxy accesses, such as the operand reads of a ``wgmma_async`` (PTX ISA: "An async
    proxy fence must be used to establish an ordering between prior writes to shared memory
    matrices and subsequent reads of the same matrices in a wgmma.mma_async instruction").
    Per thread; put it between the writes (or their ``cp_async_wait_group``) and the barrier
    that publishes them to the warpgroups, or, where another warpgroup wrote them and an
    ``mbarrier`` hands them over, in the reading thread after its wait (which acquired them).
    sm_90 and later; the simulator has one view of shared memory, and its twin does nothing."""

    def codegen(context, builder, sig, args):
        _require_sm90a("fence_proxy_async")
        void_asm(builder, "fence.proxy.async.shared::cta;")
        return context.get_dummy_value()

    return types.void(), codegen


def _f32_tuple(name: str, what: str, tup) -> int:
    if not isinstance(tup, types.BaseTuple) or not all(isinstance(t, types.Number) for t in tup):
        raise NumbaTypeError(f"{name}: {what} must be a tuple of float32, got {tup}")
    return len(tup)


def _tied_asm(builder, context, asm: str, values, extra_types, extra_constraints, extra_values):
    """Call ``asm`` whose first ``len(values)`` operands are float32 registers read and written
    (outputs tied to inputs), followed by ``extra`` inputs; returns the float32 outputs."""
    f32 = ir.FloatType()
    count = len(values)
    constraints = ",".join(
        ["=f"] * count + [str(i) for i in range(count)] + list(extra_constraints) + ["~{memory}"]
    )
    fnty = ir.FunctionType(
        ir.LiteralStructType([f32] * count) if count > 1 else f32, [f32] * count + extra_types
    )
    res = builder.call(
        ir.InlineAsm(fnty, asm, constraints, side_effect=True), [*values, *extra_values]
    )
    return [builder.extract_value(res, i) for i in range(count)] if count > 1 else [res]


@sim.twin(_wgmma_wait_twin)
@intrinsic  # tried with a literal n after the non-literal typing fails
def wgmma_wait_group(typingctx, n, acc):
    """``wgmma_wait_group(n, acc) -> acc``: ``wgmma.wait_group.sync.aligned n``: waits until at
    most ``n`` (a constant, 0..7) committed groups of this warpgroup's ``wgmma_async`` are in
    flight, and returns ``acc`` (a tuple of float32, the accumulators of an MMA of a retired
    group), now safe to read. Passing the accumulators through ties their reads to the wait:
    the compiler cannot move them above it. Warpgroup-wide, ``.aligned``."""
    name = "wgmma_wait_group"
    if not isinstance(n, types.IntegerLiteral):
        raise NumbaTypeError(f"{name} needs a compile-time constant n, got {n}")
    pending = n.literal_value
    if not 0 <= pending <= 7:
        raise NumbaTypeError(f"{name}: n must be in 0..7, got {pending}")
    count = _f32_tuple(name, "acc", acc)
    if count == 0:
        raise NumbaTypeError(f"{name}: acc holds no registers")

    def codegen(context, builder, sig, args):
        _require_sm90a(name)
        tup_t = sig.args[1]
        values = [
            context.cast(builder, builder.extract_value(args[1], i), t, types.float32)
            for i, t in enumerate(tup_t)
        ]
        out = _tied_asm(
            builder, context, f"wgmma.wait_group.sync.aligned {pending};", values, [], [], []
        )
        return context.make_tuple(builder, sig.return_type, out)

    return types.UniTuple(types.float32, count)(n, acc), codegen


def _literal_flag(name: str, what: str, value, allowed: tuple[int, ...]) -> int:
    if not isinstance(value, types.IntegerLiteral | types.BooleanLiteral):
        raise NumbaTypeError(f"{name}: {what} must be a compile-time constant, got {value}")
    v = int(value.literal_value)
    if v not in allowed:
        raise NumbaTypeError(f"{name}: {what} must be one of {allowed}, got {v}")
    return v


def _make_wgmma(kind: str):
    name = "wgmma_async" if kind == "f16" else "wgmma_async_bf16"

    def impl(typingctx, a, b_desc, acc, scale_d, scale_a, scale_b, trans_a, trans_b):
        flags = [
            _literal_flag(name, what, value, allowed)
            for what, value, allowed in (
                ("scale_a", scale_a, (1, -1)),
                ("scale_b", scale_b, (1, -1)),
                ("trans_a", trans_a, (0, 1)),
                ("trans_b", trans_b, (0, 1)),
            )
        ]
        sa, sb, ta, tb = flags
        count = _f32_tuple(name, "acc", acc)
        if 2 * count not in WGMMA_N:
            raise NumbaTypeError(
                f"{name}: acc holds {count} float32: m64nNk16 takes N / 2 with N in 8..256, a "
                "multiple of 8"
            )
        from_registers = isinstance(a, types.BaseTuple)
        if from_registers:
            _registers("a", a, 4, types.Integer, name)
            if ta:
                raise NumbaTypeError(f"{name}: A from registers cannot be transposed (trans_a=0)")
        elif not (isinstance(a, types.Integer) and a.bitwidth == 64):
            raise NumbaTypeError(f"{name}: a is a 64-bit descriptor or 4 uint32, got {a}")
        if not (isinstance(b_desc, types.Integer) and b_desc.bitwidth == 64):
            raise NumbaTypeError(f"{name}: b_desc must be a 64-bit descriptor, got {b_desc}")
        if not isinstance(scale_d, types.Integer | types.Boolean):
            raise NumbaTypeError(f"{name}: scale_d must be an integer or a bool, got {scale_d}")
        n = 2 * count
        d = ", ".join(f"${i}" for i in range(count))
        first = 2 * count  # operands after the outputs and the tied inputs
        if from_registers:
            a_ops = "{" + ", ".join(f"${first + i}" for i in range(4)) + "}"
            b_op, s_op = first + 4, first + 5
            imm = f"{sa}, {sb}, {tb}"
        else:
            a_ops = f"${first}"
            b_op, s_op = first + 1, first + 2
            imm = f"{sa}, {sb}, {ta}, {tb}"
        asm = (
            "{ .reg .pred p; "
            f"setp.ne.b32 p, ${s_op}, 0; "
            f"wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{kind}.{kind} "
            f"{{{d}}}, {a_ops}, ${b_op}, p, {imm}; }}"
        )

        def codegen(context, builder, sig, args):
            _require_sm90a(name)
            acc_t = sig.args[2]
            values = [
                context.cast(builder, builder.extract_value(args[2], i), t, types.float32)
                for i, t in enumerate(acc_t)
            ]
            if from_registers:
                a_vals = [
                    context.cast(builder, builder.extract_value(args[0], i), t, types.uint32)
                    for i, t in enumerate(sig.args[0])
                ]
                a_types, a_cons = [_I32] * 4, ["r"] * 4
            else:
                a_vals = [context.cast(builder, args[0], sig.args[0], types.uint64)]
                a_types, a_cons = [_I64], ["l"]
            b_val = context.cast(builder, args[1], sig.args[1], types.uint64)
            s_val = context.cast(builder, args[3], sig.args[3], types.int32)
            out = _tied_asm(
                builder,
                context,
                asm,
                values,
                [*a_types, _I64, _I32],
                [*a_cons, "l", "r"],
                [*a_vals, b_val, s_val],
            )
            return context.make_tuple(builder, sig.return_type, out)

        args = (a, b_desc, acc, types.unliteral(scale_d), scale_a, scale_b, trans_a, trans_b)
        return types.UniTuple(types.float32, count)(*args), codegen

    impl.__name__ = impl.__qualname__ = name
    fn = sim.twin(wgmma_async_twin(kind == "bf16"))(intrinsic(impl))
    what = "float16" if kind == "f16" else "bfloat16"
    fn.__doc__ = (
        f"``{name}(a, b_desc, acc, scale_d, scale_a, scale_b, trans_a, trans_b) -> d``: "
        f"``wgmma.mma_async.sync.aligned.m64nNk16.f32.{kind}.{kind}``, ``D = A @ B + D`` on a "
        f"warpgroup's tensor cores, {what} inputs, float32 accumulators; N = 2 * len(acc).\n\n"
        "``a``: a 64-bit descriptor of the 64 x 16 A tile in shared memory, or this thread's 4 "
        "uint32 A registers (the mma.m16n8k16 A fragment of its warp's 16 rows); ``b_desc``: "
        "the descriptor of the 16 x N B tile (:func:`wgmma_descriptor`); ``acc``: N / 2 float32 "
        "(the accumulator layout of the docs); ``scale_d``: 0 computes ``A @ B`` (``acc`` "
        "ignored), else ``A @ B + acc``; ``scale_a``, ``scale_b``: constants 1 or -1 (negate "
        "A or B); ``trans_a``, ``trans_b``: constants 0 (K-major in shared memory) or 1 (M- or "
        "N-major; A from registers takes 0). The operands in PTX order. The result is in "
        "flight: read it only after ``wgmma_commit_group`` and a ``wgmma_wait_group`` that "
        "retires it. Warpgroup-wide, ``.aligned``; descriptors and ``scale_d`` the same in all "
        "128 threads."
    )
    return fn


wgmma_async = _make_wgmma("f16")
wgmma_async_bf16 = _make_wgmma("bf16")


@sim.twin(_wgmma_descriptor_twin)
@intrinsic
def wgmma_descriptor(typingctx, smem, index, leading_byte_offset, stride_byte_offset, swizzle):
    """``wgmma_descriptor(smem, index, lbo, sbo, swizzle) -> uint64``: the matrix descriptor of
    the shared-memory tile starting at ``smem[index]`` (16-byte aligned): start address, leading
    and stride byte offsets (multiples of 16, as the canonical layouts of the docs define them)
    and swizzle mode (``SWIZZLE_NONE``, ``SWIZZLE_128B``, ``SWIZZLE_64B``, ``SWIZZLE_32B``);
    base offset 0. A few integer instructions (``cvta`` to the shared window, shifts, ors):
    a kernel makes one per k-step (the start address moves, the offsets stay)."""
    name = "wgmma_descriptor"
    check_index(name, smem, index)
    if smem.dtype.bitwidth != 16:
        raise NumbaTypeError(f"{name}: wgmma reads 16-bit elements here, got {smem.dtype}")
    for what, v in (
        ("lbo", leading_byte_offset),
        ("sbo", stride_byte_offset),
        ("swizzle", swizzle),
    ):
        if not isinstance(v, types.Integer):
            raise NumbaTypeError(f"{name}: {what} must be an integer, got {v}")

    def codegen(context, builder, sig, args):
        ptr = element_pointer(context, builder, sig.args[0], args[0], sig.args[1], args[1])
        addr = builder.zext(shared_address(builder, ptr), _I64)

        def field(value, ty):
            v = context.cast(builder, value, ty, types.uint64)
            return builder.lshr(builder.and_(v, ir.Constant(_I64, 0x3FFFF)), ir.Constant(_I64, 4))

        start = field(addr, types.uint64)
        lbo = builder.shl(field(args[2], sig.args[2]), ir.Constant(_I64, 16))
        sbo = builder.shl(field(args[3], sig.args[3]), ir.Constant(_I64, 32))
        mode = context.cast(builder, args[4], sig.args[4], types.uint64)
        mode = builder.shl(builder.and_(mode, ir.Constant(_I64, 3)), ir.Constant(_I64, 62))
        return builder.or_(builder.or_(start, lbo), builder.or_(sbo, mode))

    args = (smem, types.unliteral(index), types.unliteral(leading_byte_offset),
            types.unliteral(stride_byte_offset), types.unliteral(swizzle))  # fmt: skip
    return types.uint64(*args), codegen


def _wgmma_zeros_twin(n):
    if int(n) not in WGMMA_N:
        raise WgmmaError(f"wgmma_zeros: N must be a multiple of 8 in 8..256, got {n}")
    return (np.float32(0),) * (int(n) // 2)


@sim.twin(_wgmma_zeros_twin)
@intrinsic  # tried with a literal n after the non-literal typing fails
def wgmma_zeros(typingctx, n):
    """``wgmma_zeros(N)``: the N / 2 float32 zeros of an m64nNk16 accumulator (``N`` a
    constant): Numba has no tuple repetition (``(z,) * 64``)."""
    if not isinstance(n, types.IntegerLiteral):
        raise NumbaTypeError(f"wgmma_zeros needs a compile-time constant N, got {n}")
    size = n.literal_value
    if size not in WGMMA_N:
        raise NumbaTypeError(f"wgmma_zeros: N must be a multiple of 8 in 8..256, got {size}")
    result = types.UniTuple(types.float32, size // 2)

    def codegen(context, builder, sig, args):
        zero = context.get_constant(types.float32, 0.0)
        return context.make_tuple(builder, result, [zero] * (size // 2))

    return result(n), codegen
