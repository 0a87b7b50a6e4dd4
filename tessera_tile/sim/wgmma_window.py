"""The shared-memory window the tensor cores read through wgmma matrix descriptors: what
:mod:`.wgmma_twins` and the descriptor intrinsic's twin share. The descriptors themselves
(encode, decode, the addresses they name, swizzles) are the library's
(:mod:`tessera_tile._device.mma_layouts`)."""

from __future__ import annotations

import numpy as np

from .. import sim

# ============================================================================================
# Warpgroup MMA (wgmma, sm_90a): matrix descriptors, the shared-memory window, the twins
# ============================================================================================
#
# A warpgroup is 4 consecutive warps of a block whose first warp's index is a multiple of 4
# (threads 128 g .. 128 g + 127 of the linear thread rank). Every wgmma instruction is
# ``.sync.aligned`` over the warpgroup: each warp arrives as a warp collective of the simulator
# (its 32 lanes converged), and then waits until the other 3 warps of its warpgroup have executed
# the same instruction (same kind, same source line, same position in the warp's sequence of
# wgmma instructions). The warpgroup's state (fences, groups in flight, accumulators) lives
# beside the running block, keyed by it.


class SharedWindow:
    """The block's shared memory as one 18-bit address space, as a descriptor addresses it.

    Each shared array (static, per call site, and the dynamic one) gets a window address the
    first time a twin asks for one; it keeps its host address's position modulo 1024, so the
    alignment a kernel asked for (``alignment=`` of ``cuda.shared.array``) is the alignment the
    swizzle patterns see, and an alignment it did not ask for is a matter of chance, as on a
    GPU."""

    LIMIT = 1 << 18

    def __init__(self, block):
        self.block = block
        self.regions: dict[int, tuple[int, np.ndarray]] = {}  # host start -> (window, bytes)
        self.cursor = 0

    def _candidates(self):
        for region in (*self.block.shared.values(), self.block.dynshared):
            raw = np.asarray(region)
            if raw.nbytes:
                yield sim.address(raw), raw.reshape(-1).view(np.uint8)

    def address(self, host: int) -> int:
        """The window address of the shared byte at host address ``host``."""
        for lo, (start, data) in self.regions.items():  # the arrays already placed first
            if lo <= host < lo + data.size:
                return start + host - lo
        for lo, data in self._candidates():  # an array not placed yet: placed now
            if lo <= host < lo + data.size:
                start = -(-self.cursor // 1024) * 1024 + lo % 1024
                if start + data.size > self.LIMIT:
                    raise sim.SimulationError("wgmma: shared arrays pass the 256 KiB window")
                self.regions[lo] = (start, data)
                self.cursor = start + data.size
                return start + host - lo
        raise sim.SimulationError("wgmma: a matrix descriptor needs an address in shared memory")

    def read_u16(self, addresses: np.ndarray, what: str) -> np.ndarray:
        """The 16-bit words at ``addresses`` (window addresses, 2-byte aligned)."""
        flat = addresses.reshape(-1)
        out = np.empty(flat.size, np.uint16)
        found = np.zeros(flat.size, bool)
        for start, data in self.regions.values():
            inside = (flat >= start) & (flat + 2 <= start + data.size)
            if inside.any():
                off = flat[inside] - start
                out[inside] = data[off].astype(np.uint16) | (data[off + 1].astype(np.uint16) << 8)
                found |= inside
        if not found.all():
            bad = int(flat[~found][0])
            raise sim.SimulationError(
                f"wgmma: {what} reads shared address 0x{bad:05x}, outside every shared array "
                "of the block (a bad descriptor: start address, byte offsets or swizzle)"
            )
        return out.reshape(addresses.shape)
