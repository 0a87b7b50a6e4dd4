"""A training step of a small classifier, forward and backward, with the prebuilt ops and
``tt.vjp``: ``loss = cross_entropy(mlp(layer_norm(x)), targets)``, then SGD.

Each op's ``tt.vjp`` returns its result and a pullback; the backward chains the pullbacks in
reverse (cross-entropy's one pass over the logits, the MLP's backward GEMMs, layer norm's
hand-written kernel), and one fused function applies every update. The arrays are numba
device arrays (in the simulator, its own); nothing is copied through the host but the loss.

Checked against NumPy: every parameter's gradient against central differences of the same
model in float64 (16 entries per parameter), and the loss falls over two steps, each step's
loss that of the float64 model at the same parameters. (`make demo` runs both checks; the
tests run the demo.)
"""

import numpy as np

import tessera_tile as tt
from tessera_tile import ops

KERNELS = []  # none of its own: the ops' and the fused update's
ROWS, WIDTH, HIDDEN, CLASSES = 16, 32, 64, 10
NAMES = ("gamma", "beta", "w1", "b1", "w2", "b2")
# float32 against float64 central differences (step 1e-6, about 1e-9 accurate): a few float32
# roundings of each gradient, relative to its largest entry
RTOL = 1e-4


@tt.fuse
def sgd(p, g, lr):
    return p - lr * g


def step(x, targets, params, lr=0.5):
    """One training step on device arrays: the loss (a Python float), then the parameters
    updated in place of the old ones (a new tuple) and the gradients."""
    gamma, beta, w1, b1, w2, b2 = params
    h, ln_pullback = tt.vjp(ops.layer_norm, x, gamma, beta)
    logits, mlp_pullback = tt.vjp(ops.mlp, h, w1, b1, w2, b2)
    loss, ce_pullback = tt.vjp(ops.cross_entropy, logits, targets)
    dlogits, _ = ce_pullback(1.0)
    dh, dw1, db1, dw2, db2 = mlp_pullback(dlogits)
    _, dgamma, dbeta = ln_pullback(dh)
    grads = (dgamma, dbeta, dw1, db1, dw2, db2)
    return float(np.asarray(loss.copy_to_host())), tuple(map(sgd, params, grads, [lr] * 6)), grads


def loss64(x, targets, gamma, beta, w1, b1, w2, b2) -> float:
    """The same model in float64 NumPy."""
    from math import erf

    d = x - x.mean(-1, keepdims=True)
    h = d / np.sqrt((d * d).mean(-1, keepdims=True) + 1e-5) * gamma + beta
    z = h @ w1 + b1
    z = 0.5 * z * (1 + np.vectorize(erf)(z / np.sqrt(2)))
    logits = z @ w2 + b2
    m = logits.max(-1, keepdims=True)
    lse = m[:, 0] + np.log(np.exp(logits - m).sum(-1))
    return float((lse - logits[np.arange(len(targets)), targets]).mean())


def inputs(seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((ROWS, WIDTH)).astype(np.float32)
    targets = rng.integers(0, CLASSES, ROWS)
    params = (
        rng.uniform(0.5, 1.5, WIDTH),
        rng.standard_normal(WIDTH) * 0.1,
        rng.standard_normal((WIDTH, HIDDEN)) / np.sqrt(WIDTH),
        np.zeros(HIDDEN),
        rng.standard_normal((HIDDEN, CLASSES)) / np.sqrt(HIDDEN),
        np.zeros(CLASSES),
    )
    return x, targets, tuple(p.astype(np.float32) for p in params), rng


def gradients_match() -> float:
    """Every parameter's gradient against central differences in float64: the largest error
    relative to that gradient's largest entry."""
    x, targets, params, rng = inputs()
    _, _, grads = step(tt.to_device(x), tt.to_device(targets), [tt.to_device(p) for p in params])
    wide = [p.astype(np.float64) for p in params]
    worst = 0.0
    for i, (name, g) in enumerate(zip(NAMES, grads, strict=True)):
        got = g.copy_to_host()
        scale = np.abs(got).max()
        for j in map(tuple, rng.integers(0, got.shape, (16, got.ndim))):
            up, down = [p.copy() for p in wide], [p.copy() for p in wide]
            up[i][j] += 1e-6
            down[i][j] -= 1e-6
            x64 = x.astype(np.float64)
            want = (loss64(x64, targets, *up) - loss64(x64, targets, *down)) / 2e-6
            error = abs(float(got[j]) - want) / scale
            assert error < RTOL, f"d loss / d {name}{list(j)}: {got[j]} against {want}"
            worst = max(worst, error)
    return worst


def loss_falls() -> float:
    """Two steps of SGD on device arrays: the loss falls, and each step's loss is the float64
    model's at the same parameters; returns the largest relative difference."""
    x, targets, params, _ = inputs(seed=1)
    xd, td, params = tt.to_device(x), tt.to_device(targets), [tt.to_device(p) for p in params]
    losses, worst = [], 0.0
    for _ in range(2):
        host = [p.copy_to_host().astype(np.float64) for p in params]
        loss, params, _ = step(xd, td, params)
        want = loss64(x.astype(np.float64), targets, *host)
        worst = max(worst, abs(loss - want) / want)
        losses.append(loss)
    assert all(b < a for a, b in zip(losses, losses[1:], strict=False)), losses
    assert worst < RTOL, f"a step's loss is {worst:.3g} from float64's"
    return worst


def compile_reports(arch: str) -> list:
    """What the backward's kernels compile to for ``arch`` (NumPy stand-ins: nothing runs)."""
    x, targets, (gamma, beta, w1, b1, w2, b2), _ = inputs()
    logits = np.zeros((ROWS, CLASSES), np.float32)
    return [
        *ops.cross_entropy.inspect(logits, targets, arch=arch, backward=True),
        *ops.mlp.inspect(x, w1, b1, w2, b2, arch=arch, backward=True),
        *ops.layer_norm.inspect(x, gamma, beta, arch=arch, backward=True),
    ]


def checks() -> list:
    return [
        ("training_step gradients vs differences", gradients_match),
        ("training_step SGD loss (float64's)", loss_falls),
    ]


if __name__ == "__main__":
    for label, check in checks():
        print(f"{label}: {check():.3g}")
