"""Launch plans (issue 21): a fused call plans once per layout of its arrays; a later call with
the same layout walks no IR, propagates no shapes, binds no stage and chooses no variant."""

import collections
import contextlib

import numpy as np
import pytest
from helpers import SIDES, SIMULATED, back, on, on_sm90a
from numba import cuda

import tessera_tile as tt
from tessera_tile import dynamic_shared, ops
from tessera_tile import tile_ir as ir
from tessera_tile._fusion import plan as planner
from tessera_tile._fusion import runtime, schedule
from tessera_tile._runtime import config as _config
from tessera_tile._runtime.memo import CountingCache
from tessera_tile.ops import _definitions as fused

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
    from tessera_tile.kernels.matmul import plan as _matmul_plan

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
    config = tt.TileConfig(64, 64, 8, 2, 3)  # chosen, not tuned: a GPU's tuner plans each try
    for _ in range(3):
        got = ops.linear(x, w, None, "relu", config=config)
        np.testing.assert_allclose(got, np.maximum(x @ w, 0), rtol=1e-5)
    assert made == {"linear": 1}
    ops.linear(x[:, :6], w[:6], config=config)  # another layout: planned once more
    assert made == {"linear": 2}


def test_plan_caches_start_over_at_their_bound():
    cache = CountingCache(bound=2)
    made = [object() for _ in range(3)]
    for key, value in enumerate(made):
        assert cache.get(key, lambda value=value: value) is value
    assert cache.values() == [made[2]] and cache.misses == 3
    assert cache.get(2, lambda: None) is made[2] and cache.hits == 1


# --------------------------------------------------------------------------------------------
# calls run straight from their arguments (numba device arrays): what must still differ


def _device(*arrays):
    return [cuda.to_device(a) for a in arrays]


def test_a_ready_call_takes_each_call_s_scalar_values():
    @tt.fuse
    def scaled(x, s):
        return x * s + 1

    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    (d,) = _device(x)
    for s in (2.0, -0.5, 3.0):  # one key (a float), three values
        np.testing.assert_array_equal(scaled(d, s).copy_to_host(), x * np.float32(s) + 1)
    assert len(scaled._ready) == 1
    got = scaled(d, 3).copy_to_host()  # an int: another program, NumPy's promotion
    np.testing.assert_array_equal(got, x * 3 + 1)
    assert len(scaled._ready) == 2


def test_ready_calls_key_on_layout_and_alignment():
    rng = np.random.default_rng(5)
    base = rng.standard_normal((4, 33)).astype(np.float32)
    (d,) = _device(base)
    f = tt.fuse(softmax.fn)
    views = [d[:, :32], d[:, 1:], d[:, :32]]  # the second starts 4 bytes in: no 16-byte loads
    for v, ref in zip(views, [base[:, :32], base[:, 1:], base[:, :32]], strict=True):
        np.testing.assert_allclose(f(v).copy_to_host(), softmax_ref(ref), rtol=1e-5, atol=1e-7)
    assert f.cache_info()["launch_plans"] == 2 and len(f._ready) == 2


