"""Compile tier: the kernels the mma tests define, built by the real compiler.

The GPU tier runs ``tests/primitives/test_mma*.py`` on a device, where their kernels meet Numba's
typing for the first time: the simulator runs them as Python, which accepts what Numba refuses
(``(uint32(0),) * 4``, tuple repetition, is typed ``mul(UniTuple(uint32 x 1), int64)``, which
has no implementation). Here every ``@cuda.jit`` kernel of those modules is compiled with the
argument types its tests launch it with, so such a kernel fails without a GPU.
"""

import importlib.util
from pathlib import Path

import pytest
from numba.cuda.dispatcher import CUDADispatcher

from tessera_tile import inspect

PRIMITIVES = Path(__file__).resolve().parents[1] / "primitives"
F32 = "float32[::1]"
F32_2D = "float32[:, ::1]"
U32_2D = "uint32[:, ::1]"
# module -> kernel -> signatures, as its tests launch it (C-contiguous NumPy arrays, ints)
SIGNATURES = {
    "test_mma": {
        "mma_from_registers": [f"void({U32_2D}, {U32_2D}, {F32_2D}, {F32_2D})"],
        "tile_mma": ["void(float16[:, ::1], float16[:, ::1], float32[:, ::1], float16[:, ::1])"],
        "mma_bf16_from_registers": [f"void({U32_2D}, {U32_2D}, {F32_2D}, {F32_2D})"],
        "tile_mma_bf16": ["void(uint16[:, ::1], uint16[:, ::1], float32[:, ::1], uint16[:, ::1])"],
        "masked_store": [f"void({F32_2D}, float16[:, ::1], int64, int64)"],
        "divergent_mma": [f"void({F32})"],
        "branchy_mma": [f"void({F32})"],
        "early_exit_mma": [f"void({F32})"],
        "full_mma": [f"void({F32})"],
        "ldmatrix_at": ["void(uint32[::1], int64)"],
        "ldmatrix_global": ["void(float16[:, ::1], uint32[::1])"],
        "pair_store_wrong_space": ["void(float16[:, ::1])"],
    },
    "test_mma_tf32": {
        "mma_kernel": [  # A and B as bit patterns or as float32 values
            f"void({U32_2D}, {U32_2D}, {F32_2D}, {F32_2D})",
            f"void({F32_2D}, {F32_2D}, {F32_2D}, {F32_2D})",
        ],
        "round_kernel": [f"void({F32}, {F32})"],
        "round_nan": [f"void({F32})"],
        "tile_mma_tf32": [f"void({F32_2D}, {F32_2D}, {F32_2D}, {U32_2D})"],
        "trans_on_float32": ["void(uint32[::1])"],
        "pair_store": [f"void({F32_2D}, int64)"],
        "swapped_tile_mma_tf32": [f"void({F32_2D}, {F32_2D}, {F32_2D})"],
        "pair_load": [f"void(int64, {F32_2D})"],
        "scalar_load": [f"void(int64, {F32})"],
    },
}
# kernels whose test checks that the compiler refuses them (the simulator's twin must too)
REFUSED = {("test_mma_tf32", "trans_on_float32")}


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"compiled_{name}", PRIMITIVES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


MODULES = {name: _load(name) for name in SIGNATURES}
CASES = [
    (module, kernel, sig)
    for module, kernels in SIGNATURES.items()
    for kernel, sigs in kernels.items()
    for sig in sigs
]


@pytest.mark.parametrize("module", sorted(SIGNATURES))
def test_every_kernel_of_the_module_is_listed(module):
    found = {n for n, v in vars(MODULES[module]).items() if isinstance(v, CUDADispatcher)}
    assert found == set(SIGNATURES[module]), f"list each kernel of tests/primitives/{module}.py"


@pytest.mark.parametrize(("module", "kernel", "sig"), CASES, ids=lambda v: str(v))
def test_kernel_compiles(module, kernel, sig):
    fn = getattr(MODULES[module], kernel)
    if (module, kernel) in REFUSED:
        with pytest.raises(TypeError, match="does not type"):
            inspect.compile(fn, sig, arch="sm_80", block=32)
        return
    report = inspect.compile(fn, sig, arch="sm_80", block=32)
    assert report.spill_stores == report.spill_loads == 0


@pytest.mark.parametrize(
    ("fn", "count"), [(fn, n) for fn, n, _ in MODULES["test_mma"].LDMATRIX], ids=lambda v: str(v)
)
def test_ldmatrix_kernel_compiles(fn, count):
    kernel = MODULES["test_mma"]._ldmatrix_kernel(fn, count)
    report = inspect.compile(kernel, "void(float16[:, ::1], uint32[:, ::1])", "sm_80", block=32)
    assert report.spill_stores == report.spill_loads == 0
