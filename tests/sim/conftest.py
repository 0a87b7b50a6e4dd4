import pytest
from helpers import SIDES


@pytest.fixture(params=SIDES)
def side(request):
    """Where the caller's arrays live: fused functions must work on host and device arrays."""
    return request.param