def test_out_host_and_keyword_calls_never_run_ready():
    x = np.linspace(-2, 2, 24, dtype=np.float32).reshape(4, 6)
    f = tt.fuse(softmax.fn)
    (d,) = _device(x)
    out = cuda.device_array((4, 6), np.float32)
    for _ in range(2):
        assert f(d, out=out) is out
        np.testing.assert_allclose(f(x), softmax_ref(x), rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(f(x=d).copy_to_host(), softmax_ref(x), rtol=1e-5, atol=1e-7)
    assert f._ready == {}
    np.testing.assert_allclose(out.copy_to_host(), softmax_ref(x), rtol=1e-5, atol=1e-7)


def test_an_op_s_ready_call_keys_on_its_parameters_values():
    rng = np.random.default_rng(6)
    x = rng.standard_normal((5, 16)).astype(np.float32)
    w, b = rng.standard_normal(16).astype(np.float32), rng.standard_normal(16).astype(np.float32)
    d, dw, db = _device(x, w, b)
    for eps in (1e-5, 0.5, 1e-5, 0.5):
        mean, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
        want = (x - mean) / np.sqrt(var + eps) * w + b
        got = ops.layer_norm(d, dw, db, eps).copy_to_host()
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    for axis in (0, 1, -1):
        e = np.exp(x - x.max(axis=axis, keepdims=True))
        want = e / e.sum(axis=axis, keepdims=True)
        np.testing.assert_allclose(ops.softmax(d, axis).copy_to_host(), want, rtol=1e-5, atol=1e-7)
    d2, dw2, db2 = _device(x[:2] * 3, w + 1, b - 1)  # other arrays, the same layouts
    want = ops.layer_norm(x[:2] * 3, w + 1, b - 1, 0.5)
    np.testing.assert_allclose(ops.layer_norm(d2, dw2, db2, 0.5).copy_to_host(), want, rtol=1e-6)


def test_an_op_s_bad_arguments_are_refused_after_ready_calls():
    x = np.ones((3, 8), np.float32)
    d, w = _device(x, np.ones(8, np.float32))
    ops.layer_norm(d, w)
    ops.layer_norm(d, w)
    with pytest.raises(ValueError, match="eps must be finite"):
        ops.layer_norm(d, w, None, -1.0)
    (short,) = _device(np.ones(7, np.float32))
    with pytest.raises(ValueError, match="weight has shape"):
        ops.layer_norm(d, short)


@cuda.jit
def fill(a):
    a[cuda.grid(1)] = 7


@pytest.mark.sim_only(reason="launches_skipped stubs the simulator's launches")
def test_launches_skipped_configure_and_launch_nothing():
    from tessera_tile import sim

    a = np.zeros(32, np.float32)
    with sim.launches_skipped():
        fill[1, 32](a)
    assert not a.any()
    fill[1, 32](a)
    assert (a == 7).all()


def test_kept_hand_written_calls_read_each_call_s_arrays():
    from tessera_tile.ops import _contract

    rng = np.random.default_rng(9)
    kept = {}
    for _ in range(3):  # the first call plans and keeps; the later ones run what it kept
        x, w, b = (rng.standard_normal(s).astype(np.float32) for s in ((6, 8), (8, 5), (5,)))
        q, k, v = (rng.standard_normal((2, 8, 16)).astype(np.float32) for _ in range(3))
        dx, dw, db, dq, dk, dv = _device(x, w, b, q, k, v)
        got = ops.linear(dx, dw, db, "relu").copy_to_host()
        np.testing.assert_allclose(got, np.maximum(x @ w + b, 0), rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(ops.transpose(dx).copy_to_host(), x.T)
        s = q @ k.transpose(0, 2, 1) / 4
        p = np.exp(s - s.max(-1, keepdims=True))
        want = p / p.sum(-1, keepdims=True) @ v
        got = ops.attention(dq, dk, dv).copy_to_host()
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        calls = {
            ops.linear: (dx, dw, db, "relu"),
            ops.transpose: (dx,),
            ops.attention: (dq, dk, dv),
        }
        for op, args in calls.items():
            ready = op._ready[_contract._key(args, {})[0]]
            assert kept.setdefault(op, ready) is ready, op  # the same kept call every time


def _consulted(monkeypatch, tuner) -> collections.Counter:
    """Counts of the calls to ``tuner.choose`` and ``tuner.expected`` from here on."""
    consulted = collections.Counter()
    for name in ("choose", "expected"):
        original = getattr(tuner, name)

        def counted(*args, _original=original, _name=name, **kwargs):
            consulted[_name] += 1
            return _original(*args, **kwargs)

        monkeypatch.setattr(tuner, name, counted)
    return consulted


@pytest.mark.parametrize("op", ["linear", "attention"])
def test_a_kept_call_consults_no_tuner_until_it_is_cleared(monkeypatch, op):
    """The matmul ops and the warpgroup-MMA attention alike: a kept call holds its tuner's
    choice, and clearing the tuner drops it."""
    from tessera_tile.kernels.attention import plan as _attention
    from tessera_tile.kernels.matmul import calls as _matmul

    if op == "linear":
        x, w = np.ones((4, 8), np.float32), np.full((8, 3), 0.5, np.float32)
        dx, dw = _device(x, w)
        tuner, tuned, where = _matmul.TUNED_LINEAR, True, contextlib.nullcontext()
        call = lambda: ops.linear(dx, dw)  # noqa: E731
    else:
        q = (np.random.default_rng(3).standard_normal((1, 64, 64)) / 4).astype(np.float16)
        (dq,) = _device(q)
        tuner, where = _attention.TUNED_WGMMA, on_sm90a()
        tuned = SIMULATED or dynamic_shared.wgmma()  # elsewhere the mma.sync kernel, untuned
        call = lambda: ops.attention(dq, dq, dq)  # noqa: E731
    consulted = _consulted(monkeypatch, tuner)
    with where:
        first = call().copy_to_host()
        if op == "linear":
            np.testing.assert_array_equal(first, x @ w)
        assert consulted["choose"] >= tuned  # the first call: its launch and those it keeps
        consulted.clear()
        np.testing.assert_array_equal(call().copy_to_host(), first)
        assert consulted == {}
        tuner.clear()  # the choice is dropped: the next call asks again
        np.testing.assert_array_equal(call().copy_to_host(), first)
        assert consulted["choose"] >= tuned


@pytest.mark.parametrize("op", ["cross_entropy", "transpose", "layer_norm_long"])
def test_hand_written_ops_refuse_an_out_that_repeats_memory(op):
    """Every hand-written op, as the matmul ops and attention did: its threads would race."""
    x = np.ones((4, 16400 if op == "layer_norm_long" else 6), np.float32)
    call = {
        "cross_entropy": (ops.cross_entropy, (x, np.zeros(4, np.int64)), (4,), (0,)),
        "transpose": (ops.transpose, (x,), (6, 4), (0, 4)),
        "layer_norm_long": (ops.layer_norm, (x,), x.shape, (0, 4)),
    }
    fn, args, shape, strides = call[op]
    out = np.lib.stride_tricks.as_strided(np.zeros(x.shape[-1], np.float32), shape, strides)
    kwargs = {"reduction": "none"} if op == "cross_entropy" else {}
    with pytest.raises(ValueError, match="repeats memory"):
        fn(*args, out=out, **kwargs)


def test_kept_calls_do_not_type_their_arguments_to_opt_in(monkeypatch):
    """Dynamic shared memory: the first call of a layout opts its kernels in (typing their
    arguments); its kept calls launch without that cost, float16 (tensor cores) and attention."""
    from tessera_tile import dynamic_shared

    opted = collections.Counter()
    original = dynamic_shared.opt_in

    def counted(kernel, args, nbytes):
        opted[kernel.py_func.__name__] += 1
        return original(kernel, args, nbytes)

    monkeypatch.setattr(dynamic_shared, "opt_in", counted)
    rng = np.random.default_rng(4)
    x, w = (rng.standard_normal(s).astype(np.float16) for s in ((16, 32), (32, 24)))
    q = rng.standard_normal((1, 16, 16)).astype(np.float16)
    dx, dw, dq = _device(x, w, q)
    want = (x.astype(np.float32) @ w.astype(np.float32)).astype(np.float16)
    for call in range(3):
        got = ops.matmul(dx, dw).copy_to_host()
        # both rounded once to float16 from float32 sums (in other orders): within 2 ulp
        np.testing.assert_allclose(got.astype(np.float32), want, rtol=2e-3, atol=2e-3)
        ops.attention(dq, dq, dq)
        if call == 0:  # its two kernels, once (a GPU's tuner also opts in each tile it times)
            first = sum(opted.values())
            assert first == 2 or not _config.SIMULATED, opted
        assert sum(opted.values()) == first, (call, opted)  # kept calls: none more
