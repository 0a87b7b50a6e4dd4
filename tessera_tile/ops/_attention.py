"""``attention`` as a prebuilt op: its plan is :mod:`tessera_tile.kernels.attention.plan`."""

from ..kernels.attention import plan as attention_plan
from ._contract import PrebuiltOp

attention = PrebuiltOp(attention_plan.attention)
