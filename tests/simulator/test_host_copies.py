"""Copies between host and device of every dtype the ops take, bfloat16 included.

numba-cuda copies host memory through the buffer protocol, which NumPy refuses for ml_dtypes'
bfloat16: on a GPU ``cuda.to_device`` of one raises (seen on an H200). The simulator refuses the
same copies, so a bfloat16 path that only the simulator accepts fails here too; ``tt.to_device``
and the ops' host path copy the bits instead.
"""

import ml_dtypes
import numpy as np
import pytest
from numba import cuda

import tessera_tile as tt
from tessera_tile import ops

BF16 = np.dtype(ml_dtypes.bfloat16)
REFUSED = "cannot include dtype 'E' in a buffer"


def test_numba_cannot_copy_bfloat16_between_host_and_device():
    x = np.arange(4).astype(BF16)
    d = cuda.device_array(4, BF16)
    with pytest.raises(ValueError, match=REFUSED):
        cuda.to_device(x)
    with pytest.raises(ValueError, match=REFUSED):
        d.copy_to_device(x)
    with pytest.raises(ValueError, match=REFUSED):
        d.copy_to_host(np.empty(4, BF16))


def test_a_kernel_refuses_a_bfloat16_host_argument():
    """A launch passes host arrays through DLPack, which has no bfloat16 (an H200 refused it);
    their uint16 bits pass."""

    @cuda.jit
    def copy(src, dst):
        i = cuda.grid(1)
        if i < dst.size:
            dst[i] = src[i]

    bits = np.arange(4, dtype=np.uint16)
    with pytest.raises(BufferError, match="DLPack only supports"):
        copy[1, 4](bits.view(BF16), np.zeros(4, np.uint16))
    out = np.zeros(4, np.uint16)
    copy[1, 4](bits, out)
    np.testing.assert_array_equal(out, bits)


# dtype -> an array of it from 16-bit patterns (NaN payloads and infinities included)
FROM_BITS = {
    "bfloat16": lambda bits: bits.view(BF16),
    "float16": lambda bits: bits.view(np.float16),
    "float32": lambda bits: bits.view(np.float16).astype(np.float32),
    "int64": lambda bits: bits.astype(np.int64),
}


@pytest.mark.parametrize("dtype", FROM_BITS)
def test_to_device_copies_any_dtype_bit_for_bit(dtype):
    bits = np.random.default_rng(0).integers(0, 2**16, (6, 10)).astype(np.uint16)
    x = FROM_BITS[dtype](bits)
    view = x[:, ::3]  # strided: copied contiguously
    d = tt.to_device(view)
    assert (d.dtype, d.shape) == (view.dtype, view.shape)
    back = d.copy_to_host()
    assert back.dtype == view.dtype
    np.testing.assert_array_equal(back.view(np.uint8), np.ascontiguousarray(view).view(np.uint8))


def test_a_bfloat16_host_out_is_written_in_place():
    x = np.random.default_rng(1).standard_normal((4, 40)).astype(BF16)
    out = np.full_like(x, np.nan)
    got = ops.softmax(x, out=out)
    assert got is out
    np.testing.assert_array_equal(out.view(np.uint16), ops.softmax(x).view(np.uint16))


def test_numba_cannot_view_a_0d_device_array():
    d = cuda.device_array((), np.float32)  # numba-cuda 0.30.4 builds the view's strides as a list
    with pytest.raises(TypeError, match="unhashable type: 'list'"):
        d.view(np.float32)


@pytest.mark.parametrize("side", ["host", "device"])
def test_a_0d_bfloat16_out_is_written(side):
    x = np.random.default_rng(2).standard_normal((5, 7)).astype(BF16)
    out = np.full((), np.nan, BF16)
    total = tt.fuse(lambda x: tt.sum(x))
    dest = out if side == "host" else tt.to_device(out)
    got = total(x if side == "host" else tt.to_device(x), out=dest)
    assert got is dest
    value = out if side == "host" else dest.copy_to_host()
    np.testing.assert_array_equal(value.view(np.uint16), total(x).view(np.uint16))
