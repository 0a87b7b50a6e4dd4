"""The plans of the matmul family of prebuilt ops: ``matmul``, ``linear`` and ``mlp``
(validation, the tuners behind their default configs, and each call's ``Product``,
:mod:`.matmul_plan`). ``ops.matmul`` and the others are these functions as prebuilt ops; the
composer's GEMM stages call :func:`product`. The kernel of a call is chosen in one place,
:func:`.matmul_choice.choose_kernel`: float16 runs on the tensor-core kernel
(:mod:`tessera_tile.kernels.matmul.tc`) where the operands' inner axes are contiguous, else on
the float32 SIMT kernel (computing in float32 and rounding once at the store; ``explain`` says
so). float32 runs exactly on the SIMT kernel, or, where the caller opts in with
``precision="tf32"`` and the rows allow ``cp.async``, on the TF32 tensor-core kernel
(:mod:`tessera_tile.kernels.matmul.tf32`).

Batches, strides and launches: :mod:`.matmul_geometry`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ... import dynamic_shared
from ..._runtime import arrays
from ...autotune import autotune
from ...tile_config import (
    CHOICES,
    PRECISIONS,
    WARP_SPECIALISED,
    TileConfig,
    score,
    tile_dtype,
)
from ...tile_ir import BFLOAT16
from .._calls import HandWritten, Report, array_arg
from . import tc, tf32
from .choice import TC_UNALIGNED, as_wgmma, warp_specialised_refusal
from .geometry import (
    MAX_GRID_YZ,
)
from .plan import ACTIVATIONS, DTYPES, INT32_MAX, Product

# --------------------------------------------------------------------------------------------
# validation


def _operand(value, name: str, what: str) -> arrays.Arg:
    rec = array_arg(value, name, DTYPES, what)
    if not rec.shape:
        raise ValueError(f"{name} is 0-dimensional; {what} needs at least 1 dimension")
    return rec


def _broadcast(a: arrays.Arg, b: arrays.Arg, names, a_batch, b_batch) -> tuple[int, ...]:
    try:
        return tuple(np.broadcast_shapes(a_batch, b_batch))
    except ValueError:
        raise ValueError(
            f"{names[0]} of shape {a.shape} and {names[1]} of shape {b.shape}: batch shapes "
            f"{a_batch} and {b_batch} do not broadcast"
        ) from None


def _check_config(config) -> TileConfig | None:
    if config is None:
        return None
    if not isinstance(config, TileConfig):
        raise TypeError(f"config must be a TileConfig or None, got {type(config).__name__}")
    c = config
    if not config.fits():
        raise ValueError(
            f"config {config} needs {config.shared_bytes} B of shared memory; a block may use "
            f"{dynamic_shared.limit()} B on this device ({dynamic_shared.arch()})"
        )
    if c.num_warps == WARP_SPECIALISED:  # the warp-specialised wgmma kernel's own limits
        if not dynamic_shared.wgmma():
            raise warp_specialised_refusal(c, f"this device is {dynamic_shared.arch()}")
        as_wgmma(c).validate()
    elif config.dtype == "float16":  # the tensor-core kernels' own limits
        tc.tensor_core_matmul(c.tile_m, c.tile_n, c.tile_k, c.num_warps, c.num_stages)
    elif config.dtype == "tf32":
        tf32.tf32_matmul(c.tile_m, c.tile_n, c.tile_k, c.num_warps, c.num_stages)
    return config


def _check_precision(precision, dtype: np.dtype, config: TileConfig | None):
    """``precision``: None (exact) or ``"tf32"`` (float32 inputs only), consistent with a
    given ``config``'s tiles."""
    if precision is not None and not isinstance(precision, str):
        raise TypeError(f"precision must be None or a str, got {type(precision).__name__}")
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    if precision == "tf32" and dtype != np.float32:
        raise ValueError(
            f"precision='tf32' is for float32 inputs; {dtype} inputs already run on tensor "
            "cores (leave precision=None)"
        )
    if config is None:
        return precision
    if config.dtype == "tf32" and precision != "tf32":
        raise ValueError(
            "config has tf32 tiles (the TF32 tensor-core kernel), which run float32 inputs "
            f"with precision='tf32'; got precision={precision!r} on {dtype} inputs"
        )
    if precision == "tf32" and config.dtype != "tf32":
        raise ValueError(
            f"precision='tf32' runs on tf32 tiles; config has {config.dtype} tiles: pass "
            "TileConfig(..., dtype='tf32'), or leave precision=None for the exact kernel"
        )
    return precision


