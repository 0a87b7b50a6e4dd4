"""Hand-written kernels, one module per family (cross-entropy, transpose, long-row layer norm,
matmul, attention), built from the tile primitives alone.

Where the composer already makes the best kernel, an op is a fused definition instead
(:mod:`tessera_tile.ops._definitions`); :mod:`tessera_tile.ops` validates arguments, allocates
results and dispatches to one or the other.
"""
