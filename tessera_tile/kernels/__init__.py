"""Prebuilt kernels, one module per family (reductions, norms, transpose, matmul, attention).

Each module holds the kernels of its family and the fused definitions the composer builds them
from, where the composer already makes the best kernel; :mod:`tessera_tile.ops` validates
arguments, allocates results and dispatches here.
"""
