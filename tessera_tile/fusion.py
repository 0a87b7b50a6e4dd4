"""``@tt.fuse``: trace -> Tile IR -> plan -> generated ``@cuda.jit`` kernels -> cache.

::

    @tt.fuse
    def softmax(x):
        m = tt.max(x, axis=-1, keepdims=True)
        e = tt.exp(x - m)
        return e / tt.sum(e, axis=-1, keepdims=True)

    y = softmax(x)               # one kernel: the row is read once when it fits on chip
    print(softmax.explain(x))    # what it did, without running

Inputs: NumPy arrays, numba device arrays, CuPy arrays and any ``__cuda_array_interface__``
object; Python scalars, NumPy scalars and 0-d arrays. Results follow the inputs: NumPy in, NumPy
out (copied to the device and back); CuPy in, CuPy out; other device arrays in, numba device
arrays out (nothing copied through the host). Under ``NUMBA_ENABLE_CUDASIM=1`` every path runs
in tessera_tile's simulator. Inputs are never modified.

NumPy's semantics: arguments bind to the function's parameters as in Python (keywords,
defaults, ``*args``, ``**kwargs``); a result that depends on no array is the NumPy scalar
NumPy gives, computed on the host; ``out=`` of another dtype receives the result cast under
``same_kind`` (TypeError otherwise); errors are NumPy's classes (``AxisError``, broadcast
``ValueError``, ``ValueError`` for an integer to a negative power known on the host).

Caching: the first call with a new *signature* (dtypes, ranks, which axes have length 1, scalar
kinds, layout class, target) traces and plans; kernels are generated once per stage fingerprint
and variant. A call that hits the cache does no tracing and no code generation.
``fn.cache_info()`` reports the hits and misses.

Both caches persist across processes (docs/tuning.md): a program is stored under a fingerprint
of the function's code and the plain values it reads (a function that cannot be fingerprinted
is not persisted), the signature and the versions; kernels under their stage and variant. A
second process's first call of a function already compiled then traces nothing and generates
no code.

The compiler steps live in ``tessera_tile._fusion`` (see docs/architecture.md).
"""

from __future__ import annotations

import builtins
import functools
import inspect

import numpy as np

from . import profiling
from . import tile_ir as ir
from ._fusion import lower, persist, runtime, schedule
from ._fusion import plan as planner
from ._fusion.compile import KernelCache
from ._fusion.eager import outside_traces
from ._fusion.plan import StageKind
from ._fusion.schedule import MATH_MODES
from ._fusion.trace import (
    Traced,
    TraceError,
    as_node,
    binary,
    cast_results,
    count,
    format_ir,
    reduce,
    ternary,
    trace,
    unary,
)
from ._fusion.trace import matmul as _matmul
from ._fusion.trace import swapaxes as _swapaxes
from ._fusion.trace import tri as _tri
from ._runtime import arrays, target
from ._runtime import cache as _cache
from ._runtime import config as _config
from ._runtime.explain import Explain
from ._runtime.memo import MAX_LAUNCH_PLANS, CountingCache
from .tile_ir import Op

__all__ = [
    "Explain", "FusedFunction", "TraceError", "Traced", "fuse", "kernel_cache",
    "abs", "all", "any", "argmax", "argmin", "astype", "ceil", "clip", "cos", "erf", "exp",
    "exp2", "expm1", "floor", "gelu", "isfinite", "isinf", "isnan", "log", "log1p", "log2",
    "logsumexp", "matmul", "max", "maximum", "mean", "min", "minimum", "prod", "relu", "rsqrt",
    "sigmoid", "silu", "sin", "sqrt", "square", "std", "sum", "swapaxes", "tanh", "var",
    "where",
]  # fmt: skip

kernel_cache = KernelCache()
_programs_disk = _cache.DiskCache("programs")


# Calls on Dask arrays go to tessera_tile.dask, a layer above this one: the package registers
# a loader of it (set_dask_loader).
_dask_loader = None


def set_dask_loader(loader) -> None:
    global _dask_loader
    _dask_loader = loader


def dask_module():
    """tessera_tile.dask, through the loader the package registers."""
    return _dask_loader()


def on_dask(args, kwargs) -> bool:
    """Whether a call holds a Dask array (fused functions and ops then run on tessera_tile.dask)."""
    return _dask_loader is not None and builtins.any(  # `any` is tt.any here
        type(a).__module__.startswith("dask.") for a in (*args, *kwargs.values())
    )


