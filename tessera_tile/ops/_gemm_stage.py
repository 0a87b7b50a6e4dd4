"""The runner of the composer's GEMM stages (:mod:`tessera_tile._fusion.gemm`): a matmul inside
``@tt.fuse`` runs as the matmul ops' :class:`~._matmul_plan.Product`, the stage's generated
epilogue in place of an activation. Importing this module registers the runner.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from .. import profiling
from .._fusion import gemm
from .._fusion.lower import TYPE_NAMES
from ..kernels.epilogue import ElementEpilogue
from ._contract import Value, launch_all
from ._matmul import _product
from ._matmul_plan import Product


@dataclass(frozen=True)
class Generated:
    """What explain shows of a GEMM stage: its name and its epilogue's generated source."""

    name: str
    source: str


def _name(leaf) -> str:
    return f"argument {leaf.arg}" if isinstance(leaf.arg, int) else "an intermediate result"


@dataclass
class GemmBound:
    """A GEMM stage bound to a call's array layouts: its product, and where its arrays are."""

    stage: object
    product: Product
    keys: tuple  # record keys of a, b, the extras, then the result
    scalars: tuple  # call positions of the epilogue's scalar arguments
    generated: Generated

    @property
    def empty(self) -> bool:
        return self.product.empty

    def predicted_bytes(self) -> int:
        """The product's bytes (operands per tile, C once) and each array the epilogue reads,
        once per C element (every lane reads its own)."""
        p = self.product
        _, _, launches = p.plan_launches(p.a, p.b, p._c_record(None))
        config = launches[0][3].config if launches else p.tile_config()
        elements = math.prod(p.batch) * p.m * p.n
        return p.predicted_bytes(config) + sum(elements * r.dtype.itemsize for r in p.extras)

    def describe(self) -> str:
        p = self.product
        _, _, launches = p.plan_launches(p.a, p.b, p._c_record(None))
        ops = gemm.parts(self.stage).ops
        head = f"matmul + {ops}-op epilogue in one kernel" if ops else "matmul"
        if not launches:
            return f"{head}: nothing to compute"
        body = p.stage_text(launches)[0].split(": ", 1)[1]
        epi = "+ bias" if p.bias is not None else ""
        if p.epilogue is not None:
            epi = f"{epi} then generated {self.generated.name}".strip()
        return f"{head}: " + body.replace("epilogue + bias", "epilogue").replace(
            "epilogue none", "epilogue"
        ).replace("epilogue in registers", f"epilogue {epi or 'none'} in registers")

    def launch(self, records: dict) -> GemmLaunch:
        *inputs, result = (records[k] for k in self.keys)
        return GemmLaunch(self, tuple(self.product.launches(inputs, result)))


@dataclass(frozen=True)
class GemmLaunch:
    """A GEMM stage in a launch plan: the product's kernel launches, made once per layout."""

    bound: GemmBound
    launches: tuple

    def run(self, handles: dict, place) -> None:
        b = self.bound
        params = [handles[k] for k in b.keys] + [handles[pos] for pos in b.scalars]
        prof = profiling.active()
        if prof is None:
            launch_all(self.launches, params, place.stream)
            return
        p = b.product

        def run():
            launch_all(self.launches, params, place.stream)

        kernel = self.launches[0].kernel
        prof.launch(b.generated.name, b.predicted_bytes(), p.flops(), run, place.stream, kernel)

    def signatures(self) -> list[tuple]:
        return [(k.kernel, k.signature, k.threads, k.shared) for k in self.launches]


class Runner:
    """Binds GEMM stages (registered with :func:`tessera_tile._fusion.gemm.set_runner`)."""

    @staticmethod
    def bind(stage, records: dict, math_mode: str, precision: str | None) -> GemmBound:
        parts = gemm.parts(stage)
        ((_, dest),) = stage.outputs
        a, b = records[parts.a.arg], records[parts.b.arg]
        bias = records[parts.bias.arg] if parts.bias is not None else None
        product = _product(
            a, b, (_name(parts.a), _name(parts.b)), "matmul", None, bias, None,
            _name(parts.bias) if bias is not None else "bias", precision,
        )  # fmt: skip
        if any(r.value is None for r in (a, b)):  # host inputs' copies: nothing yet to time
            product = dataclasses.replace(product, config=product.tuner.expected(a, b))
        name, source = gemm.epilogue_source(stage, math_mode)
        if parts.result is not parts.x:
            fn = gemm.epilogue_function(stage.key, source, name)
            # a, b, the bias, the extras, the result, then the scalars
            first = len(parts.extras) + 3 + (bias is not None)
            product = dataclasses.replace(
                product,
                epilogue=ElementEpilogue(fn, name),
                extras=tuple(records[n.arg] for n in parts.extras),
                scalars=tuple(Value(first + j) for j in range(len(parts.scalars))),
                scalar_types=tuple(TYPE_NAMES[np.dtype(n.dtype)] for n in parts.scalars),
            )
        else:
            name, source = f"{product.name}_product", "# no epilogue: C = a @ b (+ bias)\n"
        operands = (parts.a, parts.b) if bias is None else (parts.a, parts.b, parts.bias)
        keys = (*(n.arg for n in operands), *(n.arg for n in parts.extras), dest)
        return GemmBound(
            stage, product, keys, tuple(n.arg for n in parts.scalars), Generated(name, source)
        )


gemm.set_runner(Runner())
