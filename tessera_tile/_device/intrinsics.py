"""Device plumbing shared by :mod:`memory`, :mod:`pipeline` and :mod:`warp`: the thread's rank
in its block, and the typing and pointer helpers of the inline-PTX intrinsics."""

from llvmlite import ir
from numba import cuda
from numba.core import types

from .._runtime.compat import NumbaTypeError, cgutils, normalize_indices


@cuda.jit(device=True)
def thread_rank():
    """``(rank, block size)``: this thread's linear rank ``x + X*(y + Y*z)`` in its block.

    The order in which the hardware forms warps (rank // 32 is the warp), for any block shape.
    """
    t = cuda.threadIdx
    d = cuda.blockDim
    return t.x + d.x * (t.y + d.y * t.z), d.x * d.y * d.z


def integer_count(value) -> int | None:
    """Typing: how many integers ``value`` holds (an integer, or a tuple of integers); None
    for any other type."""
    if isinstance(value, types.Integer):
        return 1
    if isinstance(value, types.BaseTuple) and all(isinstance(t, types.Integer) for t in value):
        return len(value)
    return None


def check_index(name: str, array, index) -> None:
    """Typing: ``array[index]`` names one element (one integer per dimension)."""
    if not isinstance(array, types.Array):
        raise NumbaTypeError(f"{name} takes an array, got {array}")
    count = integer_count(index)
    if count is None:
        raise NumbaTypeError(f"{name}: {index} is not an integer or a tuple of integers")
    if count != array.ndim:
        raise NumbaTypeError(f"{name}: {count} indices for a {array.ndim}-d array")


def shared_address(builder, ptr):
    """Codegen: a generic pointer into shared memory as the 32-bit shared-window address
    (cvta.to.shared) that PTX's ``[r]`` operand wants."""
    byte = ir.IntType(8)
    shared = builder.addrspacecast(builder.bitcast(ptr, byte.as_pointer()), byte.as_pointer(3))
    return builder.ptrtoint(shared, ir.IntType(32))


def void_asm(builder, text: str, operands=(), constraints: str = "~{memory}") -> None:
    """Codegen: the side-effecting inline PTX ``text`` with no result."""
    fnty = ir.FunctionType(ir.VoidType(), [op.type for op in operands])
    builder.call(ir.InlineAsm(fnty, text, constraints, side_effect=True), list(operands))


def element_pointer(context, builder, array_type, array, index_type, index):
    """Codegen: the generic pointer to ``array[index]`` (no wraparound, no bounds check)."""
    index_type, indices = normalize_indices(
        context, builder, index_type, index, array_type, array_type.dtype
    )
    struct = context.make_array(array_type)(context, builder, value=array)
    return cgutils.get_item_pointer(context, builder, array_type, struct, indices)


def target_compute_capability() -> tuple[int, int] | None:
    """Codegen: the compute capability numba-cuda compiles for, where it can be known: the
    current GPU, or the target of an offline compile made inside
    ``_runtime.compat.current_device_answered``; ``None`` where neither answers (no GPU, and
    ``cuda.compile_ptx`` called directly)."""
    import numba.cuda.dispatcher as dispatcher

    try:
        cc = dispatcher.get_current_device().compute_capability
    except Exception:  # no driver, no device: the target is not known here
        return None
    return int(cc[0]), int(cc[1])