class FusedFunction:
    """A function of arrays compiled into as few kernels as the data allows."""

    def __init__(self, fn, math: str = "fast", precision: str | None = None):
        if math not in MATH_MODES:
            raise ValueError(f"math must be one of {MATH_MODES}, got {math!r}")
        if precision not in (None, "tf32"):
            raise ValueError(f"precision must be None or 'tf32', got {precision!r}")
        self._parameters = _parameters_of(fn)
        # a call of exactly this many positional arguments binds them as they are
        kinds = {p.kind for p in self._parameters.parameters.values()}
        plain = kinds <= {
            inspect.Parameter.POSITIONAL_ONLY,
            inspect.Parameter.POSITIONAL_OR_KEYWORD,
        }
        self._arity = len(self._parameters.parameters) if plain else -1
        self.fn = fn
        self.math = math
        self.precision = precision
        functools.update_wrapper(self, fn)
        self._programs = CountingCache()
        # (program, launch plan, runtime.KeptCall) by arrays.kept_call's key, for calls that need
        # nothing but a launch
        self._ready: dict = {}
        self.traced = 0  # signatures this process traced and planned
        self.loaded = 0  # programs read from the disk cache instead
        self._fingerprint: str | None | bool = False  # computed at the first miss

    def _program(self, call: runtime.Call) -> runtime.Program:
        program = self._programs.get(call.signature, lambda: self._make(call, call.signature))
        if program.trace.reads_shapes:  # numbers of this call's shapes are in the program
            shapes = tuple(a.shape for a in call.args if a.is_array)
            exact = (*call.signature, ("shapes", shapes))
            program = self._programs.get(exact, lambda: self._make(call, exact))
        return program

    def _make(self, call: runtime.Call, signature: tuple) -> runtime.Program:
        key = self._disk_key(signature)
        if key is not None:
            text = _programs_disk.get(key)
            if text is not None:
                try:
                    program = persist.load_program(text)
                except Exception:  # written by a build this one cannot read: trace again
                    _programs_disk.unreadable(key)
                    program = None
                if program is not None:
                    self.loaded += 1
                    return program
        traced = trace(self.fn, call.stand_ins(), call.keywords)
        if call.out is not None:
            dtypes = [o.dtype for o in call.out]
            cast_results(traced, dtypes, call.out_names, self.fn.__name__)
        program = runtime.Program(traced, planner.plan(traced))
        self.traced += 1
        if key is not None:
            try:
                text = persist.dump_program(program)
            except Exception:  # a program that does not pickle stays in memory only
                text = None
            if text is not None:
                _programs_disk.put(key, text)
        return program

    def _disk_key(self, signature: tuple) -> dict | None:
        """The persistent key of a program for ``signature``; None when ``fn`` cannot be
        fingerprinted."""
        if self._fingerprint is False:
            self._fingerprint = persist.fingerprint_function(self.fn)
        if self._fingerprint is None:
            return None
        return {
            "function": [self.fn.__module__, self.fn.__qualname__, self._fingerprint],
            "signature": signature,
            "math": self.math,
        }

    def _call(self, args: tuple, kwargs: dict, out=None) -> runtime.Call:
        """A call of ``fn``: the arguments bound to its parameters as Python binds them, so
        that ``f(x, 2.0)`` and ``f(x, scale=2.0)`` are one call (and one cache entry)."""
        if not kwargs and len(args) == self._arity:
            return runtime.Call(self.fn.__name__, args, out)
        try:
            bound = self._parameters.bind(*args, **kwargs)
        except TypeError as e:
            raise TypeError(f"{self.fn.__name__}(): {e}") from None
        values = bound.args + tuple(bound.kwargs.values())
        return runtime.Call(self.fn.__name__, values, out, tuple(bound.kwargs))

    def _bound(self, args, kwargs):
        """The stages of a call on ``args``, bound to what its arrays would be on the device."""
        call = self._call(args, kwargs)
        program = self._program(call)
        shapes = call.shapes(program)
        records = runtime.planned_records(program, call, shapes)
        stages = [
            runtime.bind(s, records, shapes, kernel_cache, self.math, self.precision)
            for s in program.plan.stages
        ]
        return call, program, shapes, stages

    def cache_info(self) -> dict:
        """Program-cache hits and misses of this function (``launch_plans``: launch plans made,
        one per layout of a signature's arrays, and their hits; ``traced``: signatures traced and
        planned here, ``programs_from_disk``: read from the persistent cache; ``persistent``:
        whether the function could be fingerprinted, None before its first call), and the
        shared kernel cache's (kernels generated here or rebuilt from disk)."""
        plans = [p.launch_plans for p in self._programs.values()]
        return {
            "hits": self._programs.hits,
            "misses": self._programs.misses,
            "launch_plans": builtins.sum(c.misses for c in plans),  # `sum` is tt.sum here
            "launch_plan_hits": builtins.sum(c.hits for c in plans),
            "traced": self.traced,
            "programs_from_disk": self.loaded,
            "persistent": bool(self._fingerprint) if self._fingerprint is not False else None,
            "kernel_hits": kernel_cache.hits,
            "kernel_misses": kernel_cache.misses,
            "kernels_generated": kernel_cache.generated,
            "kernels_from_disk": kernel_cache.loaded,
        }

    def explain(self, *args, arch: str | None = None, **kwargs) -> Explain:
        """The plan for these arguments: kernels, IR, generated source, predicted traffic.

        Nothing is allocated or launched; NumPy arrays may stand in for device arrays. ``arch``:
        plan for that architecture rather than where kernels run now (``"sm_90"``: Hopper's
        warpgroup-MMA kernels). On Dask arrays: :func:`tessera_tile.dask.explain`'s report.
        """
        with target.planning_for(arch):  # the stages' reports plan their kernels too
            if on_dask(args, kwargs):
                return dask_module().explain(self, *args, **kwargs)
            _, program, shapes, stages = self._bound(args, kwargs)
            return Explain(
                kernels=len(stages),
                ir=format_ir(program.trace.outputs, shapes),
                source="\n\n".join(b.generated.source for b in stages),
                bytes_fused=int(np.sum([b.predicted_bytes() for b in stages], dtype=np.int64)),
                bytes_unfused=schedule.unfused_bytes(program.trace, shapes),
                reasons=list(program.plan.reasons) + _row_reasons(stages),
                stages=[f"{b.generated.name}: {_describe(b)}" for b in stages],
            )

    def flops(self, *args, **kwargs) -> int:
        """Counted FLOPs of a call on ``args`` (see :mod:`tessera_tile.profiling`)."""
        call = self._call(args, kwargs)
        program = self._program(call)
        return profiling.trace_flops(program.trace.nodes, call.shapes(program))

    def inspect(self, *args, arch: str | None = None, **kwargs) -> list:
        """Compile offline (no GPU needed) the kernels :meth:`explain` plans for the same
        ``arch``: one :class:`tessera_tile.inspect.CompileReport` each, in launch order."""
        from . import inspect as offline

        with target.planning_for(arch):
            launches = self.kernel_signatures(*args, **kwargs)
            arch = target.current().name
        return [
            offline.compile(kernel, signature, arch=arch, block=block, dynamic_shared=shared)
            for kernel, signature, block, shared in launches
        ]

    def kernel_signatures(self, *args, **kwargs) -> list[tuple]:
        """``(kernel, argument types, threads per block, bytes of dynamic shared memory)`` of
        each launch a call on ``args`` makes, in launch order; nothing is launched or
        allocated."""
        from numba import typeof

        call = self._call(args, kwargs)
        program = self._program(call)
        plan = runtime.launch_plan(program, call, kernel_cache, self.math, self.precision)
        out = []
        for launch in plan.launches:
            if not isinstance(launch, runtime.StageLaunch):  # a GEMM or attention stage's
                out += launch.signatures()
                continue
            b = launch.bound
            params = [
                _stand_in(shape, strides, dtype) for shape, strides, dtype, *_ in b.layout.views
            ]
            params += [np.zeros(1, dtype) for _, dtype in launch.scratch]
            params += [call.args[v].value if is_arg else v for is_arg, v in launch.scalars]
            signature = tuple(typeof(p) for p in params)
            out.append((b.generated.kernel, signature, int(np.prod(b.threads)), 0))
        return out

    def __call__(self, *args, out=None, stream=None, **kwargs):
        """Run on ``args`` (and keyword arguments, bound by ``fn``'s signature). ``out``: an
        array (a tuple of arrays for several results) to write into, each result cast to its
        dtype under NumPy's ``same_kind`` rule; ``stream``: a numba stream, a CuPy stream or
        a raw handle (see the module docstring for the default)."""
        kept = arrays.kept_call(args) if out is None and not kwargs else None
        quick = None if kept is None else kept[0]
        if quick is not None:
            ready = self._ready.get(quick)
            if ready is not None:  # a signature and layout seen before: no checks to repeat
                self._programs.hits += 1
                ready[0].launch_plans.hits += 1
                return runtime.run_ready(*ready, kept[1], stream)
        if on_dask(args, kwargs):  # a lazy Dask array, chunk by chunk (tessera_tile.dask)
            if out is not None or stream is not None:
                raise TypeError("out= and stream= are not taken with Dask arrays")
            return dask_module().apply(self, *args, **kwargs)
        call = self._call(args, kwargs, out)
        program = self._program(call)
        if program.plan.stages and not _config.SIMULATED and not _config.gpu_present():
            raise RuntimeError(
                "no CUDA GPU found: set NUMBA_ENABLE_CUDASIM=1 (before Python starts) to run "
                "fused functions in tessera_tile's simulator"
            )
        plan = runtime.launch_plan(program, call, kernel_cache, self.math, self.precision)
        if quick is not None and runtime.ready(program, call):
            if len(self._ready) >= MAX_LAUNCH_PLANS:
                self._ready.clear()
            self._ready[quick] = (program, plan, runtime.KeptCall.of(call))
        return runtime.execute(program, plan, call, stream)

    def ready(self, args: tuple) -> tuple | None:
        """``(program, launch plan, runtime.KeptCall)`` that a call on ``args`` (called before)
        runs straight from its arguments, or None (see ``runtime.ready``)."""
        kept = arrays.kept_call(args)
        return None if kept is None else self._ready.get(kept[0])


