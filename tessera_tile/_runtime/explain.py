"""What ``explain`` returns for a fused function or a prebuilt op (``tt.fusion.Explain``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Explain:
    """What a fused call does, from ``fn.explain(*args)``."""

    kernels: int
    ir: str
    source: str
    bytes_fused: int
    bytes_unfused: int
    reasons: list[str]  # why the plan is what it is: a split into kernels, a fallback
    stages: list[str]

    def __str__(self) -> str:
        ratio = self.bytes_unfused / self.bytes_fused if self.bytes_fused else float("nan")
        # a lone reduction split across blocks moves its partials too: more than the estimate
        # of one kernel per op, which counts none
        versus = f"{ratio:.2f}x less" if not ratio < 1 else f"{1 / ratio:.2f}x more"
        lines = [
            f"{self.kernels} kernel(s); predicted global traffic {self.bytes_fused} B fused vs "
            f"{self.bytes_unfused} B with one kernel per op ({versus})",
            *(f"  kernel {i}: {s}" for i, s in enumerate(self.stages)),
        ]
        if self.reasons:
            lines.append("why:")
            lines += [f"  - {r}" for r in self.reasons]
        lines += ["Tile IR:", *("  " + line for line in self.ir.splitlines())]
        return "\n".join(lines)
