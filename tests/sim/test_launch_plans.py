"""Launch plans (issue 21): a fused call plans once per layout of its arrays; a later call with
the same layout walks no IR, propagates no shapes, binds no stage and chooses no variant."""

import collections

import numpy as np
import pytest
from helpers import SIDES, back, on

import tessera_tile as tt
from tessera_tile import ops
from tessera_tile import tile_ir as ir
from tessera_tile._fusion import plan as planner
from tessera_tile._fusion import runtime, schedule
from tessera_tile._fusion.compile import CountingCache
from tessera_tile.kernels import softmax as fused

softmax = fused.softmax(-1)  # the @tt.fuse definition ops.softmax dispatches to


@tt.fuse
def centred_total(x):  # two kernels: the mean, then the sum that reads it
    return tt.sum(x - tt.mean(x))


def softmax_ref(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


@pytest.fixture
def planning(monkeypatch):
    """Counts of the planning steps a call runs, by name."""
    counts = collections.Counter()
    for module, name in [
        (ir, "walk"),
        (planner, "propagate_shapes"),
        (runtime, "bind"),
        (schedule, "choose_variant"),
    ]:
        original = getattr(module, name)

        def counted(*args, _original=original, _name=name, **kwargs):
            counts[_name] += 1
            return _original(*args, **kwargs)

        monkeypatch.setattr(module, name, counted)
    return counts


@pytest.mark.parametrize("side", SIDES)
def test_a_second_call_plans_nothing(planning, side):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((6, 40)).astype(np.float32)
    (placed,) = on(side, x)
    f = tt.fuse(softmax.fn)  # a fresh function: its caches start empty
    back(f(placed), side)
    assert f.cache_info()["launch_plans"] == 1
    assert planning["bind"] == 1 and planning["choose_variant"] == 1
    planning.clear()
    got = back(f(placed), side)
    np.testing.assert_allclose(got, softmax_ref(x), rtol=1e-5, atol=1e-7)
    assert planning == {}, planning
    info = f.cache_info()
    assert (info["launch_plans"], info["launch_plan_hits"]) == (1, 1)


def test_a_new_layout_plans_once():
    rng = np.random.default_rng(1)
    f = tt.fuse(centred_total.fn)
    x = rng.standard_normal((8, 32)).astype(np.float32)
    f(x)
    f(x + 1)  # the same layout: a hit
    assert f.cache_info()["launch_plans"] == 1
    wider = rng.standard_normal((8, 48)).astype(np.float32)
    np.testing.assert_allclose(f(wider), np.sum(wider - wider.mean()), atol=1e-4)
    f(wider)
    strided = rng.standard_normal((8, 96)).astype(np.float32)[:, ::2]
    np.testing.assert_allclose(f(strided), np.sum(strided - strided.mean()), atol=1e-4)
    info = f.cache_info()
    assert (info["misses"], info["launch_plans"], info["launch_plan_hits"]) == (2, 3, 2)


def test_an_op_plans_once_per_layout(planning):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((4, 24)).astype(np.float32)
    ops.softmax(x)
    planning.clear()
    np.testing.assert_allclose(ops.softmax(x), softmax_ref(x), rtol=1e-5, atol=1e-7)
    assert planning["bind"] == 0 and planning["propagate_shapes"] == 0, planning


def test_a_device_out_is_part_of_the_layout():
    from numba import cuda

    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 24)).astype(np.float32)
    f = tt.fuse(softmax.fn)
    d = cuda.to_device(x)
    backing = cuda.to_device(np.zeros((4, 48), np.float32))
    for out in (cuda.device_array((4, 24), np.float32), None, backing[:, ::2]):
        got = f(d, out=out)
        assert out is None or got is out
        np.testing.assert_allclose(got.copy_to_host(), softmax_ref(x), rtol=1e-5, atol=1e-7)
    assert f.cache_info()["launch_plans"] == 3


def test_a_matmul_plans_its_launches_once_per_layout(monkeypatch):
    from tessera_tile.ops import _matmul_plan

    made = collections.Counter()
    original = _matmul_plan.Product._plan_launches

    def counted(self, *args):
        made[self.name] += 1
        return original(self, *args)

    monkeypatch.setattr(_matmul_plan.Product, "_plan_launches", counted)
    monkeypatch.setattr(_matmul_plan, "_LAUNCH_PLANS", CountingCache())
    rng = np.random.default_rng(4)
    x, w = rng.standard_normal((5, 7)).astype(np.float32), rng.standard_normal((7, 3))
    w = w.astype(np.float32)
    for _ in range(3):
        np.testing.assert_allclose(ops.linear(x, w, None, "relu"), np.maximum(x @ w, 0), rtol=1e-5)
    assert made == {"linear": 1}
    ops.linear(x[:, :6], w[:6])  # another layout: planned once more
    assert made == {"linear": 2}


def test_plan_caches_start_over_at_their_bound():
    cache = CountingCache(bound=2)
    made = [object() for _ in range(3)]
    for key, value in enumerate(made):
        assert cache.get(key, lambda value=value: value) is value
    assert cache.values() == [made[2]] and cache.misses == 3
    assert cache.get(2, lambda: None) is made[2] and cache.hits == 1