def fuse(fn=None, *, math: str = "fast", precision: str | None = None):
    """Decorator: compile ``fn``'s elementwise, reduction and matmul ops into fused kernels.

    ``math="fast"`` (the default) uses the approximations of the numerics policy in
    docs/fusion.md: ``ex2.approx`` for ``exp(x - max(x))`` and one ``rcp.approx`` per row
    for a division by a per-row value, each within the documented error. ``math="ieee"`` uses
    IEEE divisions and libdevice everywhere. Use as ``@tt.fuse``, ``@tt.fuse(math="ieee")`` or
    ``tt.fuse(fn, math="ieee")``.

    ``precision="tf32"`` runs float32 matmuls (``x @ w``, ``tt.matmul``) on the TF32 tensor
    cores, as ``ops.matmul(..., precision="tf32")`` does; by default they are exact float32.
    """
    if fn is None:
        return lambda f: fuse(f, math=math, precision=precision)
    return FusedFunction(fn, math, precision)


_CALL_KEYWORDS = ("out", "stream")  # taken by FusedFunction.__call__ itself


def _parameters_of(fn) -> inspect.Signature:
    """``fn``'s signature; TypeError for what cannot be fused: no Python function, or a
    parameter that a call's own keywords would hide."""
    if not callable(fn) or not hasattr(fn, "__code__"):
        what = type(fn).__name__
        if isinstance(fn, np.ufunc):
            what = f"the NumPy ufunc {fn.__name__} (fuse a function that calls it: "
            what += f"tt.fuse(lambda x: np.{fn.__name__}(x)))"
        raise TypeError(f"fuse expects a function (a def or a lambda), got {what}")
    parameters = inspect.signature(fn)
    for name in _CALL_KEYWORDS:
        if name in parameters.parameters:
            raise TypeError(
                f"{fn.__name__} has a parameter named {name!r}, which a fused call takes for "
                f"itself ({name}=...): rename it"
            )
    return parameters


