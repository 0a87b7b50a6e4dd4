"""TileConfig: validation on construction, value identity, and the default model's choices.
Pure Python: runs in every tier without launching anything."""

import pickle

import numpy as np
import pytest

import tessera_tile as tt
from tessera_tile import TileConfig
from tessera_tile.inspect import ARCHS
from tessera_tile.tile_config import (
    CANDIDATES,
    STATIC_SHARED_LIMIT,
    WGMMA_CANDIDATES,
    blocks_per_sm,
    default_config,
    estimate,
)


def test_exported_frozen_and_hashed_by_value():
    assert tt.TileConfig is TileConfig
    a, b = TileConfig(128, 128, 8, 8, 3), TileConfig(128, 128, 8, 8, 3)
    assert a == b and hash(a) == hash(b) and a.fingerprint == b.fingerprint
    assert a.key == (128, 128, 8, 8, 3, "float32")
    assert (
        a != TileConfig(128, 128, 8, 8, 2)
        and a.fingerprint != TileConfig(128, 128, 8, 8, 2).fingerprint
    )
    assert pickle.loads(pickle.dumps(a)) == a
    with pytest.raises(AttributeError):
        a.tile_m = 64  # frozen


def test_derived_figures():
    cfg = TileConfig(128, 128, 8, 8, 3)
    assert cfg.threads == 256 and cfg.register_tile == (8, 8)
    assert cfg.shared_bytes == 3 * (128 + 128) * 8 * 4 + 128 * 4
    assert TileConfig(32, 32, 8, 1, 3).register_tile == (8, 4)  # 8 threads per C row
    assert TileConfig(64, 64, 16, 4, 3).register_tile == (4, 8)
    assert TileConfig(64, 64, 16, 8, 3).register_tile == (4, 4)


@pytest.mark.parametrize(
    ("kwargs", "error", "words"),
    [
        (
            dict(tile_m=128, tile_n=128, tile_k=8, num_warps=3, num_stages=3),
            ValueError,
            "num_warps",
        ),
        (
            dict(tile_m=128, tile_n=128, tile_k=8, num_warps=8, num_stages=5),
            ValueError,
            "num_stages",
        ),
        (dict(tile_m=128, tile_n=128, tile_k=8.0, num_warps=8, num_stages=3), TypeError, "tile_k"),
        (dict(tile_m=0, tile_n=128, tile_k=8, num_warps=8, num_stages=3), ValueError, "tile_m"),
        (dict(tile_m=128, tile_n=128, tile_k=6, num_warps=8, num_stages=3), ValueError, "tile_k"),
        (
            dict(tile_m=256, tile_n=256, tile_k=8, num_warps=8, num_stages=3),
            ValueError,
            "per thread",
        ),
        (
            dict(tile_m=512, tile_n=32, tile_k=8, num_warps=8, num_stages=3),
            ValueError,
            "quarter-warp",
        ),
        (
            dict(tile_m=128, tile_n=128, tile_k=64, num_warps=8, num_stages=4),
            ValueError,
            "no architecture gives a block more",
        ),
        (
            dict(tile_m=64, tile_n=64, tile_k=8, num_warps=2, num_stages=3, dtype="f8"),
            ValueError,
            "dtype",
        ),
        (
            dict(tile_m=64, tile_n=60, tile_k=16, num_warps=4, num_stages=3, dtype="float16"),
            ValueError,
            "tile_n",
        ),
    ],
)
def test_bad_configs_raise_naming_the_field(kwargs, error, words):
    with pytest.raises(error, match=words):
        TileConfig(**kwargs)


def test_shared_memory_limits():
    # The SIMT kernel's tiles are static arrays up to 48 KiB, dynamic shared memory past it:
    # 128 x 128 x 16 in 3 float32 stages is 48 KiB of rings alone, beyond the static limit with
    # the bias row; 128 x 64 x 32 in 3 stages 72 KiB (issue 40 found it refused on sm_90).
    from tessera_tile.kernels.matmul import simt

    assert TileConfig(128, 128, 16, 8, 2).shared_bytes <= STATIC_SHARED_LIMIT
    assert simt.dynamic_bytes(TileConfig(128, 128, 16, 8, 2), has_bias=True) == 0
    big = TileConfig(128, 128, 16, 8, 3)
    assert big.shared_bytes > STATIC_SHARED_LIMIT and big.fits("sm_80") and big.fits("sm_86")
    assert simt.dynamic_bytes(big, has_bias=True) == big.shared_bytes + 16  # B2's placeholder
    wide = TileConfig(128, 64, 32, 4, 3)
    assert wide.shared_bytes == 73984 and wide.fits("sm_90") and wide.fits("sm_86")
    assert simt.dynamic_bytes(wide) == 72 * 1024 + 32  # rings, B2's and the bias' placeholders
    with pytest.raises(ValueError, match="no architecture gives a block more than"):
        TileConfig(128, 128, 64, 8, 4)  # 256 KiB of rings
    # The tensor-core kernels' dynamic shared memory: up to the largest architecture's limit
    # (sm_90, 227 KiB); which architectures can run a config is fits()'s to say.
    tf32 = TileConfig(128, 64, 32, 4, 3, dtype="tf32")  # 72 KiB
    assert tf32.shared_bytes == 72 * 1024 and tf32.fits("sm_80") and tf32.fits("sm_86")
    cutlass = TileConfig(256, 128, 64, 8, 3, dtype="float16")  # 144 KiB, CUTLASS's Ampere tile
    assert [cutlass.fits(a) for a in ("sm_80", "sm_86", "sm_89", "sm_90")] == [1, 0, 0, 1]
    with pytest.raises(ValueError, match=f"no architecture gives a block more than {227 * 1024}"):
        TileConfig(256, 256, 64, 8, 4, dtype="float16")  # 256 KiB


