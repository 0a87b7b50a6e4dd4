import os

import pytest

if os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0"):
    pytest.exit("the compile tier must run without NUMBA_ENABLE_CUDASIM", returncode=2)

_resources: list[str] = []

# Tests that compile one family of kernels run on one xdist worker (``--dist loadgroup``), so
# the kernels and the device functions they share are compiled once, not once per worker.
_FAMILIES = {
    "test_mma_sass": "mma", "test_matmul": "mma", "test_mma_test_kernels": "mma",
    "tessera_tile.kernels.matmul_tc": "mma", "tessera_tile.kernels.matmul_tf32": "mma",
    "test_matmul_wgmma_sass": "wgmma", "test_wgmma_sass": "wgmma",
    "test_attention_sass": "attention", "tessera_tile.kernels.attention": "attention",
    "tessera_tile.kernels.attention_simt": "attention_simt",
    "test_attention_wgmma_sass": "attention_wgmma",
    "test_fusion_matmul_sass": "fusion_gemm",
    "test_fusion_sass": "fusion", "test_column_reduction_sass": "fusion",
    "tessera_tile.kernels.matmul": "simt", "examples/matmul": "simt",
}  # fmt: skip


def pytest_collection_modifyitems(items):
    for item in items:
        case = getattr(item, "callspec", None) and item.callspec.params.get("case")
        key = case.source if case is not None else item.module.__name__.rsplit(".", 1)[-1]
        family = _FAMILIES.get(key)
        if family:
            item.add_marker(pytest.mark.xdist_group(family))


def pytest_runtest_logreport(report):
    """Collect the one-line resource reports tests record (works across xdist workers)."""
    if report.when == "call":
        _resources.extend(value for key, value in report.user_properties if key == "resources")


def pytest_terminal_summary(terminalreporter):
    if _resources:
        terminalreporter.section("kernel resources (ptxas, nvdisasm)")
        for line in sorted(_resources):
            terminalreporter.write_line(line)