def _stand_in(shape, strides, dtype):
    """An array of this geometry for typing only (its memory is never touched)."""
    return np.lib.stride_tricks.as_strided(np.zeros(1, dtype), shape, strides)


def _row_reasons(stages) -> list[str]:
    """How each row stage of several passes keeps its rows (:func:`.schedule.row_keeping`)
    and how each row stage reads its weights (:func:`.schedule.invariant_reading`)."""
    reasons = []
    for i, b in enumerate(stages):
        if not b.stage.kind.hand_written:
            keeping = schedule.row_keeping(b.stage, b.variant, b.layout.n_red)
            reading = schedule.invariant_reading(b.variant, b.layout.n_kept, b.blocks)
            reasons += [f"kernel {i}: {why}" for why in (keeping, reading) if why]
    return reasons


def _describe(b: runtime.Bound) -> str:
    if b.stage.kind.hand_written:
        return b.describe()
    variant, layout, stage = b.variant, b.layout, b.stage
    what = {
        StageKind.ELEMENTWISE: "elementwise, grid-stride",
        StageKind.ROW: f"rows reduced by a {variant.mode}"
        + (", row kept on chip between passes" if variant.cache else "")
        + (", row kept on chip in registers, unrolled" if variant.chunks else ""),
        StageKind.COLUMN: "coalesced column reduction",
        StageKind.FULL: "full reduction, two-stage in one launch",
    }[stage.kind]
    passes = len(b.generated.schedule.passes) if stage.kind is not StageKind.ELEMENTWISE else 1
    threads = int(np.prod(b.threads))
    return (
        f"{what}; {layout.n_kept} x {layout.n_red} index space, {passes} pass(es), "
        f"{len(stage.outputs)} output(s); {b.blocks} block(s) of {threads} threads"
    )


