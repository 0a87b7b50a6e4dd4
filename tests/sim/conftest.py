from helpers import SIDES


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "device_only(reason): a heavy kernel case run on device arrays only; the op's host path "
        "(copies in and out around the same launches) is covered by its boundary tests",
    )


def pytest_generate_tests(metafunc):
    """``side``: where the caller's arrays live. Fused functions and ops must work on host and
    device arrays; a test marked ``device_only`` runs the device side alone."""
    if "side" not in metafunc.fixturenames or _parametrizes_side(metafunc):
        return
    device_only = metafunc.definition.get_closest_marker("device_only") is not None
    metafunc.parametrize("side", ["device"] if device_only else list(SIDES))


def _parametrizes_side(metafunc) -> bool:
    """Whether the test gives ``side`` itself (``@pytest.mark.parametrize("side", ...)``)."""
    for marker in metafunc.definition.iter_markers("parametrize"):
        names = marker.args[0]
        names = [n.strip() for n in names.split(",")] if isinstance(names, str) else names
        if "side" in names:
            return True
    return False
