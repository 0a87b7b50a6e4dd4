"""Hand-written kernels, built from the tile primitives alone: one module per small family
(``cross_entropy``, ``transpose``, ``layer_norm_long``) and one package per large one, its
kernels beside its plan (``matmul/``: SIMT, tensor-core, TF32 and wgmma kernels, their
prologues, and the validation, tuners, kernel choice and launches the ops and the composer's
GEMM stages share; ``attention/``: tensor-core, SIMT and wgmma kernels and their plan). The
tensor-core tile helpers both families use are ``tc_tiles`` and ``wgmma_tiles``, the generated
epilogues ``epilogue``; the hand-written call every plan builds on is ``_calls``.

Where the composer already makes the best kernel, an op is a fused definition instead
(:mod:`tessera_tile.ops._definitions`); :mod:`tessera_tile.ops` validates arguments, allocates
results and dispatches to one or the other.
"""

# The family modules' former names (``kernels.matmul_tc`` is ``kernels.matmul.tc`` since the
# families became packages): ``from tessera_tile.kernels import matmul_tc`` still works.
_FORMER = {
    "matmul_calls": "matmul.calls", "matmul_choice": "matmul.choice",
    "matmul_geometry": "matmul.geometry", "matmul_plan": "matmul.plan", "matmul_tc": "matmul.tc",
    "matmul_tc_plan": "matmul.tc_plan", "matmul_tf32": "matmul.tf32",
    "matmul_wgmma": "matmul.wgmma", "prologue": "matmul.prologue",
    "tc_epilogue": "matmul.tc_epilogue", "attention_plan": "attention.plan",
    "attention_simt": "attention.simt", "attention_wgmma": "attention.wgmma",
}  # fmt: skip


def __getattr__(name: str):
    if name not in _FORMER:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    family, _, module = _FORMER[name].partition(".")
    if family == "matmul":  # every module of the family, so that each is an attribute
        from . import matmul as package
        from .matmul import (  # noqa: F401
            calls,
            choice,
            geometry,
            plan,
            prologue,
            tc,
            tc_epilogue,
            tc_plan,
            tf32,
            wgmma,
        )
    else:
        from . import attention as package
        from .attention import plan, simt, wgmma  # noqa: F401
    return getattr(package, module)
