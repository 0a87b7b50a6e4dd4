"""What one call costs on the host: tessera_tile's own Python, and numba-cuda's launch under it.
Prints tables; asserts nothing.

    python benchmarks/overhead.py stubbed  # simulator: our host time per call, launches skipped
    python benchmarks/overhead.py launcher # no GPU: the GPU launch path, the driver stubbed
    python benchmarks/overhead.py typing   # no GPU: numba-cuda's typing of launch arguments
    python benchmarks/overhead.py gpu      # a GPU: first call, then whole warm calls, vs CuPy
    python benchmarks/overhead.py          # all three

``stubbed`` times calls in the simulator with every kernel launch (configuration included)
skipped (``tessera_tile.sim.launches_skipped``): what is left is tessera_tile's own Python. The
first call (cold caches: it traces, plans and writes the kernels' source; in the simulator
nothing is compiled), then warm calls, against the targets of 10 µs for a one-kernel fused
function or row op and 15 µs for ``linear`` and ``attention``. Warm calls launch directly
(``_runtime/launch.py``): the figure includes packing each kernel's parameters, which on a GPU
replaces numba-cuda's dispatch (typing every argument, a device-array object per view), and
stops where the driver's launch call would be made.
``launcher`` runs the GPU path itself (no simulator) on a machine without one: the arrays are
numba ``DeviceNDArray`` objects over made-up device addresses, results are allocated the same way
(the bump of a counter, where a GPU's allocator costs more), a first call's launch through
numba-cuda's dispatcher (which compiles and loads) is skipped, and the driver's launch call
(``cuda.core``'s ``launch``, its ``LaunchConfig``, made once per configuration) is a no-op.
Everything else a warm call does on a GPU runs as it would: reading the arguments, the kept
call's look-up, the stream, allocating, packing each kernel's parameters. Targets: 5 µs for a
one-kernel fused function or row op, 8 µs for ``linear`` and ``attention``. Beside each, what
numba-cuda's dispatcher spends typing the same launch's arguments (every launch, before its own
packing and the driver call; the ``typing`` step's figure per argument), a lower bound of its
dispatch.
``gpu`` times small calls on device arrays, where the host, not the GPU, bounds a loop of
calls: the warm figure is the wall time of many calls (one synchronisation at the end) over
their number; on numba device arrays, then on the same memory as CuPy arrays. Beside it,
CuPy's chain of the same op, and numba-cuda's own launch of an empty kernel, through its
dispatcher and through the compiled kernel object.
"""

import importlib
import math
import os
import tempfile
import time
import types

import numpy as np
from _steps import run
from rich.console import Console
from rich.table import Table

CALLS = 300


def _per_call_us(fn, sync, calls: int = CALLS, batches: int = 5) -> float:
    """The best of ``batches`` timings of ``calls`` calls (a shared machine's other work only
    ever adds time), per call."""
    fn()
    sync()
    best = math.inf
    for _ in range(batches):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        sync()
        best = min(best, time.perf_counter() - start)
    return best / calls * 1e6


def _first_call_ms(fn, sync) -> float:
    start = time.perf_counter()
    fn()
    sync()
    return (time.perf_counter() - start) * 1e3


def _cases(cuda, rng):
    import tessera_tile as tt
    from tessera_tile import ops
    from tessera_tile.ops import _definitions as fused

    softmax = fused.softmax(-1)  # the @tt.fuse definition ops.softmax dispatches to

    @tt.fuse
    def centred_total(x):  # two kernels: the mean, then the sum that needs it
        return tt.sum(x - tt.mean(x))

    def dev(*shape):
        return cuda.to_device(rng.standard_normal(shape).astype(np.float32))

    x = dev(64, 512)
    w, b = dev(512), dev(512)
    xl, wl, bl = dev(64, 32), dev(32, 64), dev(64)
    q, k, v = dev(1, 64, 32), dev(1, 64, 32), dev(1, 64, 32)
    return [  # (name, fused function or op, its arguments, CuPy's chain of the same op)
        ("@tt.fuse softmax 64x512", softmax, (x,), "softmax"),
        ("@tt.fuse centred_total 64x512 (2 kernels)", centred_total, (x,), None),
        ("ops.softmax 64x512", ops.softmax, (x,), "softmax"),
        ("ops.layer_norm 64x512, weight, bias", ops.layer_norm, (x, w, b), "ln"),
        ("ops.linear 64x32x64, bias, gelu", ops.linear, (xl, wl, bl, "gelu"), None),
        ("ops.attention (1, 64, 32)", ops.attention, (q, k, v), None),
    ]


def _call(op, args):
    return lambda: op(*args)


TARGET_US = {"ops.linear": 15, "ops.attention": 15}


