"""Prebuilt fused ops on CuPy arrays, numba device arrays and NumPy arrays.

The public entry of the kernels in :mod:`tessera_tile.kernels`: each op validates its arguments
(reading each once, see ``tessera_tile._arrays``), allocates its results, chooses a launch
configuration and dispatches; it has ``.explain()`` and ``.inspect()``. The ops themselves
arrive with the prebuilt-ops work (softmax, norms, cross-entropy, reductions, transpose, matmul,
attention).
"""

__all__: list[str] = []
