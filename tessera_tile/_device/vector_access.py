"""16-byte vector accesses as inline PTX, each with its simulator twin: :func:`load16` /
:func:`store16` on global memory (``LDG.E.128`` / ``STG.E.128``), :func:`load16_shared` /
:func:`store16_shared` on shared memory (``LDS.128`` / ``STS.128``) and :func:`aligned16`, the
alignment test that guards them. Public through :mod:`tessera_tile.memory`, whose stagers use
them.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import types
from numba.cuda.extending import intrinsic

from .._runtime import config as _config
from .._runtime.target import VECTOR_BYTES
from . import twins
from .intrinsics import check_index, element_pointer

if _config.SIMULATED:  # what the twins below use, run in the simulator only
    from .. import sim

# -------------------------------------------------------------------------------------------
# 16-byte vector intrinsics (inline PTX) and their simulator twins
# -------------------------------------------------------------------------------------------


def _vector_dtype(array):
    if not isinstance(array, types.Array):
        raise TypeError(f"expected an array, got {array}")
    dt = array.dtype
    if not isinstance(dt, types.Integer | types.Float) or dt.bitwidth not in (16, 32, 64):
        raise TypeError(f"16-byte vector access needs 16/32/64-bit elements, got {dt}")
    return dt


def _words(dtype):
    """(PTX word type, words per 16 bytes, LLVM word type, elements per word)."""
    if dtype.bitwidth == 64:
        return "b64", 2, ir.IntType(64), 1
    return "b32", 4, ir.IntType(32), 32 // dtype.bitwidth


def _address(space: str, operand: str) -> tuple[str, str]:
    """PTX that turns the generic pointer ``operand`` into an address of ``space``."""
    if space == "global":
        return "", operand
    return f".reg .u64 a; cvta.to.shared.u64 a, {operand}; ", "a"


def _make_load(space: str):
    @intrinsic
    def vector_load(typingctx, array, index):
        dt = _vector_dtype(array)
        check_index("16-byte vector access", array, index)
        n = VECTOR_BYTES * 8 // dt.bitwidth

        def codegen(context, builder, sig, args):
            array_type, index_type = sig.args
            ptr = element_pointer(context, builder, array_type, args[0], index_type, args[1])
            word, nwords, wty, per_word = _words(array_type.dtype)
            prelude, addr = _address(space, f"${nwords}")
            outs = ", ".join(f"${i}" for i in range(nwords))
            cons = ",".join(["=" + ("l" if word == "b64" else "r")] * nwords) + ",l,~{memory}"
            asm = f"{{ {prelude}ld.{space}.v{nwords}.{word} {{{outs}}}, [{addr}]; }}"
            fnty = ir.FunctionType(ir.LiteralStructType([wty] * nwords), [ptr.type])
            res = builder.call(ir.InlineAsm(fnty, asm, cons, side_effect=True), [ptr])
            ety = context.get_value_type(array_type.dtype)
            values = []
            for w in range(nwords):
                bits = builder.extract_value(res, w)
                if per_word == 1:
                    values.append(builder.bitcast(bits, ety))
                else:
                    vec = builder.bitcast(bits, ir.VectorType(ety, per_word))
                    values.extend(
                        builder.extract_element(vec, ir.Constant(ir.IntType(32), k))
                        for k in range(per_word)
                    )
            return context.make_tuple(builder, sig.return_type, values)

        return types.UniTuple(dt, n)(array, index), codegen

    return vector_load


def _make_store(space: str):
    @intrinsic
    def vector_store(typingctx, array, index, values):
        dt = _vector_dtype(array)
        check_index("16-byte vector access", array, index)
        n = VECTOR_BYTES * 8 // dt.bitwidth
        if not isinstance(values, types.BaseTuple) or len(values) != n:
            raise TypeError(f"store of {dt} needs a tuple of {n} values, got {values}")

        def codegen(context, builder, sig, args):
            array_type, index_type, values_type = sig.args
            ptr = element_pointer(context, builder, array_type, args[0], index_type, args[1])
            word, nwords, wty, per_word = _words(array_type.dtype)
            ety = context.get_value_type(array_type.dtype)
            items = [
                context.cast(builder, builder.extract_value(args[2], i), t, array_type.dtype)
                for i, t in enumerate(values_type)
            ]
            words = []
            for w in range(nwords):
                if per_word == 1:
                    words.append(builder.bitcast(items[w], wty))
                else:
                    vec = ir.Constant(ir.VectorType(ety, per_word), ir.Undefined)
                    for k in range(per_word):
                        vec = builder.insert_element(
                            vec, items[w * per_word + k], ir.Constant(ir.IntType(32), k)
                        )
                    words.append(builder.bitcast(vec, wty))
            prelude, addr = _address(space, "$0")
            ins = ", ".join(f"${i + 1}" for i in range(nwords))
            cons = "l," + ",".join([("l" if word == "b64" else "r")] * nwords) + ",~{memory}"
            asm = f"{{ {prelude}st.{space}.v{nwords}.{word} [{addr}], {{{ins}}}; }}"
            fnty = ir.FunctionType(ir.VoidType(), [ptr.type] + [wty] * nwords)
            builder.call(ir.InlineAsm(fnty, asm, cons, side_effect=True), [ptr, *words])
            return context.get_dummy_value()

        return types.void(array, index, values), codegen

    return vector_store


def _vector_index(array, index, what: str):
    """The slice of the 16-byte vector at ``array[index]``; faults like the GPU would."""
    idx = tuple(int(i) for i in index) if isinstance(index, tuple) else (int(index),)
    n = VECTOR_BYTES // array.itemsize
    if sim.element_address(array, idx) % VECTOR_BYTES:
        raise sim.SimulationError(
            f"{what}: misaligned address: index {idx} is not 16-byte aligned (the GPU faults)"
        )
    if array.strides[-1] != array.itemsize:
        raise sim.SimulationError(
            f"{what}: the last axis is not contiguous (a vector access reads 16 consecutive bytes)"
        )
    return (*idx[:-1], slice(idx[-1], idx[-1] + n)), n


def _load16_twin(array, index):
    sl, n = _vector_index(array, index, "16-byte vector load")
    values = sim.load(array, sl)
    if values is None or len(values) != n:
        return tuple(array.dtype.type(0) for _ in range(n))
    return tuple(values)


def _store16_twin(array, index, values):
    sl, n = _vector_index(array, index, "16-byte vector store")
    sim.store(array, sl, np.array(values, dtype=array.dtype))


def _aligned16_twin(array, index):
    return sim.element_address(array, index) % VECTOR_BYTES == 0


load16 = twins.twin(_load16_twin)(_make_load("global"))
load16.__doc__ = """``load16(array, index) -> tuple``: one 16-byte global load (``LDG.E.128``).