# --------------------------------------------------------------------------------------------
# elementwise functions (Python scalars, NumPy scalars and 0-d arrays welcome, as in NumPy) --


def _unary_fn(op: Op, name: str):
    def fn(x):
        return unary(op, x)

    fn.__name__ = name
    fn.__doc__ = f"Elementwise {name} (NumPy semantics; float16 computes in float32)."
    return fn


exp = _unary_fn(Op.EXP, "exp")
exp2 = _unary_fn(Op.EXP2, "exp2")
log = _unary_fn(Op.LOG, "log")
log2 = _unary_fn(Op.LOG2, "log2")
log1p = _unary_fn(Op.LOG1P, "log1p")
expm1 = _unary_fn(Op.EXPM1, "expm1")
sqrt = _unary_fn(Op.SQRT, "sqrt")
rsqrt = _unary_fn(Op.RSQRT, "rsqrt")
sin = _unary_fn(Op.SIN, "sin")
cos = _unary_fn(Op.COS, "cos")
tanh = _unary_fn(Op.TANH, "tanh")
erf = _unary_fn(Op.ERF, "erf")
sigmoid = _unary_fn(Op.SIGMOID, "sigmoid")
floor = _unary_fn(Op.FLOOR, "floor")
ceil = _unary_fn(Op.CEIL, "ceil")
square = _unary_fn(Op.SQUARE, "square")
relu = _unary_fn(Op.RELU, "relu")
silu = _unary_fn(Op.SILU, "silu")
isnan = _unary_fn(Op.ISNAN, "isnan")
isinf = _unary_fn(Op.ISINF, "isinf")
isfinite = _unary_fn(Op.ISFINITE, "isfinite")


def abs(x):  # noqa: A001 - the NumPy name
    """Elementwise absolute value."""
    return unary(Op.ABS, x)


def gelu(x, approximate: str = "none"):
    """GELU: ``x * Phi(x)`` with the exact erf form, or ``approximate="tanh"``."""
    if approximate not in ("none", "tanh"):
        raise ValueError(f"approximate must be 'none' or 'tanh', got {approximate!r}")
    return unary(Op.GELU if approximate == "none" else Op.GELU_TANH, x)


def maximum(a, b):
    """Elementwise maximum; NaN propagates as in NumPy."""
    return binary(Op.MAXIMUM, a, b)


def minimum(a, b):
    """Elementwise minimum; NaN propagates as in NumPy."""
    return binary(Op.MINIMUM, a, b)


def where(cond, a, b):
    """``a`` where ``cond`` else ``b``, broadcast together."""
    if as_node(cond).dtype != np.dtype(bool):
        cond = binary(Op.NE, cond, 0)
    return ternary(Op.WHERE, cond, a, b)


def matmul(a, b):
    """``a @ b`` with NumPy's ``matmul`` semantics (1-D operands, batch broadcasting); float16,
    bfloat16 and float32 operands (another dtype's operand is cast to the result's, as NumPy
    computes it). The elementwise ops over the product run in the GEMM kernel's epilogue."""
    return _matmul(a, b)


def swapaxes(x, axis1, axis2):
    """``numpy.swapaxes``: a view of an argument of the fused function, for a matmul operand
    (``q @ tt.swapaxes(k, -1, -2)``: read in place, through its strides) or the attention
    pattern (docs/fusion.md)."""
    return _swapaxes(x, axis1, axis2)


