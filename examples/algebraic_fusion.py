"""Operators in algebraic form: matmuls inside ``@tt.fuse``, the planner finds the kernels.

* ``linear_residual``: ``gelu(x @ w + b) * scale + r``: one GEMM kernel, the bias added to the
  accumulator, gelu, the scale (a run-time argument) and the residual in its epilogue; the
  product is never written.
* ``gated_mlp``: ``silu(x @ w1) * (x @ w3)``, a gated MLP's hidden layer: one kernel computes
  both products on the same tiles of ``x`` (read once for the two) and applies silu and the
  product in its epilogue; neither product is written.
* ``attention``: ``softmax(q @ tt.swapaxes(k, -1, -2) * scale) @ v``: found from its algebra
  and run by the flash-attention kernel; the score matrix is never written.
* ``scaled``: ``(x * sx) @ (w * sw)``, per-row scales of ``x`` and per-column scales of ``w``
  (as a quantized layer has them): the same all along K, so they move onto the accumulator,
  ``sx * (x @ w) * sw``, one GEMM kernel; no scaled operand is written.
* ``relu_in``: ``tt.relu(x) @ w``: an operand computed from one array, a *prologue*: the GEMM
  kernel applies relu to each tile of ``x`` as it lands in shared memory; ``relu(x)`` is never
  written.

Each runs on float16 device arrays and is checked against NumPy in float64; ``explain()`` says
what the planner did. Run it with ``python examples/algebraic_fusion.py`` (add
``NUMBA_ENABLE_CUDASIM=1`` without a GPU).
"""

import numpy as np

import tessera_tile as tt


@tt.fuse
def linear_residual(x, w, b, r, scale):
    return tt.gelu(x @ w + b) * scale + r


@tt.fuse
def gated_mlp(x, w1, w3):
    return tt.silu(x @ w1) * (x @ w3)


@tt.fuse
def scaled(x, w, sx, sw):
    return (x * sx) @ (w * sw)


@tt.fuse
def relu_in(x, w):
    return tt.relu(x) @ w


@tt.fuse
def attention(q, k, v):
    s = q @ tt.swapaxes(k, -1, -2) * 0.125
    e = tt.exp(s - tt.max(s, axis=-1, keepdims=True))
    return e / tt.sum(e, axis=-1, keepdims=True) @ v


def gelu(v):
    from math import erf

    return 0.5 * v * (1 + np.vectorize(erf)(v / np.sqrt(2)))


def inputs(seed: int = 0):
    rng = np.random.default_rng(seed)

    def f16(*shape, scale=1.0):
        return (rng.standard_normal(shape) * scale).astype(np.float16)

    x, r = f16(48, 64), f16(48, 40)
    w, w1, w3 = f16(64, 40, scale=0.125), f16(64, 40, scale=0.125), f16(64, 40, scale=0.125)
    b = f16(40)
    q, k, v = f16(2, 32, 64), f16(2, 48, 64), f16(2, 48, 64)
    sx, sw = f16(48, 1, scale=0.5), f16(40, scale=0.5)
    return x, w, b, r, w1, w3, q, k, v, sx, sw


def references(x, w, b, r, w1, w3, q, k, v, sx, sw):
    x, w, b, r, w1, w3, q, k, v, sx, sw = (
        a.astype(np.float64) for a in (x, w, b, r, w1, w3, q, k, v, sx, sw)
    )
    h1, h3 = x @ w1, x @ w3
    s = q @ np.swapaxes(k, -1, -2) * 0.125
    p = np.exp(s - s.max(-1, keepdims=True))
    return (
        gelu(x @ w + b) * 0.5 + r,
        h1 / (1 + np.exp(-h1)) * h3,
        p / p.sum(-1, keepdims=True) @ v,
        (x * sx) @ (w * sw),
        np.maximum(x, 0) @ w,
    )


CALLS = {
    "linear_residual": lambda d: linear_residual(*(d[i] for i in (0, 1, 2, 3)), 0.5),
    "gated_mlp": lambda d: gated_mlp(d[0], d[4], d[5]),
    "attention": lambda d: attention(*d[6:9]),
    "scaled": lambda d: scaled(d[0], d[1], d[9], d[10]),
    "relu_in": lambda d: relu_in(d[0], d[1]),
}


def check(name: str) -> float:
    """One function on device arrays against float64 NumPy; the largest relative error."""
    host = inputs()
    want = dict(zip(CALLS, references(*host), strict=True))[name]
    got = CALLS[name]([tt.to_device(a) for a in host]).copy_to_host().astype(np.float64)
    error = float(np.abs(got - want).max() / np.abs(want).max())
    # float16 results: rounded once (2^-11), from float32 arithmetic; attention rounds P too
    # (and NumPy's scaled operands, in float64 here, are not rounded: the kernel scales the
    # float32 accumulator)
    assert error < 4 * 2.0**-11, f"{name}: relative error {error:.3g}"
    return error


def checks() -> list:
    return [(f"algebraic_fusion {name}", lambda name=name: check(name)) for name in CALLS]


KERNELS: list = []  # the matmul ops' and the flash kernel; compile_reports() shows them


def compile_reports(arch: str):
    x, w, b, r, w1, w3, q, k, v, sx, sw = inputs()
    return (
        linear_residual.inspect(x, w, b, r, 0.5, arch=arch)
        + gated_mlp.inspect(x, w1, w3, arch=arch)
        + attention.inspect(q, k, v, arch=arch)
        + scaled.inspect(x, w, sx, sw, arch=arch)
        + relu_in.inspect(x, w, arch=arch)
    )


def main() -> None:
    x, w, b, r, w1, w3, q, k, v, sx, sw = inputs()
    for title, report in (
        ("gelu(x @ w + b) * scale + r", linear_residual.explain(x, w, b, r, 0.5)),
        ("silu(x @ w1) * (x @ w3)", gated_mlp.explain(x, w1, w3)),
        ("softmax(q @ k^T * 0.125) @ v", attention.explain(q, k, v)),
        ("(x * sx) @ (w * sw)", scaled.explain(x, w, sx, sw)),
        ("relu(x) @ w", relu_in.explain(x, w)),
    ):
        print(f"== {title}\n{report}\n")
    for label, run in checks():
        print(f"{label}: relative error {run():.2e} against float64 NumPy")


if __name__ == "__main__":
    main()
