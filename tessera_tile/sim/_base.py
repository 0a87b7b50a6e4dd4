"""What every part of the simulator shares: its error and call-site attribution (the twin
registry it reads is the library's, :mod:`tessera_tile._device.twins`). A leaf: it imports no
other module of :mod:`tessera_tile.sim`.
"""

from __future__ import annotations

import sys
from pathlib import Path

from .._device.twins import transparent_code

SIM_DIR = str(Path(__file__).resolve().parent)


class SimulationError(RuntimeError):
    """A kernel did something that has no defined meaning on a GPU (bad mask, deadlock...)."""


def user_site(depth: int = 2) -> tuple[str, int]:
    """(file, line) of the nearest frame outside the simulator and registered twins."""
    frame = sys._getframe(depth)
    while frame is not None and (
        frame.f_code.co_filename.startswith(SIM_DIR) or frame.f_code in transparent_code
    ):
        frame = frame.f_back
    if frame is None:
        return ("<unknown>", 0)
    return (frame.f_code.co_filename, frame.f_lineno)


def format_site(site: tuple[str, int]) -> str:
    """``file.py:line`` of a :func:`user_site` result."""
    return f"{Path(site[0]).name}:{site[1]}"
