"""``attention`` as a prebuilt op: its plan is :mod:`tessera_tile.kernels.attention_plan`."""

from ..kernels import attention_plan
from ._contract import PrebuiltOp

attention = PrebuiltOp(attention_plan.attention)