def _check_activation(activation):
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
    return activation


def product(
    a, b, names, what, config, bias=None, activation=None, bias_name="bias", precision=None
) -> Product:
    ra, rb = _operand(a, names[0], what), _operand(b, names[1], what)
    if rb.dtype != ra.dtype:
        raise TypeError(
            f"{names[1]} has dtype {rb.dtype} and {names[0]} {ra.dtype}: {what} needs one dtype "
            "(convert one of them first)"
        )
    a_vector = "row" if len(ra.shape) == 1 else None
    b_vector = "col" if len(rb.shape) == 1 else None
    k_a = ra.shape[-1]
    k_b = rb.shape[0] if b_vector else rb.shape[-2]
    if k_a != k_b:
        raise ValueError(
            f"{names[0]} has shape {ra.shape} and {names[1]} {rb.shape}: the inner dimensions "
            f"({k_a} and {k_b}) do not match"
        )
    a_batch = ra.shape[:-2] if not a_vector else ()
    b_batch = rb.shape[:-2] if not b_vector else ()
    batch = _broadcast(ra, rb, names, a_batch, b_batch)
    out_shape = (
        *batch,
        *(() if a_vector else (ra.shape[-2],)),
        *(() if b_vector else (rb.shape[-1],)),
    )
    m = 1 if a_vector else ra.shape[-2]
    cfg = _check_config(config)
    _check_precision(precision, ra.dtype, cfg)
    if cfg is not None and cfg.dtype == "float16" and ra.dtype == np.float32:
        raise ValueError(
            f"config has float16 tiles (the tensor-core kernel); {ra.dtype} inputs need "
            "TileConfig(..., dtype='float32')"
        )
    if ra.dtype == BFLOAT16 and cfg is not None and cfg.dtype != "float16":
        raise ValueError(
            "bfloat16 runs on the tensor cores only: config needs float16 tiles "
            f"(TileConfig(..., dtype='float16')), got {cfg.dtype} tiles"
        )
    product = Product(
        ra,
        rb,
        bias,
        activation,
        cfg,
        what,
        tuple(names) + (bias_name,),
        a_vector,
        b_vector,
        batch,
        out_shape,
        precision,
        tuner_of(what, precision),
    )
    tile_m = product.tile_config().tile_m
    if -(-m // tile_m) > MAX_GRID_YZ:
        raise ValueError(f"{names[0]} has {m} rows: more than {MAX_GRID_YZ} tiles of {tile_m}")
    _check_k(product, names[0])
    return product


def _check_k(product: Product, name: str) -> None:
    """The tensor-core kernels count k-tiles in int32 (with the stages in flight ahead of the
    current one): refuse a K that would wrap, for every tile a launch may take (a call
    without ``config`` may be tuned to any of the choices)."""
    kind = "tf32" if product.precision == "tf32" else tile_dtype(product.dtype.name)
    tiles = [product.config] if product.config is not None else CHOICES
    tiles = [c for c in tiles if c.dtype == kind and kind in ("float16", "tf32")]
    if tiles and kind == "float16":
        tiles.append(TC_UNALIGNED)
    if not tiles:
        return

    def k_limit(c: TileConfig) -> int:
        return (INT32_MAX - c.num_stages) * c.tile_k

    c = min(tiles, key=k_limit)  # the tightest
    limit = k_limit(c)
    if product.k > limit:
        raise ValueError(
            f"{name} has K = {product.k}: the tensor-core kernels count k-tiles of "
            f"{c.tile_k} in int32, so K is at most {limit}"
        )


# --------------------------------------------------------------------------------------------
# the default config: tt.autotune over the candidates, ranked by the analytic model


def tile_model(config: TileConfig, a, b, *rest, precision=None, **kwargs) -> float:
    """The analytic model's score of ``config`` for ``a @ b``
    (:func:`tessera_tile.tile_config.score`, which ``default_config`` minimises)."""
    m = int(np.prod(a.shape[:-1], dtype=np.int64)) if len(a.shape) > 1 else 1
    return score(config, m, b.shape[-1], a.shape[-1], 1, np.dtype(a.dtype).name, precision)


def tile_model_tf32(config: TileConfig, a, b, *rest, **kwargs) -> float:
    """:func:`tile_model` with ``precision="tf32"`` (the TF32 tiles)."""
    return tile_model(config, a, b, precision="tf32")


# The tuners time a call as the op makes it (with config=, which the op does not keep).
def _tuned_matmul(a, b, *, config):
    return matmul(a, b, config=config).run(None, None)


def _tuned_linear(x, w, bias=None, activation=None, *, config):
    return linear(x, w, bias, activation, config=config).run(None, None)


def _tuned_matmul_tf32(a, b, *, config):
    return matmul(a, b, config=config, precision="tf32").run(None, None)


# named as the ops they time (a tuner's disk key holds the name)
for _fn, _name in ((_tuned_matmul, "matmul"), (_tuned_matmul_tf32, "matmul_tf32"),
                   (_tuned_linear, "linear")):  # fmt: skip
    _fn.__qualname__ = _fn.__name__ = _name
    _fn.__module__ = "tessera_tile.ops._matmul"
# The ops' default configs come from these (``TUNED_MATMUL.choose``); ``tessera-tile tune``
# fills their cache ahead of time.
TUNED_MATMUL = autotune(CHOICES, key=["a", "b"], model=tile_model)(_tuned_matmul)
TUNED_LINEAR = autotune(CHOICES, key=["x", "w"], model=tile_model)(_tuned_linear)
# float32 with precision="tf32": the same choices and model, ranking the TF32 tiles
TUNED_MATMUL_TF32 = autotune(CHOICES, key=["a", "b"], model=tile_model_tf32)(_tuned_matmul_tf32)


def tuner_of(name: str, precision: str | None):
    """The tuner whose choice an op takes without ``config=``: ``tuned.linear``'s for
    ``linear`` (which ``tessera-tile tune linear`` fills), ``tuned.matmul_tf32``'s for TF32
    calls, ``tuned.matmul``'s otherwise (``matmul``, and both kernels of ``mlp``)."""
    if precision == "tf32":
        return TUNED_MATMUL_TF32
    return TUNED_LINEAR if name == "linear" else TUNED_MATMUL


# --------------------------------------------------------------------------------------------
# the ops


def matmul(a, b, *, config=None, precision=None):
    """``a @ b`` with NumPy's ``matmul`` semantics: 2-D, batched (leading dimensions broadcast,
    without copies) and 1-D operands (a vector on the left is a row, on the right a column;
    its dimension is dropped from the result).

    a, b: float32 (computed exactly in float32 SIMT) or float16 (on the tensor cores, or the
    float32 SIMT kernel for a strided inner axis: products and sums in float32, rounded to
    float16 once, so a result beyond float16's range is inf), or bfloat16 (on the tensor cores
    only, the same way: a device operand needs a contiguous last axis); one dtype for both;
    host or device, any strides. NaN and inf follow IEEE arithmetic, as NumPy (``inf * 0`` is NaN).
    K = 0 gives zeros.
    config: a :class:`tessera_tile.TileConfig`, or None for the analytic model's default.
    precision: None (float32 computed exactly) or ``"tf32"``: float32 inputs on TF32 tensor
    cores, each input read with 10 mantissa bits (relative error up to ``2**-10`` per input;
    float32 accumulation), where rows are 16-byte aligned (else the exact kernel; ``explain``
    says which). ValueError for float16 and bfloat16 inputs, which already run on tensor cores.
    One kernel (one launch per batch run; see ``docs/matmul.md``).
    """
    return product(a, b, ("a", "b"), "matmul", config, precision=precision)


def linear(x, w, bias=None, activation=None, *, config=None, precision=None):
    """``activation(x @ w + bias)`` in one kernel: the bias and the activation run on the
    accumulator tile in registers before its single store.

    x: (..., K); w: (K, N); bias: None or (N,), all of one dtype (float32 or float16).
    activation: None, ``"relu"``, ``"gelu"`` (exact, erf), ``"gelu_tanh"`` (tanh approximation)
    or ``"silu"``, as in PyTorch. K = 0 gives ``activation(bias)``. float16: the bias and the
    activation run on the float32 accumulator before the one rounding. NaN propagates through
    every activation; inputs where ``exp`` overflows give the activation's limit.
    precision: None (exact) or ``"tf32"`` (float32 on TF32 tensor cores), as in :func:`matmul`.
    """
    return _linear(x, w, bias, activation, config, ("x", "w", "bias"), "linear", precision)


def _linear(x, w, bias, activation, config, names, what, precision=None) -> Product:
    x_name, w_name, bias_name = names
    rw = _operand(w, w_name, what)
    if len(rw.shape) != 2:
        raise ValueError(f"{w_name} has shape {rw.shape}; {what} needs {w_name} of shape (K, N)")
    _check_activation(activation)
    rbias = None
    if bias is not None:
        rbias = arrays.read(bias, bias_name, scalars=False)
        if rbias.shape != rw.shape[1:]:
            raise ValueError(f"{bias_name} has shape {rbias.shape}; {what} needs ({rw.shape[1]},)")
        if rbias.dtype != rw.dtype:
            raise TypeError(
                f"{bias_name} has dtype {rbias.dtype}; it must match {w_name}'s dtype {rw.dtype}"
            )
    return product(x, w, (x_name, w_name), what, config, rbias, activation, bias_name, precision)


@dataclass
class _Mlp(HandWritten):
    first: Product
    second: Product

    @property
    def out_shape(self) -> tuple:
        return self.second.out_shape

    @property
    def dtype(self):
        return self.second.dtype

    def inputs(self) -> dict:
        second = {"w2": self.second.b}
        if self.second.bias is not None:
            second["b2"] = self.second.bias
        return {**self.first.inputs(), **second}

    def execute(self, place, records, result) -> None:
        """The first product into a hidden temporary, the second from it."""
        n_first = len(self.first.inputs())
        hidden = place.temp(self.first.out_shape, self.first.dtype)
        self.first.execute(place, records[:n_first], hidden)
        self.second.execute(place, [hidden, *records[n_first:]], result)

    def flops(self) -> int:
        return self.first.flops() + self.second.flops()

    def hidden_bytes(self) -> int:
        """The hidden activation's traffic: written once by the first kernel, read once per
        column of output tiles by the second."""
        h = math.prod(self.first.out_shape) * self.first.dtype.itemsize
        cols = -(-self.second.n // self.second.tile_config().tile_n)
        return h * (1 + cols)

    def report(self) -> Report:
        one, two = self.first.report(), self.second.report()
        reasons = [
            "two kernels: the second product needs whole rows of the hidden activation, "
            f"which a tile of the first does not hold; the hidden activation costs "
            f"{self.hidden_bytes()} B of traffic (written once, read once per column of "
            "output tiles)",
            *sorted(set(one.reasons + two.reasons)),
        ]
        return Report(
            "mlp",
            one.launches + two.launches,
            one.stages + two.stages,
            one.bytes_fused + two.bytes_fused,
            one.bytes_unfused + two.bytes_unfused,
            reasons,
        )


def mlp(x, w1, b1, w2, b2, activation="gelu", *, precision=None):
    """``activation(x @ w1 + b1) @ w2 + b2``: two ``linear`` kernels, the first with the
    activation in its epilogue, the second with the bias in its epilogue.

    x: (..., K); w1: (K, H); b1: (H,) or None; w2: (H, N); b2: (N,) or None; one dtype.
    The hidden activation (..., H) goes through device memory: written once, read once per
    column of output tiles of the second kernel (``docs/matmul.md`` says when keeping it on
    chip would pay). precision: None (exact) or ``"tf32"`` for both products, as in
    :func:`matmul`. float16: each product computes in float32 as in :func:`linear`, and the
    hidden activation is rounded to float16 between them; NaN and inf as in :func:`linear`.
    """
    first = _linear(x, w1, b1, activation, None, ("x", "w1", "b1"), "mlp", precision)
    rw2 = _operand(w2, "w2", "mlp")
    if len(rw2.shape) != 2 or rw2.shape[0] != first.n:
        raise ValueError(f"w2 has shape {rw2.shape}; mlp needs ({first.n}, N) after w1")
    if rw2.dtype != first.dtype:
        raise TypeError(f"w2 has dtype {rw2.dtype}; it must match x's dtype {first.dtype}")
    hidden = arrays.placeholder(first.out_shape, first.dtype)  # a device temporary
    rb2 = None
    if b2 is not None:
        rb2 = arrays.read(b2, "b2", scalars=False)
        if rb2.shape != rw2.shape[1:]:
            raise ValueError(f"b2 has shape {rb2.shape}; mlp needs ({rw2.shape[1]},)")
        if rb2.dtype != first.dtype:
            raise TypeError(f"b2 has dtype {rb2.dtype}; it must match x's dtype {first.dtype}")
    second = Product(
        hidden, rw2, rb2, None, None, "mlp", ("hidden", "w2", "b2"),
        first.a_vector, None, first.batch,
        (*first.out_shape[:-1], rw2.shape[1]), precision, tuner_of("mlp", precision),
    )  # fmt: skip
    _check_k(second, "w2")  # before the first product launches
    return _Mlp(first, second)
