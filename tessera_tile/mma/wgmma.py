"""Hopper's warpgroup MMA (sm_90a): fence, ``wgmma.mma_async`` with matrix descriptors, commit
and wait; see the "Warpgroup MMA" section of docs/tensor_cores.md."""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import types
from numba.cuda.extending import intrinsic

from .._device import twins
from .._device.intrinsics import (
    check_index,
    element_pointer,
    shared_address,
    target_compute_capability,
    void_asm,
)
from .._device.mma_layouts import WGMMA_N
from .._runtime import config as _config
from .._runtime.compat import NumbaTypeError
from .sync import _I32, _registers

if _config.SIMULATED:  # the twins, the simulator's (not imported outside it)
    from ..sim.wgmma_twins import (
        WgmmaError,
        _wgmma_commit_twin,
        _wgmma_descriptor_twin,
        _wgmma_fence_twin,
        _wgmma_wait_twin,
        wgmma_async_twin,
    )
else:
    _wgmma_commit_twin = _wgmma_descriptor_twin = _wgmma_fence_twin = _wgmma_wait_twin = None
    wgmma_async_twin = twins.absent

# --------------------------------------------------------------------------------------------

_I64 = ir.IntType(64)


def _require_sm90a(name: str) -> None:
    """Codegen: refuse a wgmma instruction for a target other than sm_90a (where the target is
    known; Blackwell's sm_100a has no wgmma) with our message rather than ptxas's."""
    cc = target_compute_capability()
    if cc is not None and tuple(cc[:2]) != (9, 0):
        raise NumbaTypeError(
            f"{name}: wgmma needs compute capability 9.0 (sm_90a: numba-cuda adds the 'a' on "
            f"9.0 and later); this compile targets sm_{cc[0]}{cc[1]}. Use mma_m16n8k16 there"
        )


@twins.twin(_wgmma_fence_twin)
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


@twins.twin(_wgmma_commit_twin)
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


@twins.twin(_fence_proxy_async_twin)
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


@twins.twin(_wgmma_wait_twin)
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
    fn = twins.twin(wgmma_async_twin(kind == "bf16"))(intrinsic(impl))
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


@twins.twin(_wgmma_descriptor_twin)
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


@twins.twin(_wgmma_zeros_twin)
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
