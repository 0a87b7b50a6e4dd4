"""The matmul family of prebuilt ops: ``matmul``, ``linear`` and ``mlp`` (validation, result
allocation, launch geometry, dispatch, ``explain`` and ``inspect``).

:mod:`tessera_tile.ops` re-exports them. The kernel of a call is chosen in one place,
:func:`choose_kernel` (dtype, config, activation, bias, operand layouts -> kernel factory and
launch): float16 runs on the tensor-core kernel (:mod:`tessera_tile.kernels.matmul_tc`) where
the operands' inner axes are contiguous, else on the float32 SIMT kernel (computing in float32
and rounding once at the store; ``explain`` says so). float32 runs exactly on the SIMT kernel,
or, where the caller opts in with ``precision="tf32"`` and the rows allow ``cp.async``, on the
TF32 tensor-core kernel (:mod:`tessera_tile.kernels.matmul_tf32`).

Batches, strides and launches: :mod:`tessera_tile._matmul_geometry`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from . import _arrays as arrays
from ._matmul_geometry import (
    MAX_GRID_YZ,
    Matrix,
    array_type,
    as_matrix,
    copy_bytes,
    first_address,
    geometry,
    inner_contiguous,
    layout,
    matrix_view,
    rows_aligned,
)
from ._prebuilt import PrebuiltOp, array_arg, check_out, source_of
from .autotune import autotune
from .kernels import epilogue
from .kernels import matmul as simt
from .kernels import matmul_tc as tc
from .kernels import matmul_tf32 as tf32
from .tile_config import (
    CANDIDATES,
    CHOICES,
    PRECISIONS,
    TileConfig,
    estimate,
    score,
    waves_text,
)

__all__ = ["ACTIVATIONS", "linear", "matmul", "mlp"]

DTYPES = tuple(np.dtype(d) for d in ("float16", "float32"))
ACTIVATIONS = (None, "relu", "gelu", "gelu_tanh", "silu")
DEVICE_ALIGN = 256  # device allocations (host inputs' copies, results) start this aligned
INT32_MAX = 2**31 - 1


# --------------------------------------------------------------------------------------------
# the one place a kernel is chosen


@dataclass(frozen=True)
class KernelChoice:
    kernel: object
    config: TileConfig
    threads: int
    signature: str
    reasons: tuple[str, ...]

    def grid(self, m: int, n: int, z: int) -> tuple[int, int, int]:
        c = self.config
        return (-(-n // c.tile_n), -(-m // c.tile_m), z)


# float16 operands whose rows are not 16-byte aligned: the tensor-core kernel's synchronous
# variant, with 8 warps and 2 stages (with 4 warps its guarded loads spill)
TC_UNALIGNED = TileConfig(128, 128, 32, 8, 2, dtype="float16")
# float16 or precision="tf32" on operands the tensor-core kernels cannot take (a strided inner
# axis; for TF32 also rows not 16-byte aligned): the float32 SIMT kernel's shipped default tile
SIMT_FALLBACK = CANDIDATES[0]


def choose_kernel(
    dtype: np.dtype, config: TileConfig, activation, has_bias: bool, copy_a: int, copy_b: int,
    vector_store: bool, types: tuple, names: tuple[str, str] = ("a", "b"),
    tensor_rows: str | None = None,
) -> KernelChoice:  # fmt: skip
    """The kernel and launch of one call.

    float16 with a float16 ``config`` goes to the tensor cores when ``tensor_rows`` allows it
    (``"aligned"``: every row of A, B and C 16-byte aligned on a contiguous inner axis, the
    ``cp.async`` kernel; ``"contiguous"``: inner axes contiguous, the synchronous variant with
    :data:`TC_UNALIGNED`); otherwise, and for a float32 ``config``, to the SIMT kernel, which
    widens float16 into float32 tiles. float32 runs on the SIMT kernel, with 16-byte copies
    where ``copy_a``/``copy_b`` say the rows allow them; with a tf32 ``config``
    (``precision="tf32"``) on the TF32 tensor-core kernel where ``tensor_rows`` is
    ``"aligned"``, else exactly on the SIMT kernel with :data:`SIMT_FALLBACK` (a reason says so);
    float16 with a float16 ``config`` on a strided inner axis runs on that tile too.
    """
    reasons = []
    if config.dtype == "tf32":
        if tensor_rows == "aligned":
            c = config
            kernel = tf32.tf32_matmul(
                c.tile_m, c.tile_n, c.tile_k, c.num_warps, c.num_stages, activation, has_bias
            )
            reasons.append(
                "precision='tf32': float32 on TF32 tensor cores (mma m16n8k8; each input read "
                "with 10 mantissa bits, the low 13 ignored; float32 accumulation)"
            )
            signature = f"void({', '.join(types)})"
            return KernelChoice(kernel, config, config.threads, signature, tuple(reasons))
        reasons.append(
            "precision='tf32' asked for, but "
            + ("an operand's inner axis is strided" if tensor_rows is None else
               "rows are not 16-byte aligned (K or N not a multiple of 4, or an offset view)")
            + ": the exact float32 SIMT kernel instead (TF32 is an opt-in to speed; the "
            f"fallback computes exactly, tile {SIMT_FALLBACK})"
        )  # fmt: skip
        config = SIMT_FALLBACK
    if dtype == np.float16 and config.dtype == "float16" and tensor_rows is not None:
        if tensor_rows == "contiguous":
            reasons.append(
                "rows not 16-byte aligned (K or N not a multiple of 8, or an offset view): the "
                "tensor-core kernel's synchronous variant, 8 warps, 2 stages"
            )
            config = TC_UNALIGNED
        c = config
        kernel = tc.tensor_core_matmul(
            c.tile_m, c.tile_n, c.tile_k, c.num_warps, c.num_stages, activation, has_bias,
            async_copy=tensor_rows == "aligned",
        )  # fmt: skip
        signature = f"void({', '.join(types)})"
        return KernelChoice(kernel, config, config.threads, signature, tuple(reasons))
    if dtype == np.float16:
        reasons.append(
            "float16 on the float32 SIMT kernel (staged and accumulated in float32, rounded "
            "once at the store): "
            + ("a float32 TileConfig was given" if config.dtype == "float32" else
               "an operand's inner axis is strided, which the tensor-core kernel cannot take "
               f"(tile {SIMT_FALLBACK})")
        )  # fmt: skip
        if config.dtype != "float32":
            config = SIMT_FALLBACK
        kernel = simt.simt_matmul(
            config, activation, has_bias, 4, 4, async_copy=False, vector_store=False
        )
    else:
        for name, width in zip(names, (copy_a, copy_b), strict=True):
            if width == 4:
                reasons.append(
                    f"{name}'s rows are not 16-byte aligned and contiguous: 4-byte cp.async "
                    "copies, read in place"
                )
        kernel = simt.simt_matmul(
            config, activation, has_bias, copy_a, copy_b, vector_store=vector_store
        )
    signature = f"void({', '.join(types)})"
    return KernelChoice(kernel, config, config.threads, signature, tuple(reasons))


# --------------------------------------------------------------------------------------------
# one tiled product with its epilogue: the plan behind matmul and linear, and mlp's stages


MAX_LAUNCH_PLANS = 256
_LAUNCH_PLANS: dict = {}  # Product.plan_launches, by layout


def _layout(rec: arrays.Arg | None):
    """What a launch plan depends on of one operand: shape, strides, dtype, and the address
    modulo 16 (the tensor-core kernels copy 16-byte chunks where rows are aligned)."""
    if rec is None:
        return None
    return rec.shape, rec.strides, rec.dtype.str, rec.address % 16


@dataclass
class Product:
    """``activation(a @ b + bias)`` over a broadcast batch, as one kernel per launch."""

    a: arrays.Arg
    b: arrays.Arg
    bias: arrays.Arg | None
    activation: str | None
    config: TileConfig | None
    name: str = "matmul"
    names: tuple[str, ...] = ("a", "b", "bias")
    a_vector: str | None = None
    b_vector: str | None = None
    batch: tuple[int, ...] = ()
    out_shape: tuple[int, ...] = field(default=())
    precision: str | None = None  # None: exact float32 (SIMT); "tf32": TF32 tensor cores

    @property
    def dtype(self) -> np.dtype:
        return self.a.dtype

    @property
    def m(self) -> int:
        return as_matrix(self.a, self.batch, self.a_vector).rows

    @property
    def n(self) -> int:
        return as_matrix(self.b, self.batch, self.b_vector).cols

    @property
    def k(self) -> int:
        return as_matrix(self.a, self.batch, self.a_vector).cols

    @property
    def empty(self) -> bool:
        """No C element to compute (M, N or a batch dimension is 0): nothing is launched."""
        return not (self.m and self.n and math.prod(self.batch))

    def tile_config(self) -> TileConfig:
        """The given config, else the op's tuner's for these operands (:meth:`_tuner`): the
        choice made for their shape bucket, or the model's where none is yet (reports time
        nothing; a launch tunes first, see :meth:`launch`)."""
        if self.config is not None:
            return self.config
        return self._tuner().expected(self.a, self.b)

    def _tuner(self):
        """The tuner whose choice this op takes: ``tuned.linear``'s for ``linear`` (which
        ``tessera-tile tune linear`` fills), ``tuned.matmul_tf32``'s for TF32 calls,
        ``tuned.matmul``'s otherwise (``matmul``, and both kernels of ``mlp``)."""
        if self.precision == "tf32":
            return TUNED_MATMUL_TF32
        return TUNED_LINEAR if self.name == "linear" else TUNED_MATMUL

    def _c_matrix(self, rec: arrays.Arg) -> Matrix:
        """The result as a (batch, M, N) stack, whatever 1-D squeezing its shape had."""
        shape, strides = list(rec.shape[len(self.batch) :]), list(rec.strides[len(self.batch) :])
        if self.a_vector:
            shape, strides = [1, *shape], [0, *strides]
        if self.b_vector:
            shape, strides = [*shape, 1], [*strides, 0]
        full = arrays.Arg(
            rec.kind, rec.value, (*self.batch, *shape),
            (*rec.strides[: len(self.batch)], *strides), rec.dtype, rec.address,
        )  # fmt: skip
        return as_matrix(full, self.batch, None)

    def _c_record(self, out: arrays.Arg | None) -> arrays.Arg:
        """A stand-in for the result's layout (a new result is C-contiguous, device-aligned)."""
        if out is not None and out.kind == arrays.DEVICE:
            return out
        strides = arrays.contiguous_strides(self.out_shape, self.dtype.itemsize)
        return arrays.Arg(arrays.DEVICE, None, self.out_shape, strides, self.dtype, DEVICE_ALIGN)

    def _device_like(self, rec: arrays.Arg) -> arrays.Arg:
        """A host operand as its device copy will be: contiguous, aligned."""
        if rec.kind == arrays.DEVICE:
            return rec
        strides = arrays.contiguous_strides(rec.shape, rec.dtype.itemsize)
        return arrays.Arg(arrays.DEVICE, None, rec.shape, strides, rec.dtype, DEVICE_ALIGN)

    def plan_launches(self, a: arrays.Arg, b: arrays.Arg, c: arrays.Arg):
        """(geometry, matrices, and per launch: (index, z0, count, KernelChoice)), made once
        per layout of the operands and config, then looked up."""
        config = self.tile_config()
        key = (
            config, self.precision, self.activation, self.names[:2], self.batch, self.a_vector,
            self.b_vector, *(_layout(r) for r in (a, b, self.bias, c)),
        )  # fmt: skip
        got = _LAUNCH_PLANS.get(key)
        if got is None:
            got = self._plan_launches(a, b, c, config)
            if len(_LAUNCH_PLANS) >= MAX_LAUNCH_PLANS:  # a bound: start over
                _LAUNCH_PLANS.clear()
            _LAUNCH_PLANS[key] = got
        return got

    def _plan_launches(self, a, b, c, config: TileConfig):
        mats = [
            as_matrix(a, self.batch, self.a_vector),
            as_matrix(b, self.batch, self.b_vector),
            self._c_matrix(c),
        ]
        geo = geometry(self.batch, mats)
        act = epilogue.activation_function(self.activation)
        bias_type = array_type(  # without a bias, a 1-element float32 dummy
            np.dtype(np.float32) if self.bias is None else self.bias.dtype,
            1, "C" if self.bias is None or self.bias.contiguous else "A",
        )  # fmt: skip
        launches = []
        for index, z0, count in geo.indices():
            (ma, mb, mc), (za, zb, zc) = mats, geo.z_strides
            one = count == 1  # a single matrix: its batch stride is never used
            copy_a = copy_bytes(ma, 0 if one else za, first_address(a, ma, index), a.dtype)
            copy_b = copy_bytes(mb, 0 if one else zb, first_address(b, mb, index), b.dtype)
            vector_store = self.dtype == np.float32 and (mc.cols <= 1 or mc.col_stride == 4)
            tensor_rows = None
            if all(inner_contiguous(x) for x in mats):
                addresses = (first_address(a, ma, index), first_address(b, mb, index),
                             first_address(c, mc, index))  # fmt: skip
                z = (0, 0, 0) if one else (za, zb, zc)
                chunk = 16 // self.dtype.itemsize  # elements per 16-byte cp.async
                aligned = all(
                    rows_aligned(x, zs, ad) and x.cols % chunk == 0
                    for x, zs, ad in zip(mats, z, addresses, strict=True)
                )
                tensor_rows = "aligned" if aligned else "contiguous"
            types = (
                array_type(a.dtype, 3, layout(ma, count, za)),
                array_type(b.dtype, 3, layout(mb, count, zb)),
                bias_type,
                array_type(c.dtype, 3, layout(mc, count, zc)),
            )
            choice = choose_kernel(
                self.dtype,
                config,
                act,
                self.bias is not None,
                copy_a,
                copy_b,
                vector_store,
                types,
                self.names[:2],
                tensor_rows,
            )
            launches.append((index, z0, count, choice))
        return geo, mats, launches

    # running ------------------------------------------------------------------------------
    def launch(self, place: arrays.Placement, a, b, bias, c) -> None:
        """Launch on device records ``a``, ``b``, ``bias`` (or None), ``c``."""
        if self.empty:
            return
        if self.config is None:  # the first launch of a shape bucket tunes (times, on a GPU)
            self._tuner().choose(a, b)
        hbias = arrays.device_handle(bias) if bias is not None else arrays.unused(np.float32)
        for choice, grid, (va, vb, vc) in self.launch_views(a, b, c):
            with np.errstate(all="ignore"):  # the simulator computes in NumPy
                choice.kernel[grid, choice.threads, place.stream](va, vb, hbias, vc)

    def launch_views(self, a, b, c):
        """Per launch on device records ``a``, ``b``, ``c``: its KernelChoice, grid, and the
        (z, rows, cols) views of A, B and C it takes."""
        geo, (ma, mb, mc), launches = self.plan_launches(a, b, c)
        handles = [arrays.device_handle(r) for r in (a, b, c)]
        for index, _z0, count, choice in launches:
            views = tuple(
                matrix_view(h, m, index, count, z)
                for h, m, z in zip(handles, (ma, mb, mc), geo.z_strides, strict=True)
            )
            yield choice, choice.grid(self.m, self.n, count), views

    def run(self, out, stream):
        o = _out(check_out(out, self.out_shape, self.dtype, self._inputs()))
        place = arrays.Placement(self._input_list(), [o], stream)
        result = place.result(self.out_shape, self.dtype, o)
        a, b = place.device(self.a), place.device(self.b)
        bias = None if self.bias is None else place.device(self.bias)
        self.launch(place, a, b, bias, result)
        return place.finish(result, o)

    def _inputs(self) -> dict:
        named = {self.names[0]: self.a, self.names[1]: self.b}
        if self.bias is not None:
            named[self.names[2] if len(self.names) > 2 else "bias"] = self.bias
        return named

    def _input_list(self) -> list:
        return list(self._inputs().values())

    # reports --------------------------------------------------------------------------------
    def predicted_bytes(self, cfg: TileConfig) -> int:
        """Global bytes of the kernel(s) launched with ``cfg``: A once per column of C tiles,
        B once per row of them, C written once; the bias once per row of C tiles (SIMT: staged
        per block), or once per warp row (tensor cores: read in the epilogue by one lane group
        and shuffled to the other 7)."""
        z = math.prod(self.batch)
        m, n, k = self.m, self.n, self.k
        rows, cols = -(-m // cfg.tile_m), -(-n // cfg.tile_n)
        item = self.dtype.itemsize
        if not (m and n):
            return 0
        nbytes = z * item * (m * k * cols + k * n * rows + m * n)
        if self.bias is not None:
            reads = 1
            if cfg.dtype != "float32":  # the tensor-core kernels' epilogue
                c = cfg
                reads = tc.TensorCoreConfig(c.tile_m, c.tile_n, c.tile_k, c.num_warps).warps_m
            nbytes += z * rows * n * self.bias.dtype.itemsize * reads
        return nbytes

    def flops(self) -> int:
        return 2 * math.prod(self.batch) * self.m * self.n * self.k

    def unfused_bytes(self, fused: int) -> int:
        """The same product (``fused`` bytes), then the bias add and the activation as
        kernels of their own (each reads C and writes it back)."""
        mn = math.prod(self.batch) * self.m * self.n * self.dtype.itemsize
        extra = 0
        if self.bias is not None:
            extra += 2 * mn + self.n * self.bias.dtype.itemsize
        if self.activation is not None:
            extra += 2 * mn
        return fused + extra

    def stage_text(self, launches) -> list[str]:
        cfg = launches[0][3].config
        e = estimate(
            max(self.m, 1), max(self.n, 1), max(self.k, 1),
            max(math.prod(self.batch), 1), cfg, self.dtype.itemsize,
        )  # fmt: skip
        names = sorted({choice.kernel.py_func.__name__ for *_, choice in launches})
        epi = ["+ bias" if self.bias is not None else "", self.activation or ""]
        epi_text = " ".join(x for x in epi if x) or "none"
        return [
            f"{name}: {self.name} ({self.m} x {self.k}) @ ({self.k} x {self.n}) over batch "
            f"{self.batch or '()'} in {len(launches)} launch(es); tile {cfg}; epilogue "
            f"{epi_text} in registers before the one store; {waves_text(e)}"
            for name in names
        ]

    def distinct(self, launches) -> list:
        seen, out = set(), []
        for *_, choice in launches:
            key = (choice.kernel, choice.signature)
            if key not in seen:
                seen.add(key)
                out.append(choice)
        return out

    def explain_parts(self, out=None):
        a, b = self._device_like(self.a), self._device_like(self.b)
        _, _, launches = self.plan_launches(a, b, self._c_record(out))
        reasons = sorted({r for *_, choice in launches for r in choice.reasons})
        return launches, reasons

    def explain(self):
        from .fusion import Explain

        launches, reasons = self.explain_parts()
        kernels = [] if self.empty else self.distinct(launches)
        # the config the kernel runs with (float16 on unaligned rows: TC_UNALIGNED)
        fused = self.predicted_bytes(launches[0][3].config if launches else self.tile_config())
        return Explain(
            kernels=len(kernels),
            ir=f"hand-written {self.name} (no Tile IR)",
            source="\n\n".join(source_of(c.kernel) for c in kernels[:1]),
            bytes_fused=fused,
            bytes_unfused=self.unfused_bytes(fused),
            reasons=reasons,
            stages=self.stage_text(launches) if kernels else [],
        )

    def inspect(self, arch: str) -> list:
        from . import inspect as offline

        launches, _ = self.explain_parts()
        if self.empty:
            return []
        return [
            offline.compile(c.kernel, c.signature, arch=arch, block=c.threads)
            for c in self.distinct(launches)
        ]


# --------------------------------------------------------------------------------------------
# validation


def _operand(value, name: str, what: str) -> arrays.Arg:
    rec = array_arg(value, name, DTYPES, what)
    if not rec.shape:
        raise ValueError(f"{name} is 0-dimensional; {what} needs at least 1 dimension")
    return rec


def _out(o: arrays.Arg | None) -> arrays.Arg | None:
    """``out=``'s record; ValueError where it repeats memory (a stride-0 axis)."""
    if o is None:
        return None
    if o.size and any(n > 1 and s == 0 for n, s in zip(o.shape, o.strides, strict=True)):
        raise ValueError("out repeats memory (a stride of 0): its copies would race")
    return o


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
    if config.dtype == "float16":  # the tensor-core kernels' own limits
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
    if precision == "tf32" and dtype == np.float16:
        raise ValueError(
            "precision='tf32' is for float32 inputs; float16 inputs already run on tensor "
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


def _product(
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
    if cfg is not None and cfg.dtype == "float16" and ra.dtype != np.float16:
        raise ValueError(
            f"config has float16 tiles (the tensor-core kernel); {ra.dtype} inputs need "
            "TileConfig(..., dtype='float32')"
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
    kind = "tf32" if product.precision == "tf32" else product.dtype.name
    tiles = [product.config] if product.config is not None else CHOICES
    tiles = [c for c in tiles if c.dtype == kind and kind in ("float16", "tf32")]
    if tiles and kind == "float16":
        tiles.append(TC_UNALIGNED)
    for c in tiles:
        limit = (INT32_MAX - c.num_stages) * c.tile_k
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


def _tuned_matmul(a, b, *, config):
    return matmul(a, b, config=config)


def _tuned_linear(x, w, bias=None, activation=None, *, config):
    return linear(x, w, bias, activation, config=config)


def _tuned_matmul_tf32(a, b, *, config):
    return matmul(a, b, config=config, precision="tf32")


_tuned_matmul.__qualname__ = _tuned_matmul.__name__ = "matmul"
_tuned_matmul_tf32.__qualname__ = _tuned_matmul_tf32.__name__ = "matmul_tf32"
_tuned_linear.__qualname__ = _tuned_linear.__name__ = "linear"
# The ops' default configs come from these (``TUNED_MATMUL.choose``); ``tessera-tile tune``
# fills their cache ahead of time.
TUNED_MATMUL = autotune(CHOICES, key=["a", "b"], model=tile_model)(_tuned_matmul)
TUNED_LINEAR = autotune(CHOICES, key=["x", "w"], model=tile_model)(_tuned_linear)
# float32 with precision="tf32": the same choices and model, ranking the TF32 tiles
TUNED_MATMUL_TF32 = autotune(CHOICES, key=["a", "b"], model=tile_model_tf32)(_tuned_matmul_tf32)


# --------------------------------------------------------------------------------------------
# the ops


def matmul(a, b, *, config=None, precision=None):
    """``a @ b`` with NumPy's ``matmul`` semantics: 2-D, batched (leading dimensions broadcast,
    without copies) and 1-D operands (a vector on the left is a row, on the right a column;
    its dimension is dropped from the result).

    a, b: float32 (computed exactly in float32 SIMT) or float16 (on the tensor cores, or the
    float32 SIMT kernel for a strided inner axis: products and sums in float32, rounded to
    float16 once, so a result beyond float16's range is inf); one dtype for both; host or
    device, any strides. NaN and inf follow IEEE arithmetic, as NumPy (``inf * 0`` is NaN).
    K = 0 gives zeros.
    config: a :class:`tessera_tile.TileConfig`, or None for the analytic model's default.
    precision: None (float32 computed exactly) or ``"tf32"``: float32 inputs on TF32 tensor
    cores, each input read with 10 mantissa bits (relative error up to ``2**-10`` per input;
    float32 accumulation), where rows are 16-byte aligned (else the exact kernel; ``explain``
    says which). ValueError for float16 inputs, which already run on tensor cores.
    One kernel (one launch per batch run; see ``docs/matmul.md``).
    """
    return _product(a, b, ("a", "b"), "matmul", config, precision=precision)


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
    return _product(x, w, (x_name, w_name), what, config, rbias, activation, bias_name, precision)


@dataclass
class _Mlp:
    first: Product
    second: Product

    def run(self, out, stream):
        second = self.second
        inputs = {**self.first._inputs(), "w2": second.b}
        if second.bias is not None:
            inputs["b2"] = second.bias
        o = _out(check_out(out, second.out_shape, second.dtype, inputs))
        place = arrays.Placement(list(inputs.values()), [o], stream)
        x, w1, w2 = (place.device(r) for r in (self.first.a, self.first.b, second.b))
        b1 = None if self.first.bias is None else place.device(self.first.bias)
        b2 = None if second.bias is None else place.device(second.bias)
        hidden = place.temp(self.first.out_shape, self.first.dtype)
        self.first.launch(place, x, w1, b1, hidden)
        result = place.result(second.out_shape, second.dtype, o)
        second.launch(place, hidden, w2, b2, result)
        return place.finish(result, o)

    def hidden_bytes(self) -> int:
        """The hidden activation's traffic: written once by the first kernel, read once per
        column of output tiles by the second."""
        h = math.prod(self.first.out_shape) * self.first.dtype.itemsize
        cols = -(-self.second.n // self.second.tile_config().tile_n)
        return h * (1 + cols)

    def explain(self):
        from .fusion import Explain

        one, two = self.first.explain(), self.second.explain()
        reasons = [
            "two kernels: the second product needs whole rows of the hidden activation, "
            f"which a tile of the first does not hold; the hidden activation costs "
            f"{self.hidden_bytes()} B of traffic (written once, read once per column of "
            "output tiles)",
            *sorted(set(one.reasons + two.reasons)),
        ]
        return Explain(
            kernels=one.kernels + two.kernels,
            ir="hand-written mlp (no Tile IR)",
            source="\n\n".join(s for s in (one.source, two.source) if s),
            bytes_fused=one.bytes_fused + two.bytes_fused,
            bytes_unfused=one.bytes_unfused + two.bytes_unfused,
            reasons=reasons,
            stages=one.stages + two.stages,
        )

    def inspect(self, arch: str) -> list:
        return self.first.inspect(arch) + self.second.inspect(arch)


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
    hidden = arrays.Arg(
        first.a.kind, None, first.out_shape,
        arrays.contiguous_strides(first.out_shape, first.dtype.itemsize), first.dtype,
        DEVICE_ALIGN,
    )  # fmt: skip
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
        (*first.out_shape[:-1], rw2.shape[1]), precision,
    )  # fmt: skip
    _check_k(second, "w2")  # before the first product launches
    return _Mlp(first, second)


matmul = PrebuiltOp(matmul)
linear = PrebuiltOp(linear)
mlp = PrebuiltOp(mlp)
