"""A warm cache spares a new process NVVM: the generated kernel is compiled from a real file
with numba-cuda's disk cache on, and a second process loads it from there.

Without a GPU, numba-cuda's cache still needs a device to name the target: the scripts answer
its two device queries for sm_90 (the dispatcher's, as tessera_tile.inspect does, and the
code library's), and do in the first process what a first launch on a GPU does before it saves
the kernel (compile it for the signature), minus loading it on a device. NVVM's entry point is
counted in both. What only a GPU shows: that the launch path itself then skips NVVM and ptxas
(on a GPU the cache also holds the cubin, which the first launch links before saving)."""

import json
import os
import subprocess
import sys
import textwrap

from helpers import ROOT

SCRIPT = """
    import json, sys, time
    import numpy as np
    import numba.cuda.codegen as codegen
    import numba.cuda.cudadrv.nvvm as nvvm
    import numba.cuda.dispatcher as dispatcher
    import tessera_tile as tt
    from tessera_tile._runtime import compat

    nvvm_calls = []
    compile_ir = nvvm.compile_ir

    def counting(*args, **kwargs):
        nvvm_calls.append(1)
        return compile_ir(*args, **kwargs)

    codegen.nvvm.compile_ir = counting

    class Device:
        compute_capability = (9, 0)

    class Context:
        device = Device()

    codegen.devices.get_context = lambda *a, **k: Context()
    codegen.JITCUDACodegen.magic_tuple = lambda self: ("no GPU", (9, 0))

    @tt.fuse
    def scaled_softmax(x, w):
        e = tt.exp(x - tt.max(x, axis=-1, keepdims=True))
        return e / tt.sum(e, axis=-1, keepdims=True) * w + 0.5

    x, w = np.zeros((8, 96), np.float32), np.zeros(96, np.float32)
    ((kernel, signature, block, _shared),) = scaled_softmax.kernel_signatures(x, w)
    start = time.perf_counter()
    with compat.current_device_answered((9, 0)):
        if sys.argv[1] == "first":  # what a first launch does, short of the device
            compiled = dispatcher._Kernel(kernel.py_func, signature, **kernel.targetoptions)
            kernel._cache.save_overload(signature, compiled)
        elif sys.argv[1] == "load":  # numba-cuda's cache, else what a first launch does
            compiled = kernel._cache.load_overload(signature, kernel.targetctx)
            if compiled is None:
                compiled = dispatcher._Kernel(kernel.py_func, signature, **kernel.targetoptions)
                kernel._cache.save_overload(signature, compiled)
        else:  # what a launch does: the dispatcher's compile, which looks in its cache first
            compiled = kernel.compile(signature)
        ptx = compiled.library.get_asm_str()
    seconds = time.perf_counter() - start
    print(json.dumps({
        "seconds": seconds,
        "nvvm": len(nvvm_calls),
        "cache_hits": sum(kernel._cache_hits.values()),
        "ptx_has_entry": f".entry {compiled.entry_name}" in ptx,
        "ptx": ptx,
        "info": scaled_softmax.cache_info(),
    }))
    """


def run(tmp_path, which: str) -> dict:
    env = dict(os.environ, TESSERA_TILE_CACHE_DIR=str(tmp_path), NUMBA_ENABLE_CUDASIM="0")
    env["PYTHONWARNINGS"] = "always::UserWarning"  # every CacheWarning, to count them
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(SCRIPT), which],
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return result | {"cache_warnings": done.stderr.count("CacheWarning:")}


def test_a_second_process_loads_the_kernel_without_nvvm(tmp_path):
    first = run(tmp_path, "first")
    second = run(tmp_path, "second")
    assert first["nvvm"] == 1 and first["info"]["kernels_generated"] == 1
    assert first["ptx_has_entry"]
    assert second["nvvm"] == 0, "the warm cache still ran NVVM"
    assert second["cache_hits"] == 1
    assert second["ptx_has_entry"]
    assert second["info"]["traced"] == 0 and second["info"]["kernels_generated"] == 0
    assert second["info"]["kernels_from_disk"] == 1
    assert list(tmp_path.glob("kernels/src/__pycache__/*.nbi")), "numba-cuda's cache index"


def test_a_kernel_numba_cannot_cache_still_launches_with_a_warning():
    import pytest

    from tessera_tile._fusion.compile import guard_cache
    from tessera_tile._runtime import cache as _cache

    class Cache:
        def save_overload(self, sig, data):
            raise RuntimeError("Cannot pickle CUDACodeLibrary with linking files")

    class Kernel:
        __name__ = "fused_example"
        _cache = Cache()

    kernel = Kernel()
    guard_cache(kernel)
    with pytest.warns(_cache.CacheWarning, match="could not cache kernel fused_example"):
        kernel._cache.save_overload(("sig",), object())  # returns: the launch goes on


HALF, ONE_AND_A_HALF = "0f3F000000", "0f3FC00000"  # float32 0.5 and 1.5 as PTX writes them


def test_a_corrupt_kernel_entry_is_rebuilt_and_the_cached_kernel_kept(tmp_path):
    """A flipped constant in the stored source (valid JSON) was trusted: the kernel computed
    with 1.5 for 0.5 and NVVM ran again. Now the entry fails its checksum, warns once, and the
    source generated anew is the file numba-cuda cached: no NVVM, the right constant."""
    first = run(tmp_path, "first")
    assert HALF in first["ptx"] and ONE_AND_A_HALF not in first["ptx"]
    (path,) = tmp_path.glob("kernels/*.json")
    data = path.read_bytes()
    assert data.count(b"= 0.5\\n") == 1
    path.write_bytes(data.replace(b"= 0.5\\n", b"= 1.5\\n"))
    second = run(tmp_path, "second")
    assert second["cache_warnings"] == 1
    assert HALF in second["ptx"] and ONE_AND_A_HALF not in second["ptx"]
    assert second["nvvm"] == 0 and second["cache_hits"] == 1
    assert second["info"]["kernels_generated"] == 1 and second["info"]["kernels_from_disk"] == 0
    third = run(tmp_path, "second")  # rebuilt: read back without a warning
    assert third["cache_warnings"] == 0 and third["info"]["kernels_from_disk"] == 1


def test_a_corrupt_numba_cuda_cache_is_one_warning_and_cached_anew(tmp_path):
    """numba-cuda raised at every launch on a corrupt index of its cache (an unpickling error):
    now that is one warning and a miss; the kernel compiles again and the index is rewritten,
    so the next process loads it without NVVM."""
    run(tmp_path, "first")
    (index,) = tmp_path.glob("kernels/src/__pycache__/*.nbi")
    index.write_bytes(b"\xff not a pickle")
    loaded = run(tmp_path, "load")
    assert loaded["cache_warnings"] == 1 and loaded["nvvm"] == 1 and loaded["ptx_has_entry"]
    again = run(tmp_path, "second")
    assert again["cache_warnings"] == 0
    assert again["nvvm"] == 0 and again["cache_hits"] == 1 and again["ptx_has_entry"]