def test_default_tensor_core_tiles_follow_shape_and_architecture():
    big = {a: default_config(4096, 4096, 4096, dtype="float16", arch=a) for a in ARCHS}
    assert all(c.tile_m * c.tile_n > 128 * 128 and c.fits(a) for a, c in big.items())
    # CUTLASS's 144 KiB tile where a block may hold it, a 72 KiB one where it may not
    assert big["sm_80"] == TileConfig(256, 128, 64, 8, 3, dtype="float16")
    # sm_90 runs the warpgroup-MMA kernel on these operands: one of its own tiles
    assert big["sm_90"] == big["sm_90a"] and big["sm_90"] in WGMMA_CANDIDATES
    assert big["sm_86"] == big["sm_89"] == TileConfig(128, 256, 32, 8, 3, dtype="float16")
    small = default_config(256, 256, 256, dtype="float16", arch="sm_90")
    assert small.tile_m * small.tile_n == 128 * 128  # 4 tiles: larger ones would idle SMs


def test_default_model_choices():
    # A large square problem fills the machine with the biggest tile (most reuse per byte).
    assert default_config(4096, 4096, 4096) == CANDIDATES[0]
    # A small one spreads over more SMs with smaller tiles.
    small = default_config(512, 512, 512)
    assert (small.tile_m * small.tile_n) < 128 * 128
    for shape in [(4096, 4096, 4096, 1), (512, 512, 512, 1), (300, 5000, 800, 1), (8, 8, 8, 1)]:
        chosen = default_config(*shape)
        best = min(estimate(*shape, c).seconds for c in CANDIDATES)
        assert estimate(*shape, chosen).seconds == best
    assert all(blocks_per_sm(c) >= 1 for c in CANDIDATES)


def test_kernel_factory_is_memoised_on_the_config_value():
    from tessera_tile.kernels.matmul import simt as km

    assert km.simt_matmul(TileConfig(64, 64, 8, 2, 3)) is km.simt_matmul(
        TileConfig(64, 64, 8, 2, 3)
    )
    assert km.simt_matmul(TileConfig(64, 64, 8, 2, 3)) is not km.simt_matmul(
        TileConfig(64, 64, 8, 2, 2)
    )


@pytest.mark.parametrize(
    ("a_shape", "b_shape", "launches"),
    [
        ((2, 3, 8, 4), (2, 3, 4, 8), 1),  # contiguous batches merge onto grid z
        ((2, 3, 8, 4), (4, 8), 1),  # b broadcast: stride 0 on every batch dimension
        ((2, 1, 8, 4), (1, 3, 4, 8), 2),  # a varies along one dimension, b along the other
        ((70000, 2, 2), (2, 2), 2),  # grid z holds at most 65,535
    ],
)
def test_batches_merge_onto_grid_z(a_shape, b_shape, launches):
    from tessera_tile import ops

    a, b = np.zeros(a_shape, np.float32), np.zeros(b_shape, np.float32)
    (stage,) = ops.matmul.explain(a, b).stages
    assert f"in {launches} launch(es)" in stage, stage


@pytest.mark.sim_only(reason="simulates an sm_86's limit; on a GPU the device's own applies")
def test_ops_refuse_a_config_over_the_devices_shared_memory():
    """A config the device cannot hold is refused when the call is planned, naming the limit;
    the same config runs where the architecture holds it."""
    from tessera_tile import ops, sim

    big = TileConfig(256, 128, 64, 8, 3, dtype="float16")  # 144 KiB
    a = np.ones((3, 5), np.float16)
    limit = f"a block may use {99 * 1024} B on this device"
    with sim.simulated_arch("sm_86"), pytest.raises(ValueError, match=limit):
        ops.matmul(a, a.T, config=big)
    got = ops.matmul(a, a.T, config=big)
    np.testing.assert_array_equal(got, np.full((3, 3), 5, np.float16))  # exact: small integers
