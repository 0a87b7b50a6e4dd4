"""The float32 SIMT flash-attention kernel (kernels/attention/simt.py), called directly, against
a float64 NumPy reference (helpers.attention_reference); its measured traffic and bank conflicts.

Inputs: q and k uniform in [-1, 1] with ``scale = 30 / sqrt(D)``, so scores reach about +-30
(weights spanning e^60: the running max changes from tile to tile and the output is rescaled),
and v uniform in [-30, 30].

Checks: no NaN or inf; rows with no allowed key (Sk = 0, or causal with Sq > Sk) exactly 0; the
Frobenius norm of the error below ``1e-5`` times the reference's; every element within the bound
below, derived from where the kernel rounds (:func:`error_bound`).

The float32 bound, per output element (u = 2**-24, ulp = 2u; to first order, see the end). For
query row i, with exact scores ``s_j = q . k_j`` over the allowed keys j, ``c = scale log2(e)``
(the kernel's exponents are in base 2), exact weights ``P_j = 2**(c (s_j - max s))`` and exact
output ``o = sum P_j v_j / sum P_j``:

1. Score: the kernel accumulates ``q . k_j`` in float32 over the head columns in order (FFMA on
   a GPU; a rounded product and a rounded sum in the simulator). Each step rounds its partial
   sum ``S_1 .. S_D`` (and its product), so ``|error| <= u R_j`` with the running bound
   ``R_j = sum |S_n| + sum |q_n k_jn|``. (Computed partial sums differ from the exact ones by at
   most ``gamma_D sum |q_n k_jn|`` each: ``R_j`` adds ``D`` times that.) This is the dominant
   term: ``c u R_j`` is about 1e-4 for D = 128.
2. Exponent: ``c`` is rounded to float32 (relative u, common to all keys: after normalising only
   its product with ``s_j - max s`` counts), ``s_j * c`` rounds (``u c |s_j|``), ``s_j c - m``
   rounds with m the running max (``u c (max s - s_j)``), and the rescale exponents ``m_old -
   m_new`` of later tiles round (in all ``u c (max s - s_j)``, they telescope). Up to a shift
   common to the row, key j's exponent is off by at most
   ``E_j = c u (R_j + |s_j| + 3 (max s - s_j))``.
3. exp2: each MUFU.EX2 is within 2 ulp (PTX ISA; the simulator's NumPy twin measures 0.9 ulp),
   and a weight passes through at most ``n_tiles`` of them (its own and the rescales of later
   tiles): the computed weight is ``P_j (1 + r_j)`` with
   ``|r_j| <= delta_j = 2**E_j / (1 - 2 ulp)**n_tiles - 1``.
4. Normalising, exactly: ``sum P_j (1 + r_j) v_j / sum P_j (1 + r_j) - o
   = sum P_j r_j (v_j - o) / sum P_j (1 + r_j)``, at most
   ``W = sum P_j delta_j |v_j - o| / sum P_j (1 - delta_j)``.
5. Sums: the numerator and the denominator each round at most ``n = Sk + n_tiles + 3`` times
   per term (keys, rescales, 3 shuffles) over positive weights: with ``w`` the weighted mean of
   |v| and ``|o'| <= |o| + W``, the quotient moves by at most
   ``gamma_n (w + |o'|) / (1 - gamma_n)``.
6. ``1 / l`` by MUFU.RCP (1 ulp, PTX ISA) and one product: ``(1 ulp + u)`` of the quotient.
7. ``.ftz``: weights below 2**-126 of the row's max become 0: at most ``Sk 2**-126 2 max|v|``.

Dropped: products of two of these relative errors, each below 2**-10 (asserted), so the bound is
multiplied by ``1 + 2**-10``.

How tight: on issue 19's example (D = 128) the worst element reaches 0.11 of its bound; over 40
random draws 0.06 to 0.16 in the simulator (0 with one key: exact). The slack is the running
bound's (1.), which assumes that all the rounding errors of a score have one sign: the worst
score error reaches 0.17 of it. The bound used before, ``1e-5 max|v|``, was not derived: a score
error ``u R_j`` moves a weight by ``scale u R_j`` and O by that times ``|v_j - o|``, which for
D = 128 exceeds it. Issue 19's example: 3.8e-4 against 3.0e-4, and the same 3.8e-4 from float32
scores summed in the kernel's order with exact arithmetic after them: the error is the scores'.
"""

