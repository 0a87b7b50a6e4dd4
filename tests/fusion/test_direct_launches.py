"""Direct launches (``_runtime/launch.py``): after their first run, kept launches skip
numba-cuda's dispatcher and launch each compiled kernel from parameters packed by us. In the
simulator the packed parameters are decoded back into arrays, so packing is checked by the
results; on a GPU the same tests run the driver path."""

import numpy as np
import pytest
from helpers import SIMULATED, launch_kinds
from numba import cuda

import tessera_tile as tt
from tessera_tile import ops
from tessera_tile._runtime import launch, packing


@pytest.fixture
def direct_launches(monkeypatch):
    """Counts the launches made from packed parameters."""
    count = [0]
    original = launch.Kept._go

    def counted(self, handles, stream):
        count[0] += bool(self.direct)
        return original(self, handles, stream)

    monkeypatch.setattr(launch.Kept, "_go", counted)
    return count


def _calls(rng):
    """(call, NumPy reference) on fresh float32 device arrays: a fused row chain, a fused
    column reduction (partials and a ticket), a fused matmul with an epilogue (the composer's
    GEMM stage, a tuple of extras), and hand-written kernels (matmul with bias and
    activation, transpose of a strided view, cross-entropy with its int64 targets)."""

    scaled_softmax, column_var, epilogue = launch_kinds()
    x = rng.standard_normal((8, 24)).astype(np.float32)
    w = rng.standard_normal((24, 16)).astype(np.float32)
    b = rng.standard_normal(16).astype(np.float32)
    r = rng.standard_normal((8, 16)).astype(np.float32)
    t = rng.integers(0, 24, 8)
    e = np.exp(x - x.max(-1, keepdims=True))
    lse = np.log(np.exp(x - x.max(-1, keepdims=True)).sum(-1)) + x.max(-1)
    dx, dw, db, dr, dt = (cuda.to_device(a) for a in (x, w, b, r, t))
    return [
        (lambda: scaled_softmax(dx, np.float32(3)), e / e.sum(-1, keepdims=True) * 3),
        (lambda: column_var(dx), x.var(axis=0)),
        (lambda: epilogue(dx, dw, 0.5, dr), np.maximum(x @ w, 0) * 0.5 + r),
        (lambda: ops.linear(dx, dw, db, "relu"), np.maximum(x @ w + b, 0)),
        (lambda: ops.transpose(dx[:, 1:9]), x[:, 1:9].T),
        (lambda: ops.cross_entropy(dx, dt, reduction="none"), lse - x[np.arange(8), t]),
    ]


def test_kept_launches_go_direct_and_match_numpy(direct_launches):
    for call, want in _calls(np.random.default_rng(0)):
        before = direct_launches[0]
        for _ in range(3):
            got = call().copy_to_host()
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        assert direct_launches[0] > before, "the later calls launched from packed parameters"


@pytest.mark.sim_only(reason="a deliberate packing mistake: on a GPU it would fault")
def test_a_packing_mistake_computes_wrong_results_in_the_simulator(monkeypatch):
    """The simulator launches from the packed parameters, not from the arrays: packing a
    broadcast view's strides in the wrong order makes ``x + b`` (b a row) add b along
    columns."""

    def swapped(value, out):
        p = value if type(value) is packing.Pointer else packing.pointer_of(value)
        strides = p.strides[::-1] if 0 in p.strides else p.strides  # b's view: (0, 4)
        out += (0, 0, int(np.prod(p.shape)), p.itemsize, p.address, *p.shape, *strides)

    monkeypatch.setattr(packing, "_array", swapped)
    x = np.arange(8 * 8, dtype=np.float32).reshape(8, 8)
    b = np.arange(8, dtype=np.float32) * 100
    dx, db = cuda.to_device(x), cuda.to_device(b)

    @tt.fuse
    def add_row(x, b):
        return x + b

    np.testing.assert_array_equal(add_row(dx, db).copy_to_host(), x + b)  # through numba-cuda
    np.testing.assert_array_equal(add_row(dx, db).copy_to_host(), x + b[:, None])  # packed


@pytest.mark.skipif(not SIMULATED, reason="the simulator's view of a pointer outside the call")
def test_a_packed_pointer_outside_the_call_s_arrays_is_refused(monkeypatch):
    from tessera_tile.sim import SimulationError

    address_of = packing.address_of  # what a direct launch reads of each call's arrays
    monkeypatch.setattr(packing, "address_of", lambda a: address_of(a) + (1 << 20))  # 1 MiB on
    dx = cuda.to_device(np.ones(64, np.float32))

    @tt.fuse
    def double(x):
        return x * 2

    double(dx)
    with pytest.raises(SimulationError, match="inside none of the call's arrays"):
        double(dx)


def _comparable(params: list) -> list:
    """Packed parameters as comparable values (a ctypes scalar compares by identity)."""
    return [(type(p), p.value) if hasattr(p, "_type_") else p for p in params]


def test_direct_launches_patch_what_a_fresh_packing_gives(monkeypatch):
    """A direct launch packs its parameters once and then changes only the arrays' addresses
    and the scalars' values: on fresh arrays and scalars, every launch's parameters equal a
    packing made afresh from the call's arrays."""
    checked = []
    original = launch.Kept._go

    def compared(self, handles, stream):
        for kernel_launch, direct in zip(self.launches, self.direct or (), strict=False):
            params = kernel_launch.params
            values = [p.raw(handles) if type(p) in launch.SPECS else p for p in params]
            fresh = packing.packer(direct.argtypes)(values)
            assert _comparable(direct.params(handles)) == _comparable(fresh), kernel_launch
            checked.append(kernel_launch.kernel)
        return original(self, handles, stream)

    monkeypatch.setattr(launch.Kept, "_go", compared)
    scaled_softmax, column_var, epilogue = launch_kinds()
    rng = np.random.default_rng(4)
    for k in range(3):
        x, w, r = (rng.standard_normal(s).astype(np.float32) for s in ((8, 24), (24, 16), (8, 16)))
        dx, dw, dr = (cuda.to_device(a) for a in (x, w, r))
        dt = cuda.to_device(rng.integers(0, 24, 8))
        scaled_softmax(dx, np.float32(k + 1))
        column_var(dx[:, 1:])
        epilogue(dx, dw, 0.5 * k, dr)
        ops.linear(dx, dw, dr[0], "relu")
        ops.transpose(dx[:, 1:9])
        ops.cross_entropy(dx, dt, reduction="none")
    assert len(set(checked)) >= 6, "every kind of launch went direct and was compared"
