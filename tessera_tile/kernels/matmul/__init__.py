"""The matmul family: its kernels and its plan, beside each other.

Kernels: float32 SIMT (``simt``), float16/bfloat16 tensor cores with ``mma.sync`` (``tc``, its
tile arithmetic ``tc_plan`` and its stores ``tc_epilogue``), TF32 (``tf32``), Hopper's warpgroup
MMA (``wgmma``), and the generated prologues that feed them (``prologue``). Plan: validation and
the tuned calls (``calls``), the call's launches (``plan``), the kernel choice (``choice``) and
the batch geometry (``geometry``), which the ops and the composer's GEMM stages share.

The SIMT kernel's public names are here as before; its named configurations (for the compile
tier and the guides) are built on first use.
"""

from . import simt as _simt
from .simt import KV, activation_name, simt_matmul

__all__ = ["KV", "activation_name", "simt_matmul"]


def __getattr__(name: str):
    return _simt.NAMED.module_getattr(name)
