"""TileConfig: validation on construction, value identity, and the default model's choices.
Pure Python: runs in every tier without launching anything."""

import pickle

import numpy as np
import pytest

import tessera_tile as tt
from tessera_tile import TileConfig
from tessera_tile.tile_config import (
    CANDIDATES,
    STATIC_SHARED_LIMIT,
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
        (dict(tile_m=128, tile_n=128, tile_k=32, num_warps=8, num_stages=4), ValueError, "static"),
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


def test_shared_memory_limit_is_the_static_one():
    # 128 x 128 x 16 in 3 float32 stages is 48 KiB of rings alone: within the architectures'
    # dynamic limits, beyond what static cuda.shared.array can hold with the bias row.
    with pytest.raises(ValueError, match=str(STATIC_SHARED_LIMIT)):
        TileConfig(128, 128, 16, 8, 3)
    assert TileConfig(128, 128, 16, 8, 2).shared_bytes <= STATIC_SHARED_LIMIT
    assert TileConfig(128, 128, 32, 4, 3, dtype="float16").shared_bytes <= STATIC_SHARED_LIMIT


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
    from tessera_tile.kernels import matmul as km

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
