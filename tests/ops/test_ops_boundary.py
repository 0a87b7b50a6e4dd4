"""The argument boundary of every op and of fused functions (issue 20): a malformed
``__cuda_array_interface__``, arrays mixed between host and device (``out=`` included), and
sizes the kernels cannot index. Each raises TypeError or ValueError naming the argument, of
the class NumPy raises for the same fault in ``__array_interface__``, before anything is
copied, allocated or launched; a refused ``out`` keeps its contents.

No test allocates a large array: a huge shape is a stride-0 view (host) or an interface over
a few real bytes with stride 0 (device), and every test runs under :func:`nothing_placed`,
which turns a copy, an allocation or a launch into a failure instead of a long run. Launches
are counted on both tiers (``helpers.counting_launches``); a device "array" made here is an
interface over host bytes, which no test lets reach a kernel (a GPU faults on a host pointer).
"""

import re
from dataclasses import dataclass

import numpy as np
import pytest
from helpers import counting_launches, on

import tessera_tile as tt
from tessera_tile import ops
from tessera_tile._runtime import arrays as _arrays


@tt.fuse
def scaled(x, y):
    return x * y + 1.0


@dataclass(frozen=True)
class Spec:
    """One op: a call taking its arrays positionally, and the arrays of a valid call."""

    call: object
    arrays: dict  # name in error messages -> a valid host array


