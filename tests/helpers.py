"""Helpers shared by the test tiers."""

import contextlib
import importlib.util
import os
import sys
from pathlib import Path

import ml_dtypes
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SIMULATED = os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0")


def load_example(name: str):
    """Import ``examples/<name>.py`` as a module (examples are scripts, not a package)."""
    key = f"tessera_examples.{name}"
    if key in sys.modules:
        return sys.modules[key]
    spec = importlib.util.spec_from_file_location(key, ROOT / "examples" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[key] = module
    spec.loader.exec_module(module)
    return module


SIDES = ("host", "device")


def on(side: str, *arrays):
    """The arrays as a caller on ``side`` holds them: NumPy arrays, or numba device arrays
    (``tt.to_device``, which copies bfloat16 too; in the simulator its fake device arrays).
    Scalars stay scalars."""
    if side == "host":
        return arrays
    import tessera_tile as tt

    return tuple(tt.to_device(a) if isinstance(a, np.ndarray) and a.ndim else a for a in arrays)


def transposed(x):
    """``x.T`` as a view, host or device: numba's ``DeviceNDArray.T`` is a transposing copy
    (2-D only), so the device view is made from the pointer."""
    if isinstance(x, np.ndarray):
        return x.T
    from tessera_tile._runtime import arrays as _arrays

    return _arrays.view(x, x.shape[::-1], x.strides[::-1])


def transposed_operands(batch, m, n, k, trans_a, trans_b, dtype, seed=0):
    """A matmul kernel's arrays, A as (batch, K, M) and B as (batch, N, K) where transposed
    (row-major each, as a backward GEMM's x and w lie), and the product's operands as NumPy
    views of them."""
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((batch, k, m) if trans_a else (batch, m, k)).astype(dtype)
    b = rng.standard_normal((batch, n, k) if trans_b else (batch, k, n)).astype(dtype)
    return a, b, (a.transpose(0, 2, 1) if trans_a else a), (b.transpose(0, 2, 1) if trans_b else b)


def back(result, side: str):
    """A fused result as NumPy, checking it came back on the caller's side."""
    if isinstance(result, tuple):
        return tuple(back(r, side) for r in result)
    if side == "host":
        assert isinstance(result, np.ndarray), type(result)
        return result
    assert getattr(result, "__cuda_ndarray__", False), f"expected a device array, got {result!r}"
    return result.copy_to_host()


class Launches:
    """What :func:`counting_launches` counted: ``launches``, kernels launched in its block."""

    launches = 0


@contextlib.contextmanager
def counting_launches():
    """Count the kernels launched inside the block, on either tier.

    Simulator: its profiler's launch count. GPU: every ``kernel[grid, block, stream](...)``
    of a numba dispatcher ends in ``CUDADispatcher.call`` -> ``_Kernel.launch``, which makes
    the driver launch; wrapping ``_Kernel.launch`` counts each launch once (a dispatcher that
    forwards to a specialised one calls ``call`` twice, ``launch`` once). It sees every path
    of the library (fused runtime, hand-written kernels, matmul), unlike
    ``tessera_tile.profile()``, which times fused kernels only."""
    counted = Launches()
    if SIMULATED:
        from tessera_tile import sim

        with sim.profile() as prof:
            try:
                yield counted
            finally:
                counted.launches = prof.launches
        return
    from numba.cuda import dispatcher

    real = dispatcher._Kernel.launch  # private numba-cuda name (0.30): fails loudly if renamed

    def launch(self, *args, **kwargs):
        counted.launches += 1
        return real(self, *args, **kwargs)

    dispatcher._Kernel.launch = launch
    try:
        yield counted
    finally:
        dispatcher._Kernel.launch = real


def assert_close_rounded(got, want, rtol: float, atol: float = 0.0) -> None:
    """A result against its float64 reference ``want``: within ``rtol``/``atol``, NaN where
    ``want`` is NaN, infinities equal; where ``want`` lies within the tolerance of the result
    dtype's largest finite value, an infinity of its sign also passes (rounding there may go
    either way: float16 rounds 65,520 and above to inf)."""
    got, want = np.asarray(got), np.asarray(want, np.float64)
    largest = float(ml_dtypes.finfo(got.dtype).max)  # NumPy's finfo and bfloat16's
    near_edge = np.isfinite(want) & (np.abs(want) * (1 + rtol) + atol >= largest)
    overflowed = near_edge & np.isinf(got) & (np.sign(got) == np.sign(want))
    expected = np.where(overflowed, got.astype(np.float64), want)
    np.testing.assert_allclose(got.astype(np.float64), expected, rtol=rtol, atol=atol)


def attention_reference(q, k, v, causal: bool, scale: float) -> np.ndarray:
    """``softmax(q @ k^T * scale) @ v`` in float64 over the last two axes (..., S, D).

    ``causal``: key ``j`` is allowed for query ``i`` iff ``j <= i + Sk - Sq`` (bottom-right
    aligned, PyTorch's ``causal_lower_right``). A query row with no allowed key (``Sk = 0``, or
    causal with ``Sq > Sk``) gives 0, as PyTorch's ``scaled_dot_product_attention`` since 2.5.
    """
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    s = np.matmul(q, np.swapaxes(k, -1, -2)) * scale
    sq, sk = s.shape[-2:]
    if causal:
        allowed = np.arange(sk)[None, :] <= np.arange(sq)[:, None] + (sk - sq)
        s = np.where(allowed, s, -np.inf)
    top = s.max(axis=-1, keepdims=True, initial=-np.inf)
    top = np.where(np.isfinite(top), top, 0.0)  # a fully masked row: every weight is 0
    p = np.exp(s - top)
    total = p.sum(axis=-1, keepdims=True)
    out = np.matmul(p, v)
    return np.divide(out, total, out=np.zeros_like(out), where=total > 0)


# The PTX ISA's fragment tables, written independently of tessera_tile.mma's formulas (shared by
# the mma tests): lane l is thread l % 4 of group l >> 2.
LANES = np.arange(32)
GROUP = LANES >> 2  # groupID
TIG = LANES % 4  # threadID_in_group


def c_fragment_coords() -> np.ndarray:
    """coords[lane, i] = (row, col) of accumulator i of the 16 x 8 float32 C/D fragment (the
    same for m16n8k16 and m16n8k8): (c0, c1) at row groupID, columns 2 tig and 2 tig + 1;
    (c2, c3) the same 8 rows down."""
    out = np.empty((32, 4, 2), int)
    for reg, r0 in enumerate((0, 8)):
        for half in range(2):
            out[:, 2 * reg + half] = np.stack([GROUP + r0, 2 * TIG + half], axis=1)
    return out


def gather(matrix, coords):
    """``matrix`` at each lane's fragment coordinates."""
    return matrix[coords[..., 0], coords[..., 1]]


def assert_planned_profile(prof, plan) -> None:
    """A tensor-core matmul launch's simulator profile: conflict-free shared memory, no races or
    out-of-bounds accesses, and the global bytes of each operand as ``plan`` predicts."""
    assert prof.bank_conflicts == 0, str(prof)
    assert prof.shared_requests > 0
    assert prof.races == [] and prof.out_of_bounds == [], str(prof)
    traffic = {arg: rw for (_, arg), rw in prof.traffic.items()}
    assert traffic["a"] == [plan.bytes_a, 0]
    assert traffic["b"] == [plan.bytes_b, 0]
    assert traffic["bias"] == [plan.bytes_bias, 0]
    assert traffic["c"] == [0, plan.bytes_c]


def on_sm90a():
    """The simulator standing for an sm_90a device (on a GPU of compute capability 9.0 the
    ops choose the warpgroup-MMA kernels without being told)."""
    from tessera_tile import sim

    return sim.simulated_arch("sm_90a") if SIMULATED else contextlib.nullcontext()


def wgmma_skip(module: str):
    """A ``pytestmark`` for tests of warpgroup MMA: they run in the simulator and on GPUs of
    compute capability 9.0 (sm_90a); on another GPU they are skipped, with the reason
    printed."""
    import pytest

    reason = None
    if not SIMULATED:
        from numba import cuda

        try:
            cc = tuple(cuda.get_current_device().compute_capability)
        except Exception:  # no GPU: the tier's own skip says so
            cc = (9, 0)
        if cc[:2] != (9, 0):
            reason = f"wgmma needs compute capability 9.0 (sm_90a); this GPU has {cc[0]}.{cc[1]}"
    if reason:
        print(f"\n{module} skipped: {reason}")
    return pytest.mark.skipif(reason is not None, reason=reason or "")


def launch_kinds():
    """Fused functions with one launch of each kind a direct launch packs: a row chain with a
    scalar argument, a column reduction (its partials and ticket) and a GEMM with an epilogue
    (a tuple of extras). ``(scaled_softmax, column_var, epilogue)``; the NumPy twin of
    ``epilogue(x, w, s, r)`` is ``np.maximum(x @ w, 0) * s + r``."""
    import tessera_tile as tt

    @tt.fuse
    def scaled_softmax(x, s):
        e = tt.exp(x - tt.max(x, axis=-1, keepdims=True))
        return e / tt.sum(e, axis=-1, keepdims=True) * s

    @tt.fuse
    def column_var(x):
        return tt.var(x, axis=0)

    @tt.fuse
    def epilogue(x, w, s, r):
        return tt.maximum(x @ w, 0) * s + r

    return scaled_softmax, column_var, epilogue


class Interface:
    """Any library's device array: nothing but ``__cuda_array_interface__``, describing the
    memory of a numba device array (in the simulator, whose device memory is host memory, it
    is made from the fake device array's host buffer)."""

    def __init__(self, device_array, **extra):
        self.device_array = device_array  # keeps the memory alive
        if hasattr(device_array, "__cuda_array_interface__"):
            cai = dict(device_array.__cuda_array_interface__)
        else:
            host = device_array._ary
            cai = {
                "shape": host.shape,
                "typestr": host.dtype.str,
                "data": (host.__array_interface__["data"][0], False),
                "strides": host.strides,
            }
        self.__cuda_array_interface__ = {**cai, "version": 3, "stream": None, **extra}


def expression_trees(leaves: list, unary, binary, max_leaves: int):
    """A hypothesis strategy of expression trees: a leaf of ``leaves``, ``(name, tree)`` for a
    name of ``unary`` or ``(name, tree, tree)`` for one of ``binary`` (each a dict by name)."""
    from hypothesis import strategies as st

    return st.recursive(
        st.sampled_from(leaves),
        lambda sub: st.one_of(
            st.tuples(st.sampled_from(sorted(unary)), sub),
            st.tuples(st.sampled_from(sorted(binary)), sub, sub),
        ),
        max_leaves=max_leaves,
    )
