"""The matmul family as prebuilt ops: their plans are :mod:`tessera_tile.kernels.matmul.calls`."""

from ..kernels.matmul import calls as matmul_calls
from ._contract import PrebuiltOp

matmul = PrebuiltOp(matmul_calls.matmul)
linear = PrebuiltOp(matmul_calls.linear)
mlp = PrebuiltOp(matmul_calls.mlp)