def f32(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def f16(*shape, seed=0):
    return f32(*shape, seed=seed).astype(np.float16)


SPECS = {
    "softmax": Spec(lambda x, **kw: ops.softmax(x, **kw), {"x": f32(4, 8)}),
    "layer_norm": Spec(
        lambda x, w, b, **kw: ops.layer_norm(x, w, b, **kw),
        {"x": f32(4, 8), "weight": f32(8), "bias": f32(8)},
    ),
    "rms_norm": Spec(
        lambda x, w, **kw: ops.rms_norm(x, w, **kw), {"x": f32(4, 8), "weight": f32(8)}
    ),
    "sum": Spec(lambda x, **kw: ops.sum(x, axis=-1, **kw), {"x": f32(4, 8)}),
    "argmax": Spec(lambda x, **kw: ops.argmax(x, axis=-1, **kw), {"x": f32(4, 8)}),
    "cross_entropy": Spec(
        lambda x, t, **kw: ops.cross_entropy(x, t, reduction="none", **kw),
        {"logits": f32(4, 8), "targets": np.array([0, 7, 3, 1], np.int32)},
    ),
    "transpose": Spec(lambda x, **kw: ops.transpose(x, **kw), {"x": f32(4, 8)}),
    "matmul": Spec(lambda a, b, **kw: ops.matmul(a, b, **kw), {"a": f32(4, 8), "b": f32(8, 4)}),
    "linear": Spec(
        lambda x, w, b, **kw: ops.linear(x, w, b, "relu", **kw),
        {"x": f32(4, 8), "w": f32(8, 4), "bias": f32(4)},
    ),
    "mlp": Spec(
        lambda x, w1, b1, w2, b2, **kw: ops.mlp(x, w1, b1, w2, b2, **kw),
        {"x": f32(4, 8), "w1": f32(8, 4), "b1": f32(4), "w2": f32(4, 2), "b2": f32(2)},
    ),
    "attention": Spec(
        lambda q, k, v, **kw: ops.attention(q, k, v, **kw),
        {"q": f16(16, 16), "k": f16(8, 16, seed=1), "v": f16(8, 16, seed=2)},
    ),
    "fused": Spec(
        lambda x, y, **kw: scaled(x, y, **kw),
        {"argument 0 of scaled": f32(4, 8), "argument 1 of scaled": f32(4, 8, seed=1)},
    ),
}
# the hand-written ops, which issue 20 found ignoring a host out= or accepting mixed sides
HAND_WRITTEN = ["cross_entropy", "transpose", "matmul", "linear", "mlp", "attention"]


@pytest.fixture
def nothing_placed(monkeypatch):
    """Fail, at once, any copy to the device, device allocation or kernel launch."""

    def placed(*args, **kwargs):
        raise AssertionError("the call got past validation: it copies, allocates or launches")

    for name in ("to_device", "device_handle", "empty", "zeros"):
        monkeypatch.setattr(_arrays, name, placed)
    with counting_launches() as counted:
        yield
    assert counted.launches == 0


def refused(error, name: str, words: str = ""):
    return pytest.raises(error, match=re.escape(name) + ".*" + words)


# --------------------------------------------------------------------------------------------
# malformed __cuda_array_interface__


class Interface:
    """An interface over a buffer: a host array's bytes (the faults below, which no kernel
    reads), or a device array's (a GPU faults on a host pointer)."""

    def __init__(self, buffer, **changes):
        self.buffer = buffer  # keeps the memory alive
        device = getattr(buffer, "__cuda_array_interface__", None)
        cai = {
            "version": 3,
            "shape": buffer.shape,
            "typestr": buffer.dtype.str,
            "data": (device["data"][0] if device else buffer.ctypes.data, False),
            "strides": None,
        }
        self.__cuda_array_interface__ = {**cai, **changes}


def _without(key):
    def change(a):
        i = Interface(a)
        del i.__cuda_array_interface__[key]
        return i

    return change


def _replaced(**changes):
    return lambda a: Interface(a, **{k: v(a) if callable(v) else v for k, v in changes.items()})


class _NotADict:
    def __init__(self, a):
        self.__cuda_array_interface__ = [a.shape, a.dtype.str]


def _shape(a):
    return (-1, *a.shape[1:])


# fault -> (make the bad argument from a valid host array, error, words); the classes are
# NumPy's for the same fault in __array_interface__ (misalignment: NumPy accepts it, a GPU
# faults, so it is refused like any other bad value)
FAULTS = {
    "not a dict": (_NotADict, ValueError, "must be a dict"),
    "no typestr": (_without("typestr"), ValueError, "no 'typestr'"),
    "no shape": (_without("shape"), ValueError, "no 'shape'"),
    "no data": (_without("data"), ValueError, "no 'data'"),
    "garbage typestr": (_replaced(typestr="<zz"), TypeError, "is not a data type"),
    "typestr not a str": (_replaced(typestr=4), TypeError, "typestr must be a str"),
    "data not a tuple": (_replaced(data=lambda a: a.ctypes.data), TypeError, "2-tuple"),
    "pointer not an int": (_replaced(data=("0x10", False)), TypeError, "pointer must be an int"),
    "shape not a tuple": (_replaced(shape=lambda a: a.size), TypeError, "tuple of ints"),
    "shape of floats": (_replaced(shape=lambda a: tuple(map(float, a.shape))), TypeError, "ints"),
    "negative shape": (_replaced(shape=_shape), ValueError, "negative dimension"),
    "strides too short": (_replaced(strides=lambda a: a.strides[1:]), ValueError, "strides for"),
    "strides of floats": (
        _replaced(strides=lambda a: tuple(map(float, a.strides))),
        TypeError,
        "ints",
    ),  # fmt: skip
    "null pointer": (_replaced(data=(0, False)), ValueError, "null data pointer"),
    "misaligned strides": (
        _replaced(strides=lambda a: tuple(s - 1 if s > 1 else s for s in a.strides)),
        ValueError,
        "multiples of its itemsize",
    ),
    "misaligned address": (
        _replaced(data=lambda a: (a.ctypes.data + 1, False)),
        ValueError,
        "multiples of its itemsize",
    ),  # fmt: skip
}


@pytest.mark.usefixtures("nothing_placed")
@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize("op", SPECS)
def test_malformed_interface_of_the_last_argument(op, fault):
    """Every fault, in the last argument (the others valid device arrays): every argument is
    validated before the first launch (mlp's b2 included)."""
    spec = SPECS[op]
    names, hosts = list(spec.arrays), list(spec.arrays.values())
    bad, error, words = FAULTS[fault]
    args = [*on("device", *hosts[:-1]), bad(hosts[-1].copy())]
    with refused(error, names[-1], words):
        spec.call(*args)


@pytest.mark.usefixtures("nothing_placed")
@pytest.mark.parametrize(
    ("op", "index"), [(op, i) for op, spec in SPECS.items() for i in range(len(spec.arrays))]
)
@pytest.mark.parametrize("fault", ["no typestr", "misaligned strides"])
def test_each_argument_is_named(op, index, fault):
    spec = SPECS[op]
    names, hosts = list(spec.arrays), list(spec.arrays.values())
    bad, error, words = FAULTS[fault]
    args = list(on("device", *hosts))
    args[index] = bad(hosts[index].copy())
    with refused(error, names[index], words):
        spec.call(*args)


@pytest.mark.sim_only(reason="on a GPU the kernel faults on the host pointer (nothing checks it)")
@pytest.mark.usefixtures("nothing_placed")
@pytest.mark.parametrize("op", SPECS)
def test_a_host_or_freed_pointer_in_an_interface_is_refused(op):
    """An interface over host memory, or over a device allocation already freed: a GPU's kernel
    faults on either (an illegal address); the simulator, whose device memory is host memory,
    refuses both before any launch instead of reading them."""
    spec = SPECS[op]
    names, hosts = list(spec.arrays), list(spec.arrays.values())
    others = on("device", *hosts[:-1])
    with refused(ValueError, names[-1], "not in device memory"):
        spec.call(*others, Interface(hosts[-1].copy()))
    freed = Interface(tt.to_device(hosts[-1]))
    freed.buffer = None  # the only reference: the allocation is freed (and nothing reuses it)
    with refused(ValueError, names[-1], "not in device memory"):
        spec.call(*others, freed)


@pytest.mark.parametrize("op", ["matmul", "attention", "transpose", "fused"])
def test_a_valid_interface_is_read_in_place(op):
    """The same interfaces, unbroken, give NumPy's answer (the faults above are the cause)."""
    spec = SPECS[op]
    hosts = list(spec.arrays.values())
    want = np.asarray(spec.call(*hosts))
    got = spec.call(*[Interface(tt.to_device(a)) for a in hosts])
    np.testing.assert_array_equal(got.copy_to_host(), want)


# --------------------------------------------------------------------------------------------
# host and device mixed: out= and the inputs


def _out_like(spec: Spec) -> np.ndarray:
    """A host out= of the result's shape and dtype, filled with a sentinel."""
    result = np.asarray(spec.call(*spec.arrays.values()))
    return np.full(result.shape, 7, result.dtype)


# The ops defined by fused functions name arguments as their fused definition does
# ("argument 0 of sum", "out[0]"): either name of out is accepted here.
OUT = r"out(\[0\])?"


@pytest.mark.parametrize("op", SPECS)
def test_host_out_with_device_inputs_is_refused(op):
    spec = SPECS[op]
    out = _out_like(spec)
    args = on("device", *spec.arrays.values())
    refusal = pytest.raises(TypeError, match=f"{OUT} is a host .* a device")
    with counting_launches() as counted, refusal:
        spec.call(*args, out=out)
    assert counted.launches == 0
    assert (out == 7).all(), "a refused out= keeps its contents"


@pytest.mark.parametrize("op", SPECS)
def test_device_out_with_host_inputs_is_refused(op):
    spec = SPECS[op]
    (out,) = on("device", _out_like(spec))
    refusal = pytest.raises(TypeError, match=f"is a host .* {OUT} a device")
    with counting_launches() as counted, refusal:
        spec.call(*spec.arrays.values(), out=out)
    assert counted.launches == 0
    assert (out.copy_to_host() == 7).all()


MIXABLE = [
    (op, i) for op, spec in SPECS.items() if len(spec.arrays) > 1 for i in range(len(spec.arrays))
]


@pytest.mark.parametrize(("op", "index"), MIXABLE)
@pytest.mark.parametrize("host_side", ["one on the host", "one on the device"])
def test_inputs_mixed_between_host_and_device_are_refused(op, index, host_side):
    """One argument on the other side from the rest: TypeError naming it (attention took
    q, k, v mixed)."""
    spec = SPECS[op]
    names, hosts = list(spec.arrays), list(spec.arrays.values())
    others = "device" if host_side == "one on the host" else "host"
    args = list(on(others, *hosts))
    args[index] = on("host" if others == "device" else "device", hosts[index])[0]
    with counting_launches() as counted, refused(TypeError, names[index]):
        spec.call(*args)
    assert counted.launches == 0


# --------------------------------------------------------------------------------------------
# sizes the kernels cannot index (int32 counters): refused before anything is placed

INT32_MAX = 2**31 - 1
TC = tt.TileConfig(32, 32, 16, 2, 2, dtype="float16")
K_LIMIT = (INT32_MAX - TC.num_stages) * TC.tile_k  # k-tiles and the stages ahead in int32


def huge(side: str, shape, dtype):
    """An array of ``shape`` over one element (stride 0): a view on the host, an interface
    over one element of device memory on the device."""
    one = np.zeros(1, dtype)
    if side == "host":
        return np.lib.stride_tricks.as_strided(one, shape, (0,) * len(shape))
    return Interface(tt.to_device(one), shape=tuple(shape), strides=(0,) * len(shape))


def _matmul_k(side, k, dtype=np.float16, **kw):
    return ops.matmul(huge(side, (4, k), dtype), huge(side, (k, 4), dtype), **kw)


SIZES = {
    # name -> (call(side), argument named, words)
    "matmul K": (lambda s: _matmul_k(s, K_LIMIT + 1, config=TC), "a", f"at most {K_LIMIT}"),
    "matmul K, default tiles": (lambda s: _matmul_k(s, 2**37), "a", "k-tiles of 32 in int32"),
    "matmul K, tf32": (
        lambda s: _matmul_k(s, 2**37, np.float32, precision="tf32"),
        "a",
        "k-tiles of 16 in int32",
    ),
    "linear K": (
        lambda s: ops.linear(
            huge(s, (4, 2**37), np.float16), huge(s, (2**37, 4), np.float16), None, "relu"
        ),
        "x",
        "int32",
    ),
    "mlp hidden (the second product's K)": (
        lambda s: ops.mlp(
            *on(s, f16(4, 8)),
            huge(s, (8, 2**37), np.float16),
            None,
            huge(s, (2**37, 2), np.float16),
            None,
        ),  # fmt: skip
        "w2",
        "int32",
    ),
    "attention Sq": (
        lambda s: ops.attention(huge(s, (2**31, 16), np.float16), *on(s, f16(8, 16), f16(8, 16))),
        "q",
        f"at most {INT32_MAX - 256}",  # two blocks of 128 rows, D = 16's default config
    ),
    "attention Sk": (
        lambda s: ops.attention(
            *on(s, f16(16, 16)), *(huge(s, (INT32_MAX - 127, 16), np.float16) for _ in "kv")
        ),
        "k",
        "counts positions in int32",
    ),
}


@pytest.mark.usefixtures("nothing_placed")
@pytest.mark.parametrize("case", SIZES)
@pytest.mark.parametrize("side", ["host", "device"])
def test_sizes_that_would_wrap_int32_are_refused(case, side):
    call, name, words = SIZES[case]
    with refused(ValueError, name, words):
        call(side)


@pytest.mark.usefixtures("nothing_placed")
@pytest.mark.parametrize("side", ["host", "device"])
def test_k_at_the_limit_is_accepted(side):
    """The limit is exact: K_LIMIT passes validation (explain plans it), K_LIMIT + 1 does not."""
    a, b = huge(side, (4, K_LIMIT), np.float16), huge(side, (K_LIMIT, 4), np.float16)
    assert ops.matmul.explain(a, b, config=TC).kernels == 1


@pytest.mark.usefixtures("nothing_placed")
@pytest.mark.parametrize("op", ["softmax", "transpose", "matmul", "attention", "fused"])
def test_misaligned_simulator_device_array_is_refused(op):
    """The simulator's own device arrays get the interface's checks: one whose memory starts
    one byte into a buffer is refused (a GPU would fault on it)."""
    spec = SPECS[op]
    names, hosts = list(spec.arrays), list(spec.arrays.values())
    first = hosts[0]
    raw = np.zeros(first.nbytes + first.itemsize, np.uint8)[1 : 1 + first.nbytes]
    misaligned = raw.view(first.dtype).reshape(first.shape)
    misaligned[...] = first
    args = [_arrays._fake_device_array(misaligned), *on("device", *hosts[1:])]
    with refused(ValueError, names[0], "multiples of its itemsize"):
        spec.call(*args)


# --------------------------------------------------------------------------------------------
# out= of another dtype: NumPy's same_kind rule, for every op and fused function alike


def _wider_and_narrower(dtype: np.dtype) -> tuple:
    """A dtype same_kind allows for a result of ``dtype`` (another float or int width), and
    one it refuses (a float result into int32; an integer result into bool)."""
    if dtype.kind == "f":
        return np.dtype(np.float64 if dtype != np.float64 else np.float32), np.dtype(np.int32)
    return np.dtype(np.int32 if dtype != np.int32 else np.int64), np.dtype(np.bool_)


@pytest.mark.parametrize("op", SPECS)
def test_out_of_another_dtype_follows_same_kind(op, side):
    spec = SPECS[op]
    want = np.asarray(spec.call(*spec.arrays.values()))
    allowed, refused = _wider_and_narrower(want.dtype)
    args = on(side, *spec.arrays.values())
    (out,) = on(side, np.full(want.shape, 7, allowed))
    got = spec.call(*args, out=out)
    assert got is out
    got = out.copy_to_host() if side == "device" else out
    if want.dtype.kind == "f":
        # the result cast once; a fused definition then runs another variant of its kernel
        # (element accesses, not 16-byte vectors: the arrays' item sizes differ), whose
        # rounding may differ by an ulp of the result's dtype, relative to the largest
        # magnitude (a layer norm's centred values are as exact as x, not as themselves)
        ulp = 2 * float(np.finfo(want.dtype).eps)
        scale = float(np.abs(want).max(initial=0))
        np.testing.assert_allclose(got, want.astype(allowed), rtol=ulp, atol=ulp * scale)
    else:
        np.testing.assert_array_equal(got, want.astype(allowed))
    (bad,) = on(side, np.full(want.shape, 7, refused))
    with counting_launches() as counted, pytest.raises(TypeError, match="same_kind"):
        spec.call(*args, out=bad)
    assert counted.launches == 0


@pytest.mark.parametrize("op", SPECS)
def test_out_as_a_plain_cuda_array_interface_object(op):
    # any __cuda_array_interface__ object is a device array, as an input and as out=
    spec = SPECS[op]
    want = np.asarray(spec.call(*spec.arrays.values()))
    (device_out,) = on("device", np.full(want.shape, 7, want.dtype))
    out = Interface(device_out)
    got = spec.call(*on("device", *spec.arrays.values()), out=out)
    assert got is out
    np.testing.assert_array_equal(device_out.copy_to_host(), want)
