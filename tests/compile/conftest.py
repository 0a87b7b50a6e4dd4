import os

import pytest

if os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0"):
    pytest.exit("the compile tier must run without NUMBA_ENABLE_CUDASIM", returncode=2)

_resources: list[str] = []


def pytest_runtest_logreport(report):
    """Collect the one-line resource reports tests record (works across xdist workers)."""
    if report.when == "call":
        _resources.extend(value for key, value in report.user_properties if key == "resources")


def pytest_terminal_summary(terminalreporter):
    if _resources:
        terminalreporter.section("kernel resources (ptxas, nvdisasm)")
        for line in sorted(_resources):
            terminalreporter.write_line(line)
