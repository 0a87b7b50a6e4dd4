import os

import pytest

if os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0"):
    pytest.exit("the compile tier must run without NUMBA_ENABLE_CUDASIM", returncode=2)
