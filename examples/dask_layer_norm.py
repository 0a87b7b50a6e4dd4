"""Layer norm and a fused softmax on Dask arrays, on a local cluster, checked against NumPy.

NUMBA_ENABLE_CUDASIM=1 python examples/dask_layer_norm.py   # no GPU: worker processes
                                                            # run the simulator
python examples/dask_layer_norm.py                          # GPUs: a LocalCUDACluster
                                                            # (dask_cuda) with CuPy chunks

Without dask_cuda on a GPU machine it runs a LocalCluster of NumPy chunks (each worker's kernels
on its GPU). ``make demo`` runs :func:`run`.
"""

from __future__ import annotations

import os

import numpy as np

KERNELS: list = []  # the ops' and the composer's kernels, per chunk


def _cluster(simulated: bool):
    """(cluster, array module of the chunks)."""
    import distributed

    if not simulated:
        try:
            import cupy
            from dask_cuda import LocalCUDACluster

            return LocalCUDACluster(), cupy
        except ImportError:
            pass
    local = distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0"
    )
    return local, np


@np.errstate(all="ignore")
def run() -> float:
    """Layer norm and softmax of a Dask array split along rows and columns, against float64
    NumPy; the largest absolute error."""
    import dask.array as da
    import distributed

    import tessera_tile as tt
    import tessera_tile.dask as ttd

    @tt.fuse
    def softmax(x):
        e = tt.exp(x - tt.max(x, axis=-1, keepdims=True))
        return e / tt.sum(e, axis=-1, keepdims=True)

    simulated = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"
    cluster, xp = _cluster(simulated)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((96, 128)).astype(np.float32)
    w = rng.uniform(0.5, 1.5, 128).astype(np.float32)
    b = rng.standard_normal(128).astype(np.float32)
    with cluster, distributed.Client(cluster) as client:
        X = da.from_array(xp.asarray(x), chunks=(32, 64), asarray=False)  # rows and columns split
        y = ttd.layer_norm(X, xp.asarray(w), xp.asarray(b))
        s = softmax(X)  # a fused function on a Dask array: a Dask array
        y, s = (client.compute(a).result() for a in (y, s))
    y, s = (a.get() if hasattr(a, "get") else a for a in (y, s))
    x64 = x.astype(np.float64)
    ref_y = (x64 - x64.mean(-1, keepdims=True)) / np.sqrt(x64.var(-1, keepdims=True) + 1e-5)
    ref_y = ref_y * w + b
    e = np.exp(x64 - x64.max(-1, keepdims=True))
    ref_s = e / e.sum(-1, keepdims=True)
    err = max(np.abs(y - ref_y).max(), np.abs(s - ref_s).max())
    assert np.allclose(y, ref_y, rtol=2e-4, atol=1e-5), "layer norm differs from NumPy"
    assert np.allclose(s, ref_s, rtol=2e-4, atol=1e-6), "softmax differs from NumPy"
    return float(err)


if __name__ == "__main__":
    print(f"dask layer_norm + fused softmax: matches NumPy, max abs error {run():.2e}")
