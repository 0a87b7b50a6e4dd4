"""@tt.fuse on chains that cupy.fuse cannot fuse: softmax and layer norm.

Each needs reductions whose results are broadcast back over the rows (a max and a sum for
softmax, a mean and a variance for layer norm). ``cupy.fuse`` allows one reduction and no
broadcast back; ``@tt.fuse`` makes one kernel that reads each row from memory once when it fits
on chip, and ``explain()`` says what it did.

The arrays live on the device, as a user's CuPy or numba arrays do: device arrays in, device
arrays out, nothing copied through the host by the fused calls (in the simulator,
``cuda.to_device`` gives its device arrays and the same path runs).

Run it with ``python examples/fused_softmax.py`` (add ``NUMBA_ENABLE_CUDASIM=1`` without a GPU).
"""

import numpy as np
from numba import cuda

import tessera_tile as tt


@tt.fuse
def softmax(x):
    m = tt.max(x, axis=-1, keepdims=True)
    e = tt.exp(x - m)
    return e / tt.sum(e, axis=-1, keepdims=True)


@tt.fuse
def layer_norm(x, gamma, beta):
    mu = tt.mean(x, axis=-1, keepdims=True)
    var = tt.var(x, axis=-1, keepdims=True)
    return (x - mu) * tt.rsqrt(var + 1e-5) * gamma + beta


def softmax_reference(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def layer_norm_reference(x, gamma, beta):
    mu = x.mean(axis=-1, keepdims=True)
    return (x - mu) / np.sqrt(x.var(axis=-1, keepdims=True) + np.float32(1e-5)) * gamma + beta


def inputs(rows: int = 16, cols: int = 1000, seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, cols)).astype(np.float32)
    gamma = rng.uniform(0.5, 1.5, cols).astype(np.float32)
    beta = rng.standard_normal(cols).astype(np.float32)
    return x, gamma, beta


def run(rows: int = 16, cols: int = 1000, seed: int = 0) -> float:
    """Both fused functions on device arrays, against NumPy; returns the largest error."""
    x, gamma, beta = inputs(rows, cols, seed)
    d_x, d_gamma, d_beta = (cuda.to_device(a) for a in (x, gamma, beta))
    y = softmax(d_x).copy_to_host()  # device in, device out: copied back only to compare
    np.testing.assert_allclose(y, softmax_reference(x), rtol=1e-5, atol=1e-7)
    z = layer_norm(d_x, d_gamma, d_beta).copy_to_host()
    np.testing.assert_allclose(z, layer_norm_reference(x, gamma, beta), rtol=1e-4, atol=1e-5)
    errors = (y - softmax_reference(x), z - layer_norm_reference(x, gamma, beta))
    return float(max(np.abs(e).max(initial=0.0) for e in errors))


KERNELS: list = []  # @tt.fuse generates its kernels; compile_reports() shows them


def compile_reports(arch: str):
    """What the generated kernels compile to (no GPU needed)."""
    x, gamma, beta = inputs()
    return softmax.inspect(x, arch=arch) + layer_norm.inspect(x, gamma, beta, arch=arch)


def main() -> None:
    x, gamma, beta = inputs()
    print(softmax.explain(x))
    d_y = softmax(cuda.to_device(x))
    print(f"device array in, {type(d_y).__name__} out, shape {d_y.shape}")
    print(f"softmax and layer norm of {x.shape} float32: max |error| vs NumPy = {run():.2e}")


if __name__ == "__main__":
    main()
