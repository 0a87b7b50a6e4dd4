"""numba-cuda's device arrays on the host: indexing and ``__cuda_array_interface__``, as found on
an H200 (numba-cuda 0.30.4). On a GPU these tests check numba-cuda itself; in the simulator,
that ``tessera_tile.sim`` reproduces it (``sim.device_arrays``), errors and quirks included."""

import numpy as np
import pytest
from helpers import on
from numba import cuda

from tessera_tile import ops
from tessera_tile._runtime import arrays as _arrays


def test_an_ellipsis_is_refused():
    d = cuda.to_device(np.ones((4, 6), np.float32))
    with pytest.raises((TypeError, IndexError)):
        d[..., ::2]
    assert d[:, ::2].shape == (4, 3)


def test_the_shape_is_a_tuple():
    d = cuda.to_device(np.zeros((4, 6), np.float32))
    assert d.shape == (4, 6) and d.shape[-1] == 6 and type(d.shape) is tuple


def test_indexing_gives_numpys_views_and_elements():
    host = np.arange(24, dtype=np.float32).reshape(4, 6)
    d = cuda.to_device(host)
    np.testing.assert_array_equal(d[1].copy_to_host(), host[1])
    np.testing.assert_array_equal(d[:, 1:5:2].copy_to_host(), host[:, 1:5:2])
    np.testing.assert_array_equal(d.T[2].copy_to_host(), host.T[2])
    assert d[3, 5] == host[3, 5]
    d[1, :] = 7
    d[0] = np.arange(6)
    host[1, :], host[0] = 7, np.arange(6)
    np.testing.assert_array_equal(d.copy_to_host(), host)


def test_slicing_an_axis_of_stride_0_gives_one_row():
    # numba-cuda's dummyarray: a stride-0 slice has size 1, where NumPy keeps 2 rows.
    d = cuda.to_device(np.broadcast_to(np.arange(4.0), (3, 4)))
    assert d.strides == (0, 8)
    assert d[1:3].shape == (1, 4)
    np.testing.assert_array_equal(d[2].copy_to_host(), np.arange(4.0))


def test_an_empty_allocation_refuses_views_with_an_extent():
    # A 0-byte allocation has a null pointer; a view whose extent is not empty is refused.
    # Whether it has one depends on the strides: NumPy 2 gives an empty array's strides as 0
    # (kept by to_device), numba-cuda's device_array its own.
    with pytest.raises(RuntimeError, match="non-empty slice into empty slice"):
        cuda.to_device(np.ones((2, 3, 0), np.float32))[0]
    assert cuda.device_array(0)[:].shape == (0,)
    assert cuda.device_array((2, 3, 0), np.float32).strides == (0, 0, 4)


def test_the_interface_of_a_broadcast_array_leaves_its_strides_out():
    # numba-cuda's is_contiguous skips stride-0 axes: its interface calls this array contiguous.
    d = cuda.to_device(np.broadcast_to(np.arange(4.0), (3, 4)))
    assert d.__cuda_array_interface__["strides"] is None
    assert _arrays.read(d, "x").strides == (0, 8)  # read from the array, not its interface


@pytest.mark.parametrize("side", ["host", "device"])
def test_an_op_on_a_broadcast_array_reads_each_row_once(side):
    row = np.random.default_rng(0).standard_normal(40).astype(np.float32)
    x = np.broadcast_to(row, (3, 40))
    (placed,) = on(side, x)
    got = ops.softmax(placed)
    got = got if side == "host" else got.copy_to_host()
    e = np.exp(row - row.max())
    np.testing.assert_allclose(got, np.broadcast_to(e / e.sum(), (3, 40)), rtol=1e-6, atol=1e-7)


def test_transpose_is_a_copy_and_2d_only():
    host = np.arange(6, dtype=np.float32).reshape(2, 3)
    d = cuda.to_device(host)
    t = d.T
    np.testing.assert_array_equal(t.copy_to_host(), host.T)
    assert t.strides == (8, 4)  # a new C-contiguous array, not a view
    d[0, 0] = 100
    assert t.copy_to_host()[0, 0] == 0
    for shape in [(6,), (1, 2, 3)]:
        with pytest.raises(NotImplementedError, match="non-2D"):
            cuda.to_device(np.zeros(shape, np.float32)).transpose()


def test_a_view_made_from_the_pointer_indexes_too():
    # _arrays.view (the ops' views) makes them with as_strided: indexing one still addresses
    # the allocation it lies in
    host = np.arange(12, dtype=np.float32)
    d = cuda.to_device(host)
    rows = _arrays.view(d, (3, 4), (16, 4))
    broadcast = _arrays.view(d, (3, 4), (0, 4))
    np.testing.assert_array_equal(rows[1].copy_to_host(), host[4:8])
    np.testing.assert_array_equal(broadcast[2].copy_to_host(), host[:4])
    assert broadcast[1:3].shape == (1, 4)  # numba's stride-0 slice, as on a GPU