import math

import numpy as np
import pytest
from helpers import attention_reference
from hypothesis import example, given, settings
from hypothesis import strategies as st
from numba import cuda

from tessera_tile import dynamic_shared
from tessera_tile._runtime import arrays as _arrays
from tessera_tile.kernels.attention import simt as at

Config = at.SimtAttentionConfig
LOG2E = math.log2(math.e)
RTOL_FRO = 1e-5
U = 2.0**-24
ULP = 2 * U  # the largest relative spacing of float32 numbers
EX2_ERROR = 2 * ULP  # MUFU.EX2 (ex2.approx), PTX ISA
RCP_ERROR = ULP  # MUFU.RCP (rcp.approx), PTX ISA
SECOND_ORDER = 2.0**-10  # the largest relative error for which the first-order bound holds

# Small blocks of one warp keep the simulator fast; the default configs run in the profile tests.
SMALL = (Config(16, 16, 32), Config(32, 16, 32), Config(8, 32, 64))
LAYOUTS = ("host", "device", "padded", "strided")
# Failing examples found once, kept as explicit cases
ISSUE_19 = dict(z=2, sq=21, sk=44, d=128, causal=False, config=SMALL[0], layout="host", seed=149)


def operands(z, sq, sk, d, seed):
    rng = np.random.default_rng(seed)
    q = rng.uniform(-1, 1, (z, sq, d)).astype(np.float32)
    k = rng.uniform(-1, 1, (z, sk, d)).astype(np.float32)
    v = rng.uniform(-30, 30, (z, sk, d)).astype(np.float32)
    return q, k, v, 30 / math.sqrt(d)


def as_layout(x, layout):
    """``x`` as the kernel gets it, and whether the aligned (16-byte) kernel may take it.

    host: a NumPy array; device: ``cuda.to_device``; padded: a device view with a padded row
    pitch (inner axis contiguous, rows 16-byte aligned); strided: a device view with an inner
    stride of 2 elements, and a batch stride of 0 (one matrix broadcast) where Z > 1 allows.
    """
    z, s, d = x.shape
    if layout == "host":
        return x, True
    if layout == "device":
        return cuda.to_device(x), True
    if layout == "padded":
        base = np.full((z, s, d + 4), np.nan, np.float32)
        base[..., :d] = x
        return cuda.to_device(base)[:, :, :d], True
    base = np.full((z, s, 2 * d), np.nan, np.float32)
    base[..., ::2] = x
    view = cuda.to_device(base)[:, :, ::2]
    return view, False


def broadcast_batch(x, z):
    """A device view of ``x`` (1, S, D) repeated over ``z`` batches with a batch stride of 0."""
    dev = cuda.to_device(np.ascontiguousarray(x))
    return _arrays.view(dev, (z, *x.shape[1:]), (0, *dev.strides[1:]))