def tri(N, M=None, k=0, dtype=float):  # noqa: N803 - NumPy's parameter names
    """``numpy.tri``: an ``(N, M)`` array, one (True) where ``column <= row + k``, else zero;
    ``dtype`` float64 by default, as NumPy's. Inside a fused function it is computed from its
    indices by a kernel of its own; as the mask of the causal attention pattern,
    ``tt.where(tt.tri(Sq, Sk, Sk - Sq, bool), q @ tt.swapaxes(k, -1, -2) * c, -np.inf)``, it
    is the flash kernel's causal mask and is never written (docs/fusion.md)."""
    return _tri(N, M, k, dtype)


def clip(x, lo, hi):
    """``minimum(maximum(x, lo), hi)``, as ``numpy.clip``."""
    return minimum(maximum(x, lo), hi)


def astype(x, dtype):
    """Convert to ``dtype`` (one of bool, int32, int64, float16, float32, float64)."""
    dtype = np.dtype(dtype)
    if dtype not in ir.SUPPORTED_DTYPES:
        raise TypeError(f"astype: unsupported dtype {dtype}")
    if dtype == as_node(x).dtype:
        return x
    return unary(Op.CAST, x, arg=ir.dtype_arg(dtype))


# reductions ---------------------------------------------------------------------------------


def _reduction_fn(op: Op, doc: str):
    def fn(x, axis=None, keepdims: bool = False):
        return reduce(op, x, axis, keepdims)

    fn.__name__ = fn.__qualname__ = op.name.lower()
    fn.__doc__ = doc
    return fn


sum = _reduction_fn(Op.SUM, "Sum over ``axis`` (None, an int or a tuple), NumPy's dtype rules.")
prod = _reduction_fn(Op.PROD, "Product over ``axis``.")
max = _reduction_fn(
    Op.MAX, "Maximum over ``axis``; NaN propagates; an empty axis raises ValueError as in NumPy."
)
min = _reduction_fn(Op.MIN, "Minimum over ``axis``.")
argmax = _reduction_fn(
    Op.ARGMAX, "Index of the maximum over one axis or the flattened array; first NaN wins."
)
argmin = _reduction_fn(
    Op.ARGMIN, "Index of the minimum over one axis or the flattened array; first NaN wins."
)
any = _reduction_fn(Op.ANY, "True where any element over ``axis`` is non-zero.")
all = _reduction_fn(Op.ALL, "True where all elements over ``axis`` are non-zero.")


def mean(x, axis=None, keepdims: bool = False):
    """Arithmetic mean over ``axis`` (``sum / count``), NumPy's dtypes."""
    total = sum(x, axis, keepdims)
    return total / count(x, axis)


def var(x, axis=None, keepdims: bool = False, ddof: int = 0):
    """Variance over ``axis``: ``mean(|x - mean(x)|**2)``, two passes as NumPy does."""
    centred = x - mean(x, axis, keepdims=True)
    squares = sum(centred * centred, axis, keepdims)
    n = count(x, axis)
    # NumPy divides by max(n - ddof, 0): inf (or NaN for 0 / 0) where ddof >= n
    return squares / (maximum(n - ddof, 0) if ddof else n)


def std(x, axis=None, keepdims: bool = False, ddof: int = 0):
    """Standard deviation over ``axis``."""
    return sqrt(var(x, axis, keepdims, ddof))


def logsumexp(x, axis=None, keepdims: bool = False):
    """``log(sum(exp(x)))`` over ``axis``, computed stably around the maximum."""
    if not lower.is_float(as_node(x).dtype):
        x = astype(x, np.float64)
    m = max(x, axis, keepdims=True)
    shift = where(isfinite(m), m, 0)
    total = sum(exp(x - shift), axis, keepdims)
    if not keepdims:
        m = max(x, axis, keepdims=False)
        shift = where(isfinite(m), m, 0)
    return log(total) + shift


# Outside a fused function, each on arrays runs as a fused function of its own (one kernel).
for _name in ("abs", "all", "any", "argmax", "argmin", "astype", "ceil", "clip", "cos", "erf",
              "exp", "exp2", "expm1", "floor", "gelu", "isfinite", "isinf", "isnan", "log",
              "log1p", "log2", "logsumexp", "matmul", "max", "maximum", "mean", "min", "minimum",
              "prod", "relu", "rsqrt", "sigmoid", "silu", "sin", "sqrt", "square", "std", "sum",
              "swapaxes", "tanh", "var", "where"):  # fmt: skip
    globals()[_name] = outside_traces(globals()[_name], fuse)
