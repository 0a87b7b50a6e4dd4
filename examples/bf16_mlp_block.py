"""A transformer MLP block in bfloat16 on device arrays:
``layer_norm(x + linear(linear(x, w1, b1, "gelu"), w2, b2))``.

The two products run on the bfloat16 tensor cores (the bias and gelu fused into the first one's
epilogue), the residual add is a ``@tt.fuse`` function, and the layer norm a fused row kernel;
every step computes in float32 and rounds once to bfloat16. The arrays are numba device arrays
made by ``tt.to_device`` (numba-cuda's ``cuda.to_device`` cannot copy bfloat16: NumPy does not
export it through the buffer protocol); in the simulator
(``NUMBA_ENABLE_CUDASIM=1 python examples/bf16_mlp_block.py``) its own.
The result is checked against the same block computed in float64 with NumPy.
"""

import ml_dtypes
import numpy as np

import tessera_tile as tt
from tessera_tile import ops

BF16 = ml_dtypes.bfloat16
# four roundings to bfloat16 (the hidden activation, the second product, the residual sum, the
# output), each within 2^-8 of its value: the block within 4 * 2^-8 of float64, relatively
BOUND = 4 * 2**-8


KERNELS = []  # none of its own: the ops' and the fused function's, in compile_reports


@tt.fuse
def residual(y, x):
    return y + x


def block(x, w1, b1, w2, b2, gamma, beta):
    h = ops.linear(x, w1, b1, "gelu")
    return ops.layer_norm(residual(ops.linear(h, w2, b2), x), gamma, beta)


def reference(x, w1, b1, w2, b2, gamma, beta):
    from tessera_tile.kernels import epilogue

    x, w1, b1, w2, b2, gamma, beta = (
        a.astype(np.float64) for a in (x, w1, b1, w2, b2, gamma, beta)
    )
    y = epilogue.reference("gelu", x @ w1 + b1) @ w2 + b2 + x
    mean, var = y.mean(-1, keepdims=True), y.var(-1, keepdims=True)
    return (y - mean) / np.sqrt(var + 1e-5) * gamma + beta


def inputs(tokens: int = 32, width: int = 64, hidden: int = 128, seed: int = 0):
    rng = np.random.default_rng(seed)
    shapes = [(tokens, width), (width, hidden), (hidden,), (hidden, width), (width,)]
    x, w1, b1, w2, b2 = (rng.standard_normal(s) / np.sqrt(s[0]) for s in shapes)
    gamma, beta = rng.uniform(0.5, 1.5, width), rng.standard_normal(width)
    return [a.astype(BF16) for a in (x * 8, w1, b1, w2, b2, gamma, beta)]


def compile_reports(arch: str) -> list:
    """What the block's kernels compile to for ``arch`` (NumPy stand-ins: nothing runs)."""
    x, w1, b1, w2, b2, gamma, beta = inputs()
    h = np.zeros((x.shape[0], w1.shape[1]), BF16)
    return [
        *ops.linear.inspect(x, w1, b1, "gelu", arch=arch),
        *ops.linear.inspect(h, w2, b2, arch=arch),
        *residual.inspect(x, x, arch=arch),
        *ops.layer_norm.inspect(x, gamma, beta, arch=arch),
    ]


def run(**shape) -> float:
    """The block on device arrays, checked against float64: its relative (Frobenius) error."""
    host = inputs(**shape)
    got = block(*(tt.to_device(a) for a in host)).copy_to_host()
    assert got.dtype == BF16
    want = reference(*host)
    error = float(np.linalg.norm(got.astype(np.float64) - want) / np.linalg.norm(want))
    assert error < BOUND, f"relative error {error:.3g} past {BOUND:.3g}"
    return error


if __name__ == "__main__":
    error = run()
    print(f"bfloat16 MLP block (linear + gelu, linear, residual, layer norm): error {error:.2e}")
