"""mma.pack_f16x2: two float32 rounded to float16 (nearest even) in one register, ``lo`` in the
low 16 bits, as ``cvt.rn.f16x2.f32 d, hi, lo`` (PTX ISA: the first source goes to the upper
half). The attention kernel's P @ V relies on this order (tests/ops/test_ops_attention.py)."""

import numpy as np
from numba import cuda

from tessera_tile.mma import pack_f16x2


@cuda.jit
def pack_pairs(x, out):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = pack_f16x2(x[2 * i], x[2 * i + 1])


def test_pack_rounds_to_nearest_even_low_half_first():
    special = [1.0, -2.5, 65504.0, 65520.0, 1e-8, -0.0, 6e-8, np.inf, -70000.0, 1 + 2**-11]
    rng = np.random.default_rng(0)
    x = np.concatenate([special, rng.standard_normal(54) * 100]).astype(np.float32)
    out = np.zeros(x.size // 2, np.uint32)
    pack_pairs[1, 32](x, out)
    with np.errstate(over="ignore"):
        halves = x.astype(np.float16).view(np.uint16).astype(np.uint32)
    np.testing.assert_array_equal(out, halves[0::2] | (halves[1::2] << 16))
