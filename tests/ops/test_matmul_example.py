"""examples/matmul.py: every variant against NumPy, and a clean simulator profile.

Sizes straddle the 64 x 64 block tile and the 16-wide K step (0, 1, n-1, n, n+1); the 16-byte-copy
variants need K and N multiples of 4. Simulated launches cost ~0.2 s per block and K step, so the
sizes stay small and each variant gets a few examples.
"""

import numpy as np
import pytest
from helpers import load_example
from hypothesis import example, given, settings
from hypothesis import strategies as st

mm = load_example("matmul")

ANY = st.sampled_from([0, 1, 15, 16, 17, 33])  # K: 0, 1, around the 16-wide step, 3 steps
EDGE = st.sampled_from([0, 1, 31, 63, 64, 65])  # M, N: around the 64-wide tile
BY4 = st.sampled_from([0, 4, 12, 16, 20, 36])  # K for 16-byte copies
EDGE4 = st.sampled_from([0, 4, 60, 64, 68])  # N for 16-byte copies


def check(m: int, n: int, k: int, variant: str, seed: int) -> None:
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((m, k), dtype=np.float32)
    b = rng.standard_normal((k, n), dtype=np.float32)
    c = mm.matmul(a, b, variant)
    assert c.shape == (m, n) and c.dtype == np.float32
    np.testing.assert_allclose(c, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("variant", ["sync", "2stage", "3stage"])
@settings(max_examples=6)
@given(m=EDGE, n=EDGE, k=ANY, seed=st.integers(0, 2**16))
@example(m=1, n=1, k=0, seed=0)
@example(m=65, n=1, k=17, seed=0)
def test_matmul_any_shape_matches_numpy(variant, m, n, k, seed):
    check(m, n, k, variant, seed)


@settings(max_examples=6)
@given(m=EDGE, n=EDGE4, k=BY4, seed=st.integers(0, 2**16))
@example(m=65, n=68, k=20, seed=0)
def test_matmul_3stage_v16_matches_numpy(m, n, k, seed):
    check(m, n, k, "3stage_v16", seed)


@settings(max_examples=3)
@given(m=st.sampled_from([1, 37, 129]), n=st.sampled_from([4, 68]), k=st.sampled_from([4, 12]))
def test_matmul_3stage_8x8_matches_numpy(m, n, k):
    check(m, n, k, "3stage_8x8", 0)


def test_k_zero_gives_zeros():
    for variant in mm.VARIANTS:
        c = mm.matmul(np.ones((3, 0), np.float32), np.ones((0, 8), np.float32), variant)
        np.testing.assert_array_equal(c, np.zeros((3, 8), np.float32))


def test_auto_picks_16_byte_copies_only_when_rows_are_aligned():
    a = np.zeros((4, 8), np.float32)
    assert mm.vectorizable(a, np.zeros((8, 4), np.float32))
    assert not mm.vectorizable(a, np.zeros((8, 5), np.float32))
    with pytest.raises(ValueError, match="multiples of 4"):
        mm.matmul(a, np.zeros((8, 5), np.float32), "3stage_v16")
    with pytest.raises(ValueError, match=r"\(M, K\) @ \(K, N\)"):
        mm.matmul(a, np.zeros((7, 4), np.float32))


@pytest.mark.sim_only(
    reason="the profiler measures traffic and bank conflicts in the simulator only"
)
@pytest.mark.parametrize(
    ("variant", "m", "n", "k"), [("3stage", 65, 20, 33), ("3stage_v16", 20, 68, 20)]
)
def test_matmul_profile_is_clean(variant, m, n, k):
    from tessera_tile import sim

    rng = np.random.default_rng(1)
    a = rng.standard_normal((m, k), dtype=np.float32)
    b = rng.standard_normal((k, n), dtype=np.float32)
    with sim.profile() as prof:
        c = mm.matmul(a, b, variant)
    np.testing.assert_allclose(c, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)
    assert prof.bank_conflicts == 0, prof
    assert not prof.races, prof
    assert not prof.out_of_bounds, prof
    kernel = f"matmul_{variant}"
    blocks_n = -(-n // mm.TILE_N)
    # Each block reads its panels once; C is written exactly once.
    assert prof.traffic[(kernel, "a")] == [m * k * 4 * blocks_n, 0]
    assert prof.traffic[(kernel, "c")] == [0, m * n * 4]
