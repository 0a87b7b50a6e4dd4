"""Host-side indexing of the simulator's device arrays, as numba-cuda indexes on a GPU.

numba-cuda's ``DeviceNDArray.__getitem__`` does not index a NumPy array: it computes the view
with ``numba.cuda.cudadrv.dummyarray`` and slices the device pointer to the view's extent. Its
rules differ from NumPy's, and the stock simulator (which indexes its host array with NumPy)
accepts what a GPU refuses and computes other views:

* an ``Ellipsis`` is refused (``TypeError`` or ``IndexError``);
* slicing an axis of stride 0 gives size 1 (``broadcast_to(x, (3, n))[1:3]`` has 1 row);
* ``.shape`` is a plain tuple (the stock fake's refuses a negative index, as a kernel's does);
* ``.T`` and ``transpose()`` copy, into a new C-contiguous array (a transpose kernel), and
  refuse an array that is not 2-D with ``NotImplementedError`` (a 1-D ``.T`` too);
* ``view(dtype)`` of a 0-d array raises ``TypeError: unhashable type: 'list'`` (numba-cuda
  0.30.4 builds it with a list of strides; seen on an H200);
* a 0-byte allocation has a null pointer: a view of it whose extent is not empty raises
  ``RuntimeError: non-empty slice into empty slice`` (seen on an H200, numba-cuda 0.30.4);
  whether it is depends on the strides, and numba-cuda gives an empty ``device_array`` its own
  (``(8,)`` for 0 float64), where NumPy 2 gives every stride of an empty array as 0.

Device memory is the simulator's allocations alone (``device_array``, what calls it, and
``to_device``, which ``host_copies`` records): :func:`in_device_memory` tells a
``__cuda_array_interface__`` pointer into one from a host pointer, which a GPU's kernels fault
on (an illegal address), so the runtime refuses it.

Here a fake device array is indexed through the same ``dummyarray`` code, so it raises the same
errors and gives the same shapes, strides and first element as on a GPU. It also gets numba-cuda's
``__cuda_array_interface__`` (the stock fake has none), quirk included: an array with a stride-0
axis is called contiguous and its strides are left out (``is_contiguous`` skips broadcast axes).
"""

from __future__ import annotations

import weakref

import numpy as np

from .._runtime import compat

_stock_getitem = compat.FakeCUDAArray.__getitem__
_stock_setitem = compat.FakeCUDAArray.__setitem__
_stock_device_array = compat.device_array_module().device_array
_stock_transpose = compat.FakeCUDAArray.transpose
_stock_shape = compat.FakeCUDAArray.shape
_stock_view = compat.FakeCUDAArray.view


def root_memory(ary: np.ndarray) -> np.ndarray:
    """The array that owns ``ary``'s memory: the simulator's allocation (through the views
    ``as_strided`` makes, whose base is a holder of the array)."""
    while True:
        base = ary.base
        if not isinstance(base, np.ndarray):
            base = getattr(base, "base", None)  # as_strided's DummyArray
        if not isinstance(base, np.ndarray):
            return ary
        ary = base


def _at(fake, offset: int, shape, strides) -> np.ndarray:
    """A view of ``fake``'s allocation at byte ``offset`` from its first element, made on the
    allocation itself so that the profiler still sees where the allocation ends."""
    ary = compat.host_memory(fake)
    root = root_memory(ary)
    start = ary.__array_interface__["data"][0] + offset - root.__array_interface__["data"][0]
    if 0 in shape:  # nothing to address: NumPy refuses an offset at or past the end
        start = 0
    return np.ndarray(shape, ary.dtype, buffer=root, offset=start, strides=strides)


def _null(fake) -> bool:
    """Whether numba would hold a null pointer here: the allocation had 0 bytes."""
    flag = getattr(fake, "_tt_null", None)
    if flag is not None:
        return flag
    return root_memory(compat.host_memory(fake)).nbytes == 0


def _view(fake, item, getting: bool):
    """numba-cuda's view of ``fake[item]``: (its dummy array, the byte offset of its pointer).
    Reading slices the pointer to the first contiguous extent when there is one, writing to the
    whole extent (``_do_getitem``, ``_do_setitem``)."""
    ary = compat.host_memory(fake)
    dummy = compat.dummy_array(ary.shape, ary.strides, ary.itemsize)[item]
    extents = list(dummy.iter_contiguous_extent()) if getting else []
    begin, end = extents[0] if len(extents) == 1 else dummy.extent
    if _null(fake) and end - begin != 0:
        raise RuntimeError("non-empty slice into empty slice")  # numba-cuda's driver message
    return dummy, begin


def _getitem(self, item):
    if (
        compat.host_memory(self).dtype.fields is not None
    ):  # records: numba-cuda returns DeviceRecords
        return _stock_getitem(self, item)
    dummy, begin = _view(self, item, getting=True)
    if not dummy.is_array:  # one element, copied to the host as numba-cuda does
        return _at(self, begin, (), ())[()]
    view = compat.FakeCUDAArray(_at(self, begin, dummy.shape, dummy.strides), stream=self.stream)
    view._tt_null = _null(self)
    return view


