"""The prebuilt ops of ``tessera_tile.ops`` (all but the matmul family: docs/matmul.md) on device
arrays, checked against NumPy, with the global traffic each one moves.

On a GPU the arrays are CuPy arrays (numba device arrays without CuPy): CuPy in, CuPy out,
nothing copied through the host by the ops. Without one, run it in the simulator
(``NUMBA_ENABLE_CUDASIM=1 python examples/ops_demo.py``): ``cuda.to_device`` gives the
simulator's device arrays, the same device path runs, and the traffic column is *measured* by
the simulator's profiler (on a GPU it shows the planned bytes, which the simulator tier checks
equal the measured ones).
"""

import numpy as np
from numba import cuda

from tessera_tile import ops
from tessera_tile._runtime import config as _config


def to_device(a):
    """CuPy when a GPU and CuPy are there, else numba (the simulator's) device arrays."""
    if not _config.SIMULATED:
        try:
            import cupy

            return cupy.asarray(a)
        except ImportError:
            pass
    return cuda.to_device(a)


def to_host(a):
    return a.get() if hasattr(a, "get") else a.copy_to_host()


def softmax_ref(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def attention_ref(q, k, v):
    """Causal attention, bottom-right aligned (key j visible to query i iff j <= i + Sk - Sq)."""
    q, k, v = (a.astype(np.float64) for a in (q, k, v))
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    sq, sk = s.shape[-2:]
    s = np.where(np.arange(sk) <= np.arange(sq)[:, None] + (sk - sq), s, -np.inf)
    return softmax_ref(s) @ v


def cases(rows: int = 8, cols: int = 300, seed: int = 0):
    """(name, op, host args, kwargs, float64 NumPy reference) for every op."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, cols)).astype(np.float32)
    w = rng.uniform(0.5, 1.5, cols).astype(np.float32)
    b = rng.standard_normal(cols).astype(np.float32)
    t = rng.integers(0, cols, rows)
    x64 = x.astype(np.float64)
    mu, var = x64.mean(-1, keepdims=True), x64.var(-1, keepdims=True)
    rms = x64 / np.sqrt((x64**2).mean(-1, keepdims=True) + 1e-6) * w
    lse = np.log(np.exp(x64 - x64.max(-1, keepdims=True)).sum(-1)) + x64.max(-1)
    ce = lse - x64[np.arange(rows), t]
    q, k, v = (rng.standard_normal((2, n, 32)).astype(np.float32) for n in (40, 50, 50))
    return [
        ("softmax", ops.softmax, (x,), {}, softmax_ref(x64)),
        ("log_softmax", ops.log_softmax, (x,), {}, np.log(softmax_ref(x64))),
        ("layer_norm", ops.layer_norm, (x, w, b), {}, (x64 - mu) / np.sqrt(var + 1e-5) * w + b),
        ("rms_norm", ops.rms_norm, (x, w), {}, rms),
        ("cross_entropy", ops.cross_entropy, (x, t), {}, ce.mean()),
        ("sum", ops.sum, (x,), {"axis": -1}, x64.sum(-1)),
        ("mean", ops.mean, (x,), {"axis": 0}, x64.mean(0)),
        ("max", ops.max, (x,), {}, x64.max()),
        ("min", ops.min, (x,), {"axis": 1}, x64.min(1)),
        ("var", ops.var, (x,), {"axis": -1}, x64.var(-1)),
        ("std", ops.std, (x,), {"axis": -1}, x64.std(-1)),
        ("argmax", ops.argmax, (x,), {"axis": -1}, x.argmax(-1)),
        ("argmin", ops.argmin, (x,), {"axis": 0}, x.argmin(0)),
        ("transpose", ops.transpose, (x,), {}, x64.T),
        ("attention", ops.attention, (q, k, v), {"causal": True}, attention_ref(q, k, v)),
    ]  # fmt: skip


def check(name, op, args, kwargs, want):
    """One op on device arrays against NumPy (asserted, rtol and atol 2e-5); returns the
    largest relative error and the result."""
    d_result = op(*[to_device(a) for a in args], **kwargs)
    got = to_host(d_result)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5, err_msg=name)
    return float(np.max(np.abs(got - want) / (1 + np.abs(want)), initial=0.0)), d_result


def checks(rows: int = 8, cols: int = 300, seed: int = 0) -> list:
    """``(label, check)`` per op for the demo: ``check()`` returns the largest relative error."""
    return [
        (f"ops.{case[0]}", lambda case=case: check(*case)[0]) for case in cases(rows, cols, seed)
    ]


def run(rows: int = 8, cols: int = 300, seed: int = 0, show: bool = False) -> float:
    """Every op on device arrays against NumPy; returns the largest relative error. With
    ``show``, prints the traffic table."""
    from tessera_tile import sim

    worst, lines = 0.0, []
    for name, op, args, kwargs, want in cases(rows, cols, seed):
        if _config.SIMULATED:
            with sim.profile() as prof:
                err, d_result = check(name, op, args, kwargs, want)
            moved = prof.bytes_read + prof.bytes_written
        else:
            err, d_result = check(name, op, args, kwargs, want)
            moved = op.explain(*args, **kwargs).bytes_fused
        worst = max(worst, err)
        ex = op.explain(*args, **kwargs)
        minimum = sum(a.nbytes for a in args) + np.asarray(to_host(d_result)).nbytes
        lines.append((name, type(d_result).__name__, ex.kernels, moved, minimum, ex.bytes_unfused))
    if show:
        what = "measured (simulator)" if _config.SIMULATED else "planned"
        print(f"{'op':14} {'result':18} {'kernels':>7} {what + ' B':>24} {'minimum B':>10} "
              f"{'unfused B':>10}")  # fmt: skip
        for name, kind, k, moved, minimum, unfused in lines:
            print(f"{name:14} {kind:18} {k:7} {moved:24} {minimum:10} {unfused:10}")
    return worst


KERNELS: list = []  # the ops' kernels are listed in the compile tier's cases; see below


def compile_reports(arch: str):
    """What three of the ops compile to (no GPU needed)."""
    x = np.zeros((8, 300), np.float32)
    return (
        ops.softmax.inspect(x, arch=arch)
        + ops.cross_entropy.inspect(x, np.zeros(8, np.int64), reduction="none", arch=arch)
        + ops.transpose.inspect(x, arch=arch)
    )


def main() -> None:
    err = run(show=True)
    print(f"every op on device arrays matches NumPy (largest relative error {err:.1e})")


if __name__ == "__main__":
    main()
