"""Where tessera_tile's simulator had departed from numba-cuda (issue 20, found by running
numba-cuda's own tests under both simulators): explicit signatures, kernel exceptions,
``debug=True`` and ``alignment=``. numba-cuda and the PTX ISA are the reference."""

import struct

import numpy as np
import pytest
import typing_kernels
from helpers import SIMULATED
from numba import cuda
from numba.cuda.core.errors import NumbaTypeError, RequireLiteralValue

import tessera_tile  # noqa: F401 - importing it installs the warp-aware simulator
from tessera_tile.memory import store16_shared
from tessera_tile.sim import SimulationError

pytestmark = pytest.mark.sim_only(reason="the simulator's launch path against numba-cuda's")
if not SIMULATED:  # the device function below compiles at import on a GPU
    pytest.skip("the simulator's launch path against numba-cuda's", allow_module_level=True)


def bit_ops(out, value):
    out[0] = cuda.clz(value)
    out[1] = cuda.brev(value)
    out[2] = cuda.popc(value)
    out[3] = cuda.ffs(value)


def _reverse(bits: int, width: int) -> int:
    return int(f"{bits:0{width}b}"[::-1], 2)


@pytest.mark.parametrize(
    ("signature", "width"),
    [("void(uint64[:], int32)", 32), ("void(uint64[:], uint32)", 32), (None, 64)],
)
@pytest.mark.parametrize("value", [0x00100000, 0x000030F0, 1, 0, -1])
def test_an_explicit_signature_types_integer_scalars(signature, width, value):
    # A GPU converts a scalar argument to the type the signature declares (wrapping, as a C
    # cast); without one, Numba types a Python int as int64. The bit intrinsics work on the
    # operand's width: clz(int32 0x00100000) is 11, clz(int64 0x00100000) is 43.
    kernel = cuda.jit(signature)(bit_ops) if signature else cuda.jit(bit_ops)
    out = np.zeros(4, np.uint64)
    kernel[1, 1](out, value)
    bits = value & ((1 << width) - 1)
    lowest = (bits & -bits).bit_length()
    expected = [width - bits.bit_length(), _reverse(bits, width), bits.bit_count(), lowest]
    assert out.tolist() == expected


@cuda.jit("int32(int32, int32)", device=True)
def add_int32(a, b):
    return a + b


@cuda.jit
def call_add_int32(out, a):
    out[0] = add_int32(a, a)


def test_a_device_function_signature_converts_arguments_and_result():
    # int32 + int32 computes in int64 (Numba's typing); the declared int32 result wraps
    out = np.zeros(1, np.int64)
    call_add_int32[1, 1](out, 2**30)
    assert out[0] == np.int64(2**31).astype(np.int32) == -(2**31)


@cuda.jit
def raise_in_one_thread(flag):
    if cuda.threadIdx.x == 1 and cuda.threadIdx.y == 2 and cuda.blockIdx.x == 3:
        if flag == 0:
            raise ValueError("bad value")
        raise ValueError


@pytest.mark.parametrize(("flag", "suffix"), [(0, ": bad value"), (1, "")])
def test_a_kernel_exception_names_the_thread_as_numba_cuda_does(flag, suffix):
    # numba-cuda's dispatcher prints the thread position z first (tid=[z, y, x]); a bare
    # ``raise`` gives the position alone
    with pytest.raises(ValueError) as raised:
        raise_in_one_thread[(4, 1), (2, 3)](flag)
    assert str(raised.value) == "tid=[0, 2, 1] ctaid=[0, 0, 3]" + suffix
    assert "threadIdx=(1, 2, 0) blockIdx=(3, 0, 0)" in raised.value.__notes__[0]


def divide(r, x, y):
    r[0] = y[0] / x[0]
    r[1] = y[0]


def test_debug_stops_at_a_division_by_zero():
    r, x, y = np.zeros(2), np.zeros(1), np.ones(1)
    with pytest.raises(FloatingPointError):  # numba-cuda's simulator's documented error
        cuda.jit(debug=True, opt=False)(divide)[1, 1](r, x, y)
    assert r.tolist() == [0, 0]  # stopped before the store
    with np.errstate(divide="ignore"):
        cuda.jit(divide)[1, 1](r, x, y)  # without debug: IEEE, as compiled code
    assert r.tolist() == [np.inf, 1]


def record_addresses(out):
    shared = cuda.shared.array(3, np.uint8, alignment=256)
    local = cuda.local.array(5, np.uint8, alignment=64)
    out[0] = shared.ctypes.data
    out[1] = local.ctypes.data


def test_alignment_is_honoured_for_shared_and_local_arrays():
    # numba-cuda compiles alignment= for both (its test_array_alignment checks the addresses
    # on a GPU); its simulator refuses it
    out = np.zeros(2, np.uint64)
    cuda.jit(record_addresses)[1, 1](out)
    assert int(out[0]) % 256 == 0 and int(out[1]) % 64 == 0