def _setitem(self, item, value):
    if compat.host_memory(self).dtype.fields is not None:
        return _stock_setitem(self, item, value)
    dummy, begin = _view(self, item, getting=False)
    shape, strides = (dummy.shape, dummy.strides) if dummy.is_array else ((), ())
    target = _at(self, begin, shape, strides)
    target[...] = compat.host_memory(value) if isinstance(value, compat.FakeCUDAArray) else value


def _transpose(self, axes=None):
    """numba-cuda's ``DeviceNDArray.transpose``: a copy, 2-D only."""
    if axes and tuple(axes) == tuple(range(compat.host_memory(self).ndim)):
        return self
    if compat.host_memory(self).ndim != 2:
        raise NotImplementedError("transposing a non-2D DeviceNDArray isn't supported")
    if axes is not None and set(axes) != {0, 1}:
        raise ValueError(f"invalid axes list {axes!r}")
    copy = np.ascontiguousarray(compat.host_memory(self).T)
    return allocated(compat.FakeCUDAArray(copy, stream=self.stream))


def _dtype_view(self, dtype):
    if compat.host_memory(self).ndim == 0:
        raise TypeError("unhashable type: 'list'")
    return _stock_view(self, dtype)


def _numba_contiguous(ary: np.ndarray) -> bool:
    """numba-cuda's ``is_contiguous``: C order, skipping axes of size 1 or stride 0."""
    size = ary.itemsize
    for n, stride in zip(reversed(ary.shape), reversed(ary.strides), strict=True):
        if n > 1 and stride != 0:
            if stride != size:
                return False
            size *= n
    return True


def _interface(self) -> dict:
    ary = compat.host_memory(self)
    return {
        "shape": ary.shape,
        "strides": None if _numba_contiguous(ary) else ary.strides,
        "data": (0 if _null(self) else ary.__array_interface__["data"][0], False),
        "typestr": ary.dtype.str,
        "stream": None,
        "version": 3,
    }


# The live allocations, by id of the array that owns their memory: (first, last) byte address
# and a weak reference whose callback drops the entry when the allocation is freed.
_allocations: dict[int, tuple[int, int, weakref.ref]] = {}
_tracking = False


def allocated(fake):
    """Record ``fake``'s memory as an allocation of device memory (returns ``fake``)."""
    root = root_memory(compat.host_memory(fake))
    key, start = id(root), root.__array_interface__["data"][0]
    _allocations[key] = (start, start + root.nbytes, weakref.ref(root, lambda _: _drop(key)))
    return fake


def _drop(key: int) -> None:
    _allocations.pop(key, None)


def in_device_memory(first: int, last: int) -> bool:
    """Whether bytes [first, last) lie in one live allocation of the simulator's device memory
    (True where allocations are not tracked: the stock simulator)."""
    if not _tracking:
        return True
    return any(
        start <= first and last <= end and ref() is not None
        for start, end, ref in list(_allocations.values())
    )


def memory_at(address: int) -> np.ndarray | None:
    """The live allocation of the simulator's device memory holding ``address`` (its host
    buffer), or None."""
    for start, end, ref in list(_allocations.values()):
        if start <= address < end and ref() is not None:
            return ref()
    return None


def _contiguous_strides(shape, itemsize: int, order: str) -> tuple:
    """The strides numba-cuda gives a new device array (``_fill_stride_by_order``)."""
    strides, step = [], itemsize
    for n in reversed(shape) if order == "C" else shape:
        strides.append(step)
        step *= n
    return tuple(reversed(strides)) if order == "C" else tuple(strides)


def _device_array(shape, dtype=np.float64, strides=None, order="C", stream=0):
    fake = _stock_device_array(shape, dtype, strides=strides, order=order, stream=stream)
    host = compat.host_memory(fake)
    if strides is None and host.size == 0:
        want = _contiguous_strides(host.shape, host.itemsize, order)
        compat.set_host_memory(fake, np.lib.stride_tricks.as_strided(host, strides=want))
    return allocated(fake)


def _set(getitem, setitem, device_array, transpose, shape) -> None:
    global _tracking
    _tracking = device_array is _device_array
    compat.FakeCUDAArray.__getitem__ = getitem
    compat.FakeCUDAArray.__setitem__ = setitem
    compat.FakeCUDAArray.transpose = transpose  # .T calls it
    compat.FakeCUDAArray.shape = shape
    if getitem is _getitem:
        compat.FakeCUDAArray.__cuda_array_interface__ = property(_interface)
    elif "__cuda_array_interface__" in vars(compat.FakeCUDAArray):
        del compat.FakeCUDAArray.__cuda_array_interface__
    for module in compat.device_array_modules():
        module.device_array = device_array


def patch() -> None:
    compat.FakeCUDAArray.view = _dtype_view
    _set(
        _getitem,
        _setitem,
        _device_array,
        _transpose,
        property(lambda self: compat.host_memory(self).shape),
    )


def unpatch() -> None:
    compat.FakeCUDAArray.view = _stock_view
    _set(_stock_getitem, _stock_setitem, _stock_device_array, _stock_transpose, _stock_shape)