def launch(q, k, v, o, causal, aligned, config, scale, d):
    z, sq = o.shape[0], o.shape[1]
    kernel = at.simt_attention(d, causal, aligned, config)
    if sq and z:  # a launch of 0 blocks is the caller's to skip
        grid = (-(-sq // config.block_q), z)
        args = (q, k, v, o, np.float32(scale * LOG2E))
        dynamic_shared.launch(kernel, grid, config.threads, config.shared_bytes(d), args)


def run(q, k, v, causal, config, layout="host", scale=None):
    """The kernel's output for host arrays ``q, k, v`` passed in ``layout``."""
    z, sq, d = q.shape
    scale = 1 / math.sqrt(d) if scale is None else scale
    qa, aligned = as_layout(q, layout)
    ka, _ = as_layout(k, layout)
    va, _ = as_layout(v, layout)
    if layout == "host":
        o = np.full((z, sq, d), np.nan, np.float32)
        launch(qa, ka, va, o, causal, aligned, config, scale, d)
        return o
    if layout == "strided":
        base = np.full((z, sq, 2 * d), np.nan, np.float32)
        dev = cuda.to_device(base)
        launch(qa, ka, va, dev[:, :, 1::2], causal, aligned, config, scale, d)
        return dev.copy_to_host()[:, :, 1::2]
    pad = 4 if layout == "padded" else 0  # o with a padded row pitch too
    dev = cuda.to_device(np.full((z, sq, d + pad), np.nan, np.float32))
    # numba refuses any slice of an empty device array (a null pointer): pass it whole
    launch(qa, ka, va, dev[:, :, :d] if pad else dev, causal, aligned, config, scale, d)
    out = dev.copy_to_host()
    assert np.isnan(out[:, :, d:]).all(), "wrote into the padding"
    return out[:, :, :d]


def allowed_keys(sq, sk, causal):
    """``allowed[i, j]``: query row i sees key j (causal: bottom-right aligned)."""
    allowed = np.ones((sq, sk), bool)
    if causal:
        allowed &= np.arange(sk)[None, :] <= np.arange(sq)[:, None] + (sk - sq)
    return allowed


def masked_rows(sq, sk, causal):
    """Query rows with no allowed key."""
    return ~allowed_keys(sq, sk, causal).any(axis=1)


def gamma(n):
    return n * U / (1 - n * U)


def error_bound(q, k, v, causal, scale, config):
    """The per-element bound of the module doc (float64, same shape as the output)."""
    q64, k64, v64 = (np.asarray(x, np.float64) for x in (q, k, v))
    d, sk = q64.shape[-1], k64.shape[-2]
    terms = q64[..., :, None, :] * k64[..., None, :, :]  # (Z, Sq, Sk, D), products exact
    partial = np.cumsum(terms, axis=-1)  # the kernel's order: head column 0 first
    s = partial[..., -1]
    magnitude = np.abs(terms).sum(axis=-1)
    running = np.abs(partial).sum(axis=-1) + magnitude + d * gamma(d) * magnitude  # (1.)
    allowed = allowed_keys(q64.shape[-2], sk, causal)
    s = np.where(allowed, s, -np.inf)
    top = s.max(axis=-1, keepdims=True, initial=-np.inf)
    live = np.isfinite(top)  # rows with an allowed key
    top = np.where(live, top, 0.0)
    c = scale * LOG2E
    exponent = np.where(allowed, c * U * (running + np.abs(s) + 3 * (top - s)), 0.0)  # (2.)
    n_tiles = -(-sk // config.block_kv)
    delta = np.exp2(exponent) / (1 - EX2_ERROR) ** n_tiles - 1  # (3.)
    assert delta.max(initial=0.0) < SECOND_ORDER, "the first-order bound does not hold"
    p = np.exp2(c * (s - top))
    low = np.where(live, (p * (1 - delta)).sum(axis=-1, keepdims=True), 1.0)
    o = (p @ v64) / np.where(live, p.sum(axis=-1, keepdims=True), 1.0)
    spread = np.abs(v64[..., None, :, :] - o[..., :, None, :])  # |v_j - o| (Z, Sq, Sk, D)
    weights = np.einsum("...ij,...ije->...ie", p * delta, spread) / low  # (4.)
    mean_v = (p * (1 + delta)) @ np.abs(v64) / low
    quotient = np.abs(o) + weights
    g = gamma(sk + n_tiles + 3)
    sums = g * (mean_v + quotient) / (1 - g)  # (5.)
    final = (RCP_ERROR + U + RCP_ERROR * U) * (quotient + sums)  # (6.)
    flush = sk * 2.0**-125 * np.abs(v64).max(initial=0.0)  # (7.)
    return np.where(live, (weights + sums + final + flush) * (1 + SECOND_ORDER), 0.0)


def check(got, q, k, v, causal, scale, config):
    want = attention_reference(q, k, v, causal, scale)
    assert got.shape == want.shape and got.dtype == np.float32
    assert np.isfinite(got).all(), "NaN or inf in the output"
    dead = masked_rows(q.shape[1], k.shape[1], causal)
    np.testing.assert_array_equal(got[:, dead], 0.0)
    norm = np.linalg.norm(want)
    if norm > 0:
        err = np.linalg.norm(got - want) / norm
        assert err < RTOL_FRO, f"relative Frobenius error {err:.3g}"
    err = np.abs(got - want)
    bound = error_bound(q, k, v, causal, scale, config)
    bad = ~(err <= bound)
    assert not bad.any(), (
        f"{int(bad.sum())} of {err.size} elements off, worst {err.max():.3g}, "
        f"{(err[bad] / bound[bad]).max():.3g} times its bound"
    )
    return err, bound


# ---------------------------------------------------------------------------------------------
# Correctness
# ---------------------------------------------------------------------------------------------


@settings(max_examples=30, deadline=None)
@given(
    z=st.integers(1, 2),
    sq=st.integers(0, 70),
    sk=st.integers(0, 70),
    d=st.sampled_from([16, 16, 32, 32, 64, 64, 128]),  # D = 128 rarely: the slowest to simulate
    causal=st.booleans(),
    config=st.sampled_from(SMALL),
    layout=st.sampled_from(LAYOUTS),
    seed=st.integers(0, 2**16),
)
@example(**ISSUE_19)
def test_hypothesis_small_shapes(z, sq, sk, d, causal, config, layout, seed):
    q, k, v, scale = operands(z, sq, sk, d, seed)
    got = run(q, k, v, causal, config, layout, scale)
    check(got, q, k, v, causal, scale, config)


def test_issue_19_example_within_a_tight_bound():
    # Issue 19's example: 9 elements beyond the former bound 1e-5 max|v| (3.8e-4 > 3.0e-4).
    # Inside the derived bound, and not vacuously: its worst element reaches 0.11 of the bound
    # in the simulator (a GPU's FFMA rounds once per step, not twice: somewhat less).
    case = ISSUE_19
    q, k, v, scale = operands(case["z"], case["sq"], case["sk"], case["d"], case["seed"])
    got = run(q, k, v, case["causal"], case["config"], case["layout"], scale)
    err, bound = check(got, q, k, v, case["causal"], scale, case["config"])
    assert (err / bound).max() > 0.02, f"a loose bound: {(err / bound).max():.3g}"


SHAPES = [(1, 1), (1, 70), (70, 1), (17, 33), (33, 17), (32, 32), (16, 47), (5, 0), (0, 5)]


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize(("sq", "sk"), SHAPES, ids=[f"{a}x{b}" for a, b in SHAPES])
def test_edges(sq, sk, causal):
    # Around the block sizes (16), Sq != Sk both ways, single rows and keys, empty sides.
    q, k, v, scale = operands(2, sq, sk, 32, seed=sq * 100 + sk)
    got = run(q, k, v, causal, SMALL[0], "device", scale)
    check(got, q, k, v, causal, scale, SMALL[0])


@pytest.mark.parametrize(
    ("causal", "layout"), [(False, "padded"), (True, "strided")], ids=["aligned", "strided"]
)
def test_head_dim_128(causal, layout):
    q, k, v, scale = operands(1, 19, 35, 128, seed=128)
    got = run(q, k, v, causal, SMALL[0], layout, scale)
    check(got, q, k, v, causal, scale, SMALL[0])


@pytest.mark.parametrize("rising", [True, False], ids=["rising", "falling"])
def test_online_rescaling(rising):
    # Scores that climb (or fall) by ~60 from the first key tile to the last: with rising scores
    # every tile raises the running max and rescales O by up to 2^-20 (falling: never).
    z, sq, sk, d = 1, 16, 64, 16
    q, k, v, _ = operands(z, sq, sk, d, seed=7)
    q[:] = np.abs(q)
    ramp = np.linspace(-1, 1, sk, dtype=np.float32)[:, None]
    k[0] = np.float32(0.2) * k[0] + (ramp if rising else -ramp)
    scale = 30 / d
    got = run(q, k, v, False, SMALL[0], "host", scale)
    check(got, q, k, v, False, scale, SMALL[0])


def test_broadcast_batch():
    # k and v with a batch stride of 0 (one matrix for every batch), q per batch.
    z, sq, sk, d = 3, 20, 30, 32
    q, k, v, scale = operands(z, sq, sk, d, seed=3)
    k1, v1 = k[:1], v[:1]
    o = cuda.to_device(np.full((z, sq, d), np.nan, np.float32))
    launch(
        cuda.to_device(q), broadcast_batch(k1, z), broadcast_batch(v1, z), o, True, True,
        SMALL[0], scale, d,
    )  # fmt: skip
    got = o.copy_to_host()
    check(got, q, np.repeat(k1, z, 0), np.repeat(v1, z, 0), True, scale, SMALL[0])


# ---------------------------------------------------------------------------------------------
# The profile: traffic as the rule says, conflict-free shared memory
# ---------------------------------------------------------------------------------------------


def planned_kv_bytes(z, sq, sk, d, causal, config):
    blocks = range(0, sq, config.block_q)
    return 4 * d * z * sum(at.kv_rows(m0, sq, sk, causal, config) for m0 in blocks)


def profiled(z, sq, sk, d, causal, config, layout):
    from tessera_tile import sim

    q, k, v, scale = operands(z, sq, sk, d, seed=11)
    with sim.profile() as prof:
        got = run(q, k, v, causal, config, layout, scale)
    check(got, q, k, v, causal, scale, config)
    assert prof.races == [] and prof.out_of_bounds == [], str(prof)
    traffic = {arg: rw for (_, arg), rw in prof.traffic.items()}
    kv = planned_kv_bytes(z, sq, sk, d, causal, config)
    assert traffic["q"] == [4 * z * sq * d, 0]
    assert traffic["k"] == [kv, 0]
    assert traffic["v"] == [kv, 0]
    assert traffic["o"] == [0, 4 * z * sq * d]
    return prof


@pytest.mark.sim_only(reason="the profiler exists only in the simulator")
@pytest.mark.parametrize(
    ("sq", "sk", "causal", "layout"),
    [
        (70, 70, True, "device"),  # the diagonal: later blocks read more tiles
        (40, 70, True, "strided"),  # Sk > Sq: the diagonal shifts right
        (70, 23, True, "device"),  # Sq > Sk: the first blocks read nothing
        (33, 50, False, "strided"),
    ],
)
def test_traffic_follows_the_rule(sq, sk, causal, layout):
    prof = profiled(1, sq, sk, 16, causal, SMALL[0], layout)
    assert prof.bank_conflicts == 0, str(prof)


@pytest.mark.sim_only(reason="the profiler exists only in the simulator")
@pytest.mark.parametrize(
    ("d", "sq", "sk", "causal"),
    [(16, 70, 100, True), (32, 40, 70, True), (64, 40, 70, False)],
    ids=["d16", "d32", "d64"],
)
def test_default_config_profile(d, sq, sk, causal):
    # The default configs: exact traffic, no bank conflict (Q, K, V and P tiles, cp.async
    # copies included), no race.
    config = at.default_config(d)
    prof = profiled(1, sq, sk, d, causal, config, "device")
    assert prof.shared_requests > 0
    assert prof.bank_conflicts == 0, str(prof)


def test_kv_rows_covers_every_allowed_key():
    config = Config(16, 16, 32)
    for sq in (0, 1, 15, 16, 17, 40):
        for sk in (0, 1, 15, 16, 17, 40):
            for causal in (False, True):
                for m0 in range(0, sq, 16):
                    rows = at.kv_rows(m0, sq, sk, causal, config)
                    assert 0 <= rows <= sk
                    last = min(m0 + 16, sq) - 1 + (sk - sq) if causal else sk - 1
                    assert rows >= min(max(last + 1, 0), sk)  # no allowed key left out
                    assert rows == sk or rows % 16 == 0  # whole tiles, cut at Sk


# ---------------------------------------------------------------------------------------------
# Factory and configs
# ---------------------------------------------------------------------------------------------


def test_factory_is_memoised_and_defaults_are_module_kernels():
    assert at.simt_attention(64, False, True) is at.simt_attention(64, False, True, None)
    assert at.simt_attention(64, True, False) is at.simt_attention(
        64, True, False, at.default_config(64)
    )
    assert at.simt_attention(64, True, True) is at.attention_simt_d64_causal
    assert at.simt_attention(128, False, False) is at.attention_simt_d128_strided
    assert at.simt_attention(32, False, True) is not at.simt_attention(32, True, True)


@pytest.mark.parametrize("d", at.HEAD_DIMS)
def test_default_configs_fit(d):
    config = at.default_config(d)
    config.validate(d)
    # dynamic shared memory: within the smallest limit of the architectures (sm_86, sm_89)
    assert config.shared_bytes(d) <= min(dynamic_shared.BLOCK_LIMIT.values())
    assert at.threads(config) == config.threads


@pytest.mark.parametrize(
    ("d", "config", "message"),
    [
        (48, None, "head_dim"),
        (64, Config(64, 32, 100), "multiple of 32"),
        (64, Config(60, 32, 128), "block_q"),
        (64, Config(64, 24, 128), "block_kv"),
        (128, Config(256, 64, 128), "shared memory"),  # 271 KiB: over every limit
    ],
)
def test_bad_configs_are_refused(d, config, message):
    with pytest.raises(ValueError, match=message):
        at.simt_attention(d, False, True, config)
