"""The simulator's ``math`` (``tessera_tile.sim.cuda_math``) gives every call the type
numba-cuda gives it, and refuses what numba-cuda refuses: checked against numba-cuda's own typing
context, which the simulator cannot load (so this runs in the compile tier)."""

import itertools
import math

import pytest
import typing_kernels
from numba import cuda
from numba.core.errors import TypingError
from numba.cuda import types
from numba.cuda.descriptor import cuda_target
from numba.cuda.utils import numba_target_override

from tessera_tile._runtime import compat
from tessera_tile.sim import cuda_math

ARG_TYPES = (
    types.float16, types.float32, types.float64, types.boolean, types.int8, types.uint8,
    types.int16, types.uint16, types.int32, types.uint32, types.int64, types.uint64,
)  # fmt: skip


@pytest.fixture(scope="module")
def typing_context():
    context = cuda_target.typing_context
    context.refresh()
    return context


def numba_cuda_type(context, fn, arg_types):
    """The return type numba-cuda gives ``fn(*arg_types)`` when it compiles a kernel (the CUDA
    target, whose float16 overloads compile for the current device: answered for one), or None
    if it refuses."""
    try:
        with compat.current_device_answered((8, 0)), numba_target_override():
            fn_type = context.resolve_value_type(fn)
            signature = context.resolve_function_type(fn_type, arg_types, {})
    except (ValueError, compat.NumbaTypeError.__mro__[1]):  # no type, or a TypingError
        return None
    return None if signature is None else signature.return_type


@pytest.mark.parametrize("name", sorted(cuda_math.SUPPORTED))
def test_result_types_match_numba_cuda(typing_context, name):
    arity = len(cuda_math.SUPPORTED[name][0].args)
    differ = []
    for arg_types in itertools.product(ARG_TYPES, repeat=arity):
        expected = numba_cuda_type(typing_context, getattr(math, name), arg_types)
        got = cuda_math.numba_result_type(name, arg_types)
        if got != expected:
            differ.append((arg_types, got, expected))
    assert not differ, f"math.{name}: (arguments, simulator, numba-cuda) {differ[:5]}"


def test_every_other_math_function_is_refused_by_numba_cuda(typing_context):
    others = [n for n in dir(math) if callable(getattr(math, n)) and not n.startswith("_")]
    others = [n for n in others if n not in cuda_math.SUPPORTED]
    assert others, "Python's math has functions numba-cuda does not type"
    accepted = [
        (name, arg_types)
        for name in others
        for arg_types in ((types.float64,), (types.float64,) * 2, (types.int64,) * 2)
        if numba_cuda_type(typing_context, getattr(math, name), arg_types) is not None
    ]
    assert not accepted, f"numba-cuda types these, the simulator refuses them: {accepted}"


@pytest.mark.parametrize(("fn", "typed"), typing_kernels.SHAPES, ids=typing_kernels.SHAPE_IDS)
def test_array_shapes_as_numba_types_them(fn, typed):
    """The ground truth of the simulator's test_array_shapes_numba_cannot_type_are_refused:
    numba-cuda itself types these shapes or refuses them."""
    if typed:
        cuda.compile_ptx(fn, typing_kernels.SIGNATURE, cc=(8, 0))
    else:
        with pytest.raises(TypingError):
            cuda.compile_ptx(fn, typing_kernels.SIGNATURE, cc=(8, 0))


TWO_ARRAYS = "void(float32[::1], float32[::1])"


def test_star_args_kernels_are_refused():
    """The ground truth of the simulator's test_a_kernel_taking_star_args_is_refused."""
    with pytest.raises(TypeError, match="Signature mismatch: 2 argument types given"):
        cuda.compile_ptx(typing_kernels.star_args_kernel, TWO_ARRAYS, cc=(8, 0))


def test_reshape_in_a_kernel_needs_a_contiguous_array():
    """The ground truth of the simulator's reshape test: layout C compiles, layout A does not."""
    cuda.compile_ptx(typing_kernels.reshape_kernel, TWO_ARRAYS, cc=(8, 0))
    with pytest.raises(TypingError, match="reshape\\(\\) supports contiguous array only"):
        cuda.compile_ptx(typing_kernels.reshape_kernel, "void(float32[:], float32[::1])", cc=(8, 0))
