"""The plan of one matmul-family call: a tiled product with its epilogue (:class:`Product`,
behind ``matmul``, ``linear`` and each stage of ``mlp``), its kernel (chosen in one place,
:func:`.matmul_choice.choose_kernel`), and its launches, planned once per layout of the
operands.

:mod:`.matmul_calls` validates a call and makes its ``Product``; batches, strides and views are
:mod:`.matmul_geometry`'s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..._runtime import arrays, target
from ..._runtime.launch import Extras, KernelLaunch, Unused, View
from ..._runtime.memo import MAX_LAUNCH_PLANS, CountingCache
from ...tile_config import (
    WARP_SPECIALISED,
    TileConfig,
    estimate,
    traffic_bytes,
    waves_text,
)
from ...tile_ir import BFLOAT16
from .. import epilogue
from .._calls import (
    HandWritten,
    Report,
    device_like,
    distinct,
    view_dtype,
)
from . import tc
from .choice import choose_kernel
from .geometry import (
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
    transpose,
)

DTYPES = (np.dtype(np.float16), BFLOAT16, np.dtype(np.float32))
ACTIVATIONS = (None, *epilogue.ACTIVATIONS)  # the activation table's names (tile_ir)
INT32_MAX = 2**31 - 1


# --------------------------------------------------------------------------------------------
# one tiled product with its epilogue: the plan behind matmul and linear, and mlp's stages


_LAUNCH_PLANS = CountingCache(bound=MAX_LAUNCH_PLANS)  # Product.plan_launches, by layout


def _broadcast_to(rec: arrays.Arg, shape: tuple) -> arrays.Arg:
    """``rec`` broadcast to ``shape`` as NumPy would: stride 0 along new or length-1 axes."""
    pad = len(shape) - len(rec.shape)
    strides = (0,) * pad + tuple(
        s if n == size else 0
        for n, s, size in zip(rec.shape, rec.strides, shape[pad:], strict=True)
    )
    return arrays.Arg(rec.kind, rec.value, tuple(shape), strides, rec.dtype, rec.address)


def _layout(rec: arrays.Arg | None):
    return None if rec is None else rec.layout()


@dataclass
class Product(HandWritten):
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
    tuner: object = None  # the op's tt.autotune tuner (see _matmul.tuner_of)
    # A generated epilogue (a matmul in @tt.fuse) in place of the activation: an
    # epilogue.ElementEpilogue, the arrays it reads (broadcast into the result's shape, which
    # then has no 1-D squeezing) and its scalars' parameters and Numba types.
    epilogue: object = None
    extras: tuple = ()
    scalars: tuple = ()
    scalar_types: tuple = ()
    # a second right operand (b's shape, dtype and batch): the dual kernel computes a @ b2 on
    # the same A tiles, its accumulator the epilogue's second argument
    b2: arrays.Arg | None = None
    # elementwise functions of A's and B's elements applied as their tiles land (a matmul in
    # @tt.fuse of an operand computed from one array): prologue.ElementPrologue or None
    prologue: tuple = (None, None)
    # the operands' dtype where a prologue's array has another (a cast on the way in)
    operand_dtype: np.dtype | None = None

    @property
    def dtype(self) -> np.dtype:
        return self.operand_dtype or self.a.dtype

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
        """The given config, else the op's tuner's for these operands (:attr:`tuner`): the
        choice made for their shape bucket, or the model's where none is yet (reports time
        nothing; a launch tunes first, see :meth:`launch`)."""
        if self.config is not None:
            return self.config
        return self.tuner.expected(*self._as_operands(self.a, self.b))

    def _as_operands(self, *records) -> list[arrays.Arg]:
        """Records as the operands the tuner sees: of the operands' dtype (a prologue's array
        may have another)."""
        return [r if r.dtype == self.dtype else r._replace(dtype=self.dtype) for r in records]

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

    def _extra_matrices(self) -> list[Matrix]:
        """The arrays a generated epilogue reads, as stacks over the batch, broadcast."""
        return [as_matrix(_broadcast_to(r, self.out_shape), self.batch, None) for r in self.extras]

    def _c_record(self, out: arrays.Arg | None) -> arrays.Arg:
        """A stand-in for the result's layout (a new result is C-contiguous, device-aligned)."""
        if out is not None and out.kind == arrays.DEVICE:
            return out
        return arrays.placeholder(self.out_shape, self.dtype)

    def plan_launches(self, a: arrays.Arg, b: arrays.Arg, c: arrays.Arg):
        """(geometry, the matrices the kernels read (A and B transposed where the choice
        reads them so), and per launch: (index, z0, count, KernelChoice)), made once per
        layout of the operands and config, then looked up."""
        config = self.tile_config()
        key = (
            config, self.precision, self.activation, self.names[:2], self.batch, self.a_vector,
            self.b_vector, *(_layout(r) for r in (a, b, self.bias, c, self.b2)), self.epilogue,
            self.prologue,
            self.scalar_types, *(_layout(r) for r in self.extras), target.current(),
        )  # fmt: skip
        return _LAUNCH_PLANS.get(key, lambda: self._plan_launches(a, b, c, config))

    def _plan_launches(self, a, b, c, config: TileConfig):
        mats = [
            as_matrix(a, self.batch, self.a_vector),
            as_matrix(b, self.batch, self.b_vector),
            self._c_matrix(c),
        ]
        b2 = self.b2
        dual = [(b2, as_matrix(b2, self.batch, self.b_vector))] if b2 is not None else []
        extra_mats = self._extra_matrices()
        geo = geometry(self.batch, mats + [m for _, m in dual] + extra_mats)
        # A or B transposed in memory (x.T, w.T of row-major arrays: a backward GEMM's) is read
        # in place by the tensor-core kernel as its (K, M) / (N, K) transpose
        # (TF32 only where every launch's rows are 16-byte aligned: its fallback, the exact SIMT
        # kernel, reads A and B as they are)
        transposed = (False, False)
        tf32 = config.dtype == "tf32"
        if (self.dtype.itemsize == 2 and config.dtype == "float16" or tf32) and not dual:
            swapped = [transpose(m) for m in mats[:2]]
            if inner_contiguous(mats[2]) and all(
                inner_contiguous(m) or inner_contiguous(t)
                for m, t in zip(mats[:2], swapped, strict=True)
            ):
                flips = tuple(not inner_contiguous(m) for m in mats[:2])
                pairs = zip(mats[:2], swapped, flips, strict=True)
                read = [t if flip else m for m, t, flip in pairs] + mats[2:]
                tiled = list(zip((a, b, c), read, geo.z_strides[:3], strict=True))
                if not tf32 or all(
                    self._aligned(tiled, count == 1, index) for index, _, count in geo.indices()
                ):
                    transposed, mats = flips, read
        z_extras = geo.z_strides[3 + len(dual) :]
        act = self.epilogue
        if act is None:
            act = epilogue.activation_function(self.activation)
        bias_type = array_type(  # without a bias, a 1-element float32 dummy
            np.dtype(np.float32) if self.bias is None else self.bias.dtype,
            1, "C" if self.bias is None or self.bias.contiguous else "A",
        )  # fmt: skip
        launches = []
        for index, z0, count in geo.indices():
            (ma, mb, mc), (za, zb, zc) = mats, geo.z_strides[:3]
            one = count == 1  # a single matrix: its batch stride is never used
            copy_a = copy_bytes(ma, 0 if one else za, first_address(a, ma, index), a.dtype)
            copy_b = min(
                copy_bytes(mx, 0 if one else zx, first_address(r, mx, index), r.dtype)
                for r, mx, zx in [(b, mb, zb), *((r, m, geo.z_strides[3]) for r, m in dual)]
            )
            vector_store = self.dtype == np.float32 and (mc.cols <= 1 or mc.col_stride == 4)
            tensor_rows = None
            tiled = [(a, ma, za), (b, mb, zb), (c, mc, zc)]
            tiled += [(r, m, geo.z_strides[3]) for r, m in dual]
            convert = a.dtype != self.dtype or b.dtype != self.dtype  # a prologue's cast
            if convert and all(inner_contiguous(x) for _, x, _ in tiled):
                tensor_rows = "contiguous"  # the synchronous staging converts
            elif all(inner_contiguous(x) for _, x, _ in tiled):
                tensor_rows = "aligned" if self._aligned(tiled, one, index) else "contiguous"
            types = (
                array_type(a.dtype, 3, layout(ma, count, za)),
                array_type(b.dtype, 3, layout(mb, count, zb)),
                bias_type,
                array_type(c.dtype, 3, layout(mc, count, zc)),
            )
            if self.epilogue is not None:
                parts = [
                    array_type(r.dtype, 3, layout(mx, count, geo.z_strides[3])) for r, mx in dual
                ] + [
                    array_type(r.dtype, 3, layout(mx, count, zx))
                    for r, mx, zx in zip(self.extras, extra_mats, z_extras, strict=True)
                ]
                types = (
                    *types,
                    f"Tuple(({''.join(t + ', ' for t in (*parts, *self.scalar_types))}))",
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
                bool(dual),
                self.prologue,
                convert,
                transposed,
            )
            launches.append((index, z0, count, choice))
        return geo, mats, launches

    def _aligned(self, tiled, one: bool, index) -> bool:
        """Whether every ``(array, matrix, batch stride)`` of ``tiled`` has 16-byte aligned rows
        of whole 16-byte chunks in launch ``index`` (``one``: a single matrix)."""
        chunk = 16 // self.dtype.itemsize  # elements per 16-byte cp.async
        return all(
            rows_aligned(x, 0 if one else zs, first_address(r, x, index)) and x.cols % chunk == 0
            for r, x, zs in tiled
        )

    # running ------------------------------------------------------------------------------
    def inputs(self) -> dict:
        named = {self.names[0]: self.a, self.names[1]: self.b}
        if self.bias is not None:
            named[self.names[2] if len(self.names) > 2 else "bias"] = self.bias
        return named

    def launches(self, records, result) -> list:
        """The launches on device records ``a``, ``b`` (, ``bias``) and the result; the first
        launch of a shape bucket tunes first (times, on a GPU)."""
        if self.empty:
            return []
        a, b = records[:2]
        if self.config is None:
            self.tuner.choose(*self._as_operands(a, b))
        geo, mats, planned = self.plan_launches(a, b, result)
        kind = view_dtype(self.dtype)
        bias = View(2, dtype=kind) if self.bias is not None else Unused(np.dtype(np.float32))
        arrays_of = (0, 1, len(records))  # A, B and C among the call's arrays
        b2_at = 2 + (self.bias is not None)  # then B2 (dual), then the extras
        first_extra = b2_at + (self.b2 is not None)
        extra_mats = self._extra_matrices()
        mb2 = as_matrix(self.b2, self.batch, self.b_vector) if self.b2 is not None else None
        z_extras = geo.z_strides[3 + (mb2 is not None) :]
        out = []
        # A and B as their arrays are (a prologue's may have another dtype); C: a generated
        # epilogue's first result
        kinds = (view_dtype(self.a.dtype), view_dtype(self.b.dtype), view_dtype(result.dtype))
        for index, _z0, count, choice in planned:
            va, vb, vc = (
                matrix_view(i, m, index, count, z, k)
                for i, m, z, k in zip(arrays_of, mats, geo.z_strides[:3], kinds, strict=True)
            )
            grid = choice.grid(self.m, self.n, count)
            params = (va, vb, bias, vc)
            if self.epilogue is not None:
                views = tuple(
                    matrix_view(first_extra + j, mx, index, count, zx, view_dtype(r.dtype))
                    for j, (r, mx, zx) in enumerate(
                        zip(self.extras, extra_mats, z_extras, strict=True)
                    )
                )
                if mb2 is not None:
                    views = (matrix_view(b2_at, mb2, index, count, geo.z_strides[3], kind), *views)
                params = (*params, Extras((*views, *self.scalars)))
            out.append(
                KernelLaunch(
                    choice.kernel, grid, choice.threads, params, choice.signature, choice.shared
                )
            )
        return out

    # reports --------------------------------------------------------------------------------
    def predicted_bytes(self, cfg: TileConfig, bias_reads: int | None = None) -> int:
        """Global bytes of the kernel(s) launched with ``cfg``: A once per column of C tiles,
        B once per row of them, C written once; the bias once per row of C tiles (SIMT: staged
        per block), or once per warp row (tensor cores: read in the epilogue by one lane group
        and shuffled to the other 7)."""
        z = math.prod(self.batch)
        m, n, k = self.m, self.n, self.k
        rows = -(-m // cfg.tile_m)
        if not (m and n):
            return 0
        nbytes = traffic_bytes(m, n, k, z, cfg, self.dtype.itemsize)
        cols = -(-n // cfg.tile_n)  # a prologue's array read at its own width
        nbytes -= z * (self.dtype.itemsize - self.a.dtype.itemsize) * m * k * cols
        nbytes -= z * (self.dtype.itemsize - self.b.dtype.itemsize) * k * n * rows
        if self.b2 is not None:  # B2 read as B is, once per row of C tiles
            nbytes += z * rows * k * n * self.dtype.itemsize
        if self.bias is not None:
            reads = 1
            if bias_reads is not None:  # as the chosen kernel reads it
                reads = bias_reads
            elif cfg.dtype != "float32":  # the tensor-core kernels' epilogue
                c = cfg
                reads = tc.TensorCoreConfig(c.tile_m, c.tile_n, c.tile_k, c.num_warps).warps_m
            nbytes += z * rows * n * self.bias.dtype.itemsize * reads
        return nbytes

    def product_flops(self) -> int:
        """2 per multiply-add: 2 M N K per batch, twice with a second product."""
        return 2 * (1 + (self.b2 is not None)) * math.prod(self.batch) * self.m * self.n * self.k

    def flops(self) -> int:
        """The product's, then 1 per output element for the bias and 1 for the activation (a
        transcendental counts as one)."""
        epilogue = (self.bias is not None) + (self.activation is not None)
        return self.product_flops() + epilogue * math.prod(self.batch) * self.m * self.n

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
        generated = f"generated {self.epilogue.name}" if self.epilogue is not None else ""
        what = f"({self.m} x {self.k}) @ ({self.k} x {self.n})"
        if self.b2 is not None:
            what += " and a second product of the same A tiles"
        steps = (" ".join(x for x in epi if x), generated)  # a composer's epilogue comes last
        epi_text = " then ".join(s for s in steps if s) or "none"
        if any(choice.wgmma for *_, choice in launches):
            cfg = f"{cfg} on warpgroup MMA (wgmma, sm_90a)" + (
                ", warp-specialised (a producer warpgroup)"
                if cfg.num_warps == WARP_SPECIALISED
                else ""
            )
        return [
            f"{name}: {self.name} {what} over batch "
            f"{self.batch or '()'} in {len(launches)} launch(es); tile {cfg}; epilogue "
            f"{epi_text} in registers before the one store; {waves_text(e)}"
            for name in names
        ]

    def explain_parts(self, out=None):
        a, b = device_like(self.a), device_like(self.b)
        _, _, launches = self.plan_launches(a, b, self._c_record(out))
        reasons = sorted({r for *_, choice in launches for r in choice.reasons})
        return launches, reasons

    def report(self) -> Report:
        launches, reasons = self.explain_parts()
        chosen = [] if self.empty else distinct(
            KernelLaunch(c.kernel, None, c.threads, (), c.signature, c.shared)
            for *_, c in launches
        )  # fmt: skip
        # the config the kernel runs with (float16 on unaligned rows: TC_UNALIGNED)
        first = launches[0][3] if launches else None
        fused = self.predicted_bytes(
            first.config if first else self.tile_config(), first.bias_reads if first else None
        )
        stages = self.stage_text(launches) if chosen else []
        return Report(self.name, chosen, stages, fused, self.unfused_bytes(fused), reasons)
