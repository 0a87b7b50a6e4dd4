"""The attention family: its kernels and its plan, beside each other.

Kernels: float16/bfloat16 flash attention on the tensor cores with ``mma.sync`` (``tc``),
float32 SIMT (``simt``) and Hopper's warpgroup MMA with a producer warpgroup (``wgmma``). Plan:
validation, kernel choice and launches (``plan``), which the op and the composer's attention
stages share.

The tensor-core kernel's public names are here as before; its named configurations (for the
compile tier and the guides) are built on first use.
"""

from . import tc as _tc
from .tc import *  # noqa: F403 - the tensor-core kernel's public names, as before

__all__ = _tc.__all__


def __getattr__(name: str):
    return _tc.NAMED.module_getattr(name)
