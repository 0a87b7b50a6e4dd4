"""Hand-written kernels, one module per family (cross-entropy, transpose, long-row layer norm,
matmul, attention), built from the tile primitives alone, and the plans of the matmul and
attention families (validation, tuners, kernel choice, launches: ``matmul_calls``,
``matmul_plan``, ``matmul_choice``, ``matmul_geometry``, ``attention_plan``, on the hand-written
call of ``_calls``), which both the ops and the composer's GEMM and attention stages use.

Where the composer already makes the best kernel, an op is a fused definition instead
(:mod:`tessera_tile.ops._definitions`); :mod:`tessera_tile.ops` validates arguments, allocates
results and dispatches to one or the other.
"""