def stubbed() -> None:
    from numba import cuda

    from tessera_tile import sim

    # a cold first call: no program or kernel from an earlier run's disk cache
    os.environ["TESSERA_TILE_CACHE_DIR"] = tempfile.mkdtemp(prefix="tessera-overhead-")
    table = Table(title="tessera_tile's host time per call, launches skipped (simulator)")
    for column in ("call (float32 device arrays)", "first call ms", "warm µs/call", "target µs"):
        table.add_column(column, justify="left" if column.startswith("call") else "right")
    for name, op, args, _ in _cases(cuda, np.random.default_rng(0)):
        fn = _call(op, args)
        with sim.launches_skipped():
            first = _first_call_ms(fn, lambda: None)  # traces, plans, writes the source
            warm = _per_call_us(fn, lambda: None, calls=2000)
        target = next((t for key, t in TARGET_US.items() if name.startswith(key)), 10)
        target_text = str(target) if "2 kernels" not in name else "-"
        table.add_row(name, f"{first:.1f}", f"{warm:.1f}", target_text)
    Console(width=120).print(table)


LAUNCHER_TARGET_US = {"ops.linear": 8, "ops.attention": 8}


def launcher() -> None:
    import contextlib

    from numba import cuda
    from numba.core.typing.typeof import Purpose, typeof
    from numba.cuda.cudadrv import driver
    from numba.cuda.cudadrv.devicearray import DeviceNDArray

    from tessera_tile._runtime import arrays, compat, launch, target
    from tessera_tile._runtime import config as _config

    autotune = importlib.import_module("tessera_tile.autotune")  # (tt.autotune: the decorator)
    os.environ["TESSERA_TILE_CACHE_DIR"] = tempfile.mkdtemp(prefix="tessera-overhead-")
    next_address = [1 << 32]

    def fake(shape, dtype=np.float32, stream=0):
        dtype = np.dtype(dtype)
        shape = tuple(shape) if isinstance(shape, tuple | list) else (shape,)
        strides = arrays.contiguous_strides(shape, dtype.itemsize)
        nbytes = max(math.prod(shape) * dtype.itemsize, 1)
        address, next_address[0] = next_address[0], next_address[0] + -(-nbytes // 256) * 256
        memory = driver.MemoryPointer(None, driver.binding.CUdeviceptr(address), size=nbytes)
        return DeviceNDArray(shape, strides, dtype, gpu_data=memory)

    typed = []  # per direct launch found: its arguments, to type as numba-cuda's dispatcher does
    argument_types = compat.argument_types

    target.current()  # no GPU: plans for sm_90 (asked once, before the GPU is said present)
    default = driver.Stream(driver.binding.CUstream(0))
    unused = {}
    stubs = {
        (_config, "gpu_present"): lambda: True,
        (cuda, "default_stream"): lambda: default,
        (arrays, "empty"): lambda shape, dtype, family, stream: fake(shape, dtype),
        (arrays, "zeros"): lambda n, dtype, stream: fake(n, dtype),  # a memset: the driver's
        (arrays, "unused"): lambda dtype: unused.setdefault(np.dtype(dtype).str, fake(1, dtype)),
        (autotune, "_time_config"): lambda *args: (1.0, None),  # a first call's tuning
        (launch, "_launch"): lambda *args, **kwargs: None,
        (compat, "argument_types"): lambda params: typed.append(params) or argument_types(params),
        (compat, "direct_handle"): lambda kernel, argtypes: ("function", False),
        (compat, "_core_launch"): lambda: (lambda *args: None, lambda stream: stream),
    }
    with contextlib.ExitStack() as undo:
        for (owner, name), stub in stubs.items():
            undo.callback(setattr, owner, name, getattr(owner, name))
            setattr(owner, name, stub)
        made_up = types.SimpleNamespace(to_device=lambda host: fake(host.shape, host.dtype))
        cases = _cases(made_up, np.random.default_rng(0))
        table = Table(title="a warm call's host time on the GPU path, the driver's launch a no-op")
        for column in (
            "call (float32 device arrays)",
            "µs/call",
            "target µs",
            "numba-cuda typing µs",
        ):
            table.add_column(column, justify="left" if column.startswith("call") else "right")
        for name, op, args, _ in cases:
            fn = _call(op, args)
            del typed[:]
            fn()
            fn()  # the first runs find the compiled kernels; from here on, direct launches
            arguments = [p for params in typed for p in params if not isinstance(p, tuple)]
            per = _per_call_us(fn, lambda: None, calls=3000)
            typing_us = _per_call_us(
                lambda a=arguments: [typeof(p, Purpose.argument) for p in a], lambda: None, 3000
            )
            target_us = next((t for k, t in LAUNCHER_TARGET_US.items() if name.startswith(k)), 5)
            target_text = str(target_us) if "2 kernels" not in name else "-"
            table.add_row(name, f"{per:.1f}", target_text, f"{typing_us:.1f}")
        console = Console(width=120)
        console.print(table)
        result = _per_call_us(lambda: fake((64, 512)), lambda: None, calls=3000)
        console.print(
            f"of which making each result, a numba DeviceNDArray (64 x 512, no allocation): "
            f"{result:.1f} µs (a GPU's allocator comes on top; CuPy results come from its pool)"
        )


def gpu() -> None:
    from numba import cuda

    console = Console(width=120)
    if not cuda.is_available():
        console.print("gpu: skipped, no CUDA GPU on this machine (nothing was timed)")
        return
    try:
        import cupy
    except ImportError:
        cupy = None
    from tessera_tile.cli.bench_ref import REFERENCE

    rng = np.random.default_rng(0)
    sync = cuda.synchronize
    device = cuda.get_current_device().name
    device = device.decode() if isinstance(device, bytes) else device
    table = Table(title=f"{device}: host time per call")
    columns = ("call (float32)", "first call ms", "warm µs/call", "on CuPy arrays", "CuPy's chain")
    for column in columns:
        table.add_column(column, justify="left" if column.startswith("call") else "right")
    chains = {"softmax": REFERENCE["softmax"], "ln": REFERENCE["layer_norm"]}
    for name, op, args, chain in _cases(cuda, rng):
        fn = _call(op, args)
        first = _first_call_ms(fn, sync)
        warm = _per_call_us(fn, sync)
        ours = theirs = "-"
        if cupy is not None:  # the same memory as CuPy arrays (a kept call reads their interface)
            cargs = [cupy.asarray(a) if hasattr(a, "__cuda_array_interface__") else a for a in args]
            ours = f"{_per_call_us(_call(op, cargs), sync):.1f}"
            if chain:
                theirs = f"{_per_call_us(_call(chains[chain], (cupy, *cargs)), sync):.1f}"
        table.add_row(name, f"{first:.0f}", f"{warm:.1f}", ours, theirs)
    console.print(table)

    @cuda.jit
    def empty(a):
        pass

    a = cuda.device_array(32, np.float32)
    configured = empty[1, 32]  # the launch configuration, made once
    configured(a)
    kernel = next(iter(empty.overloads.values()))
    paths = {
        "empty[1, 32](a): configure, type, launch": lambda: empty[1, 32](a),
        "configured(a): type, launch": lambda: configured(a),
        "kernel.launch((a,), ...): launch only": lambda: kernel.launch(
            (a,), configured.griddim, configured.blockdim, configured.stream
        ),
    }
    if cupy is not None:
        c = cupy.zeros(32, np.float32)
        paths["configured(CuPy array): type, launch"] = lambda: configured(c)
        paths["CuPy: c += 1 (one elementwise kernel)"] = lambda: c.__iadd__(1)
    launches = Table(title="numba-cuda: one launch of an empty kernel, host time")
    launches.add_column("path")
    launches.add_column("µs/launch", justify="right")
    for name, fn in paths.items():
        launches.add_row(name, f"{_per_call_us(fn, sync):.1f}")
    console.print(launches)


def typing() -> None:
    """What numba-cuda's dispatcher does on the host for each argument of every launch: type
    it (``typeof(value, Purpose.argument)``, the C dispatcher's fallback for device arrays);
    and what a view the ops launch with costs to make. Measured on numba's own
    ``DeviceNDArray`` over fake device memory: no GPU, no simulator."""
    from numba.core.typing.typeof import Purpose, typeof
    from numba.cuda.cudadrv import driver
    from numba.cuda.cudadrv.devicearray import DeviceNDArray

    def fake(shape, strides, address):
        nbytes = driver.memory_size_from_info(shape, strides, 4)
        memory = driver.MemoryPointer(None, driver.binding.CUdeviceptr(address), size=nbytes)
        return DeviceNDArray(shape, strides, np.dtype(np.float32), gpu_data=memory)

    arrays = {
        "C-contiguous (64, 512)": fake((64, 512), (2048, 4), 1 << 20),
        "strided view (64, 256)": fake((64, 256), (2048, 8), 1 << 21),
        "3-D matmul view (1, 64, 32)": fake((1, 64, 32), (0, 128, 4), 1 << 22),
    }
    table = Table(title="numba-cuda: typing one launch argument on the host (no GPU)")
    table.add_column("argument (float32 DeviceNDArray)")
    table.add_column("µs per argument", justify="right")
    for name, a in arrays.items():
        per = _per_call_us(lambda a=a: typeof(a, Purpose.argument), lambda: None, calls=20000)
        table.add_row(name, f"{per:.2f}")
    Console(width=120).print(table)

    from tessera_tile._runtime import compat

    base = arrays["C-contiguous (64, 512)"]
    view = _per_call_us(lambda: compat.device_view(base, (1, 64, 32), (0, 128, 4), 256), str)
    print(f"a view the ops launch with, made from the pointer (a DeviceNDArray): {view:.2f} µs")


if __name__ == "__main__":
    steps = {"stubbed": stubbed, "launcher": launcher, "typing": typing, "gpu": gpu}
    run(__doc__, steps, simulated=frozenset({"stubbed"}))
