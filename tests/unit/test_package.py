"""The package's public surface."""

import pytest

import tessera_tile as tt


def test_submodules_are_attributes_imported_on_first_use():
    for name in ("inspect", "sim", "memory", "pipeline", "warp", "ops", "kernels", "fusion"):
        assert getattr(tt, name).__name__ == f"tessera_tile.{name}"
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        _ = tt.nothing
