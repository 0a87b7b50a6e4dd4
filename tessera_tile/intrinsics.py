"""Plumbing shared by the inline-PTX intrinsics of :mod:`memory` and :mod:`pipeline`."""

from numba.core import types
from numba.cuda import cgutils
from numba.cuda.api_util import normalize_indices
from numba.cuda.core.errors import NumbaTypeError


def check_index(name: str, array, index) -> None:
    """Typing: ``array[index]`` names one element (one integer per dimension)."""
    if not isinstance(array, types.Array):
        raise NumbaTypeError(f"{name} takes an array, got {array}")
    if isinstance(index, types.Integer):
        count = 1
    elif isinstance(index, types.BaseTuple) and all(isinstance(t, types.Integer) for t in index):
        count = len(index)
    else:
        raise NumbaTypeError(f"{name}: {index} is not an integer or a tuple of integers")
    if count != array.ndim:
        raise NumbaTypeError(f"{name}: {count} indices for a {array.ndim}-d array")


def element_pointer(context, builder, array_type, array, index_type, index):
    """Codegen: the generic pointer to ``array[index]`` (no wraparound, no bounds check)."""
    index_type, indices = normalize_indices(
        context, builder, index_type, index, array_type, array_type.dtype
    )
    struct = context.make_array(array_type)(context, builder, value=array)
    return cgutils.get_item_pointer(context, builder, array_type, struct, indices)