Returns the 16 bytes at the address of ``array[index]`` as ``16 // itemsize`` elements (4
float32/int32, 8 float16, 2 float64): the last axis must be contiguous, the address 16-byte
aligned (check with :func:`aligned16`) and the bytes inside the array's allocation (they may
cross a row end: the next row's first elements). On the GPU a misaligned address faults
(the launch fails) and nothing else is checked; the simulator twin raises
:class:`tessera_tile.sim.SimulationError` for a misaligned address or a non-contiguous last axis.
"""
store16 = twins.twin(_store16_twin)(_make_store("global"))
store16.__doc__ = """``store16(array, index, values)``: one 16-byte global store (``STG.E.128``).

``values`` is a tuple of ``16 // itemsize`` elements; same conditions as :func:`load16`.
"""
load16_shared = twins.twin(_load16_twin)(_make_load("shared"))
load16_shared.__doc__ = "Like :func:`load16` for a shared array (``LDS.128``)."
store16_shared = twins.twin(_store16_twin)(_make_store("shared"))
store16_shared.__doc__ = "Like :func:`store16` for a shared array (``STS.128``)."


@intrinsic
def _aligned16_intrinsic(typingctx, array, index):
    if not isinstance(array, types.Array):
        raise TypeError(f"expected an array, got {array}")
    check_index("16-byte vector access", array, index)

    def codegen(context, builder, sig, args):
        array_type, index_type = sig.args
        ptr = element_pointer(context, builder, array_type, args[0], index_type, args[1])
        addr = builder.ptrtoint(ptr, ir.IntType(64))
        low = builder.and_(addr, ir.Constant(ir.IntType(64), VECTOR_BYTES - 1))
        return builder.icmp_unsigned("==", low, ir.Constant(ir.IntType(64), 0))

    return types.boolean(array, index), codegen


aligned16 = twins.twin(_aligned16_twin)(_aligned16_intrinsic)
aligned16.__doc__ = "``aligned16(array, index) -> bool``: is ``&array[index]`` 16-byte aligned?"
