"""``carve``: a C-contiguous n-d view of a 1-D (dynamic shared) array, from an element offset.

numba-cuda's ``reshape`` calls a host helper that does not link on the GPU, and dynamic shared
memory is one 1-D array: this builds the view's array structure in place (no copy, no call).
Public through :mod:`tessera_tile.memory`.
"""

from __future__ import annotations

from numba import types
from numba.core import cgutils
from numba.cuda.extending import intrinsic

from .._runtime import config as _config
from . import twins
from .intrinsics import integer_count

if _config.SIMULATED:  # what the twins below use, run in the simulator only
    from .. import sim


@intrinsic
def _carve_intrinsic(typingctx, base, offset, shape):
    if not (isinstance(base, types.Array) and base.ndim == 1 and base.layout == "C"):
        raise TypeError(f"carve cuts a 1-D C-contiguous array, got {base}")
    if not isinstance(offset, types.Integer):
        raise TypeError(f"carve's offset must be an integer, got {offset}")
    ndim = integer_count(shape)
    if ndim is None:
        raise TypeError(f"carve's shape must be an integer or a tuple of integers, got {shape}")
    result = types.Array(base.dtype, ndim, "C")

    def codegen(context, builder, sig, args):
        base_type, offset_type, shape_type = sig.args
        intp = context.get_value_type(types.intp)
        src = context.make_array(base_type)(context, builder, value=args[0])
        at = context.cast(builder, args[1], offset_type, types.intp)
        if isinstance(shape_type, types.BaseTuple):
            dims = [
                context.cast(builder, builder.extract_value(args[2], i), t, types.intp)
                for i, t in enumerate(shape_type)
            ]
        else:
            dims = [context.cast(builder, args[2], shape_type, types.intp)]
        strides = [src.itemsize]  # C order: the last axis moves by one element
        for n in reversed(dims[1:]):
            strides.insert(0, builder.mul(strides[0], n))
        out = context.make_array(sig.return_type)(context, builder)
        context.populate_array(
            out,
            data=builder.gep(src.data, [at]),
            shape=cgutils.pack_array(builder, dims, intp),
            strides=cgutils.pack_array(builder, strides, intp),
            itemsize=src.itemsize,
            meminfo=None,
        )
        return out._getvalue()

    return result(base, offset, shape), codegen


def _carve_twin(base, offset, shape):
    return sim.carved(base, offset, shape if isinstance(shape, tuple) else (shape,))


carve = twins.twin(_carve_twin)(_carve_intrinsic)
carve.__doc__ = """``carve(base, offset, shape) -> array``: the C-contiguous ``shape`` view of the
1-D C-contiguous ``base`` from element ``offset``, without a copy (``shape`` an integer or a tuple
of integers, constant or run-time).

Made for dynamic shared memory, which is one 1-D array: carve it into the tiles a kernel needs::

    smem = cuda.shared.array(0, float32)
    q = carve(smem, 0, (64, 128))          # 32 KiB
    k = carve(smem, 64 * 128, (32, 132))   # a padded tile after it

Nothing is checked on the GPU (a view past the end reads and writes other memory); the simulator
twin raises :class:`tessera_tile.sim.SimulationError` for a view that leaves ``base``.
"""