def record_default_addresses(out):
    out[0] = cuda.shared.array(8, np.float16).ctypes.data
    out[1] = cuda.shared.array(8, np.float32).ctypes.data
    out[2] = cuda.shared.array(8, np.uint8).ctypes.data


def test_shared_arrays_without_alignment_get_only_their_elements_alignment():
    # numba-cuda aligns them to the element's ABI alignment (2 bytes for float16), not 16: the
    # simulator places them there and no further, so a 16-byte access into one faults here
    out = np.zeros(3, np.uint64)
    cuda.jit(record_default_addresses)[1, 1](out)
    for address, natural in zip(out.tolist(), (2, 4, 1), strict=True):
        assert address % (2 * natural) == natural, (address, natural)


def vector_store_into_default_shared(out):
    s = cuda.shared.array(16, np.float16)
    store16_shared(s, 0, (np.float16(1),) * 8)
    out[0] = s[0]


def test_a_vector_access_into_a_shared_array_without_alignment_faults():
    with pytest.raises(SimulationError, match="misaligned"):
        cuda.jit(vector_store_into_default_shared)[1, 1](np.zeros(1, np.float16))


@pytest.mark.parametrize(
    ("alignment", "error", "message"),
    [
        (0, ValueError, "Alignment must be positive"),
        (-16, ValueError, "Alignment must be positive"),
        (24, ValueError, "Alignment must be a power of 2"),
        (4, ValueError, f"Alignment must be a multiple of {struct.calcsize('P')}"),
        (16.0, RequireLiteralValue, "alignment must be a constant integer"),
        ("16", RequireLiteralValue, "alignment must be a constant integer"),
    ],
)
@pytest.mark.parametrize("space", ["shared", "local"])
def test_alignment_is_refused_where_numba_cuda_refuses_it(alignment, error, message, space):
    @cuda.jit
    def declare():
        getattr(cuda, space).array(8, np.float32, alignment=alignment)

    with pytest.raises(error, match=message):
        declare[1, 1]()


def test_options_that_change_only_the_code_are_accepted():
    # numba-cuda's cuda.jit takes them; its simulator's jit raised TypeError for each
    @cuda.jit(lineinfo=True, launch_bounds=(64, 1), max_registers=64, forceinline=False)
    def fill(out):
        out[cuda.threadIdx.x] = cuda.threadIdx.x

    out = np.zeros(64, np.int64)
    fill[1, 64](out)
    np.testing.assert_array_equal(out, np.arange(64))


@pytest.mark.parametrize(("fn", "typed"), typing_kernels.SHAPES, ids=typing_kernels.SHAPE_IDS)
def test_array_shapes_numba_cannot_type_are_refused(fn, typed):
    """A shared or local array's shape must be a constant when Numba types the kernel: an
    expression of globals or a field of an object is refused as numba-cuda refuses it (the
    compile tier's test_array_shapes_as_numba_types_them checks numba-cuda's side)."""
    x = np.ones(4, np.float32)
    kernel = cuda.jit(fn)
    if typed:
        kernel[1, 1](x)
        assert x[1] == 1.0
    else:
        with pytest.raises(NumbaTypeError, match="not a constant Numba can type"):
            kernel[1, 1](x)


def test_a_kernel_taking_star_args_is_refused():
    """numba-cuda binds ``*args`` to one argument and refuses a launch of more (the compile
    tier's test_star_args_kernels_are_refused checks numba-cuda's side)."""
    x, y = np.ones(1, np.float32), np.zeros(1, np.float32)
    with pytest.raises(TypeError, match="Signature mismatch: 2 argument types given"):
        cuda.jit(typing_kernels.star_args_kernel)[1, 1](x, y)
    assert y[0] == 0.0


def test_reshape_of_a_strided_argument_is_refused_and_of_a_contiguous_one_runs():
    """numba-cuda reshapes a C-contiguous array in a kernel and refuses one of layout "A" (the
    compile tier's test_reshape_in_a_kernel_needs_a_contiguous_array checks its side)."""
    y = np.zeros(1, np.float32)
    x = cuda.to_device(np.arange(8, dtype=np.float32))
    cuda.jit(typing_kernels.reshape_kernel)[1, 1](x[:4], y)
    assert y[0] == 3.0
    with pytest.raises(NumbaTypeError, match="reshape\\(\\) supports contiguous array only"):
        cuda.jit(typing_kernels.reshape_kernel)[1, 1](x[::2], y)


def test_reshape_in_a_profiled_kernel_is_tracked():
    """Under the profiler too: the reshaped view is the argument's memory, counted."""
    from tessera_tile import sim

    y = cuda.to_device(np.zeros(1, np.float32))
    x = cuda.to_device(np.arange(8, dtype=np.float32))
    with sim.profile() as prof:
        cuda.jit(typing_kernels.reshape_kernel)[1, 1](x[:4], y)
    assert y.copy_to_host()[0] == 3.0 and prof.bytes_read == 4 and prof.bytes_written == 4
    with sim.profile(), pytest.raises(NumbaTypeError, match="contiguous array only"):
        cuda.jit(typing_kernels.reshape_kernel)[1, 1](x[::2], y)
