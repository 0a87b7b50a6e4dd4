"""The roofline report of ``tessera-tile report``: every prebuilt op at a representative shape,
placed by the bytes its kernels move MEASURED in the simulator and the FLOPs counted from its
Tile IR.

The simulator must be on before numba is imported, so :func:`measure` runs ``python -m
tessera_tile._roofline`` in a child process with ``NUMBA_ENABLE_CUDASIM=1``; that child prints
one JSON row per op. Traffic per element barely depends on the shape for these ops (a norm's
weights are read once per block), so a small shape keeps the simulator quick and places each op
where it would sit at scale.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np

from . import profiling

SHAPE = (64, 512)  # rows x row length: one warp's row of 512 float32 fits on chip
DTYPE = "float32"


def stand_ins(name: str, shape: tuple, dtype: str) -> tuple[tuple, dict]:
    """Arguments that stand in for arrays when an op is explained, measured or tuned.

    Every op takes ``x = zeros(shape, dtype)``. layer_norm also gets ``weight = ones(n)`` and
    ``bias = zeros(n)``, rms_norm ``weight = ones(n)`` (``n = shape[-1]``); cross_entropy takes
    ``shape`` as the logits (N, C) and int64 targets of class 0 (every row counts). Other
    arguments keep the op's defaults (reductions over every axis, softmax over the last).
    """
    x = np.zeros(shape, dtype)
    n = shape[-1] if shape else 0
    if name == "layer_norm":
        return (x, np.ones(n, dtype), np.zeros(n, dtype)), {}
    if name == "rms_norm":
        return (x, np.ones(n, dtype)), {}
    if name == "cross_entropy":
        return (x, np.zeros(shape[:1], np.int64)), {}
    return (x,), {}


def hand_flops(name: str, shape: tuple) -> int:
    """FLOPs of the hand-written kernels, which have no Tile IR, counted from their source.

    cross_entropy: per logit, the online log-sum-exp's max, subtract, exp and add (4); per row,
    the log and the two subtractions of ``(m - x[target]) + log(s)`` (3). transpose moves data
    and counts none.
    """
    if name == "cross_entropy":
        rows, cols = shape
        return 4 * rows * cols + 3 * rows
    return 0


def _measure_here(shape: tuple, dtype: str) -> list[dict]:
    """In the simulator: each op's measured bytes and counted FLOPs."""
    from . import ops, sim

    rows = []
    for name in ops.__all__:
        op = getattr(ops, name)
        args, kwargs = stand_ins(name, shape, dtype)
        with sim.profile() as prof:
            op(*args, **kwargs)
        rows.append(
            {
                "op": name,
                "shape": list(shape),
                "dtype": dtype,
                "bytes": prof.bytes_read + prof.bytes_written,
                "flops": profiling.explain_flops(op, *args, **kwargs) or hand_flops(name, shape),
                "launches": prof.launches,
            }
        )
    return rows


def measure(shape: tuple = SHAPE, dtype: str = DTYPE) -> list[dict]:
    """Run :func:`_measure_here` in a simulator child process."""
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    spec = json.dumps({"shape": list(shape), "dtype": dtype})
    done = subprocess.run(
        [sys.executable, "-m", "tessera_tile._roofline", spec],
        env=env,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise RuntimeError(f"the simulator run failed:\n{done.stderr.strip()[-2000:]}")
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def plot(rows: list[dict], device: str, path: str) -> dict:
    """A log-log roofline (FLOP/byte against GFLOP/s) of A100, H100 and H200; the ops are
    placed on ``device``'s roof at their measured arithmetic intensity. Returns the axes'
    scales, limits and labels (the CLI's ``--json`` reports them)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 6), dpi=110)
    placed = [r for r in rows if r["flops"] > 0 and r["bytes"] > 0]
    ais = [r["flops"] / r["bytes"] for r in placed]
    lo = min([*ais, 0.05]) / 2
    hi = max(max(d.ridge() for d in profiling.DEVICES.values()) * 4, max(ais, default=1) * 2)
    xs = np.geomspace(lo, hi, 200)
    for key, spec in profiling.DEVICES.items():
        ys = np.minimum(spec.fp32, xs * spec.bandwidth) / 1e9
        ax.plot(
            xs,
            ys,
            lw=2.5 if key == device else 1.2,
            alpha=1.0 if key == device else 0.6,
            label=f"{spec.name}: {spec.bandwidth / 1e12:.2f} TB/s, {spec.fp32 / 1e12:.1f} "
            "TFLOP/s FP32",
        )
    spec = profiling.DEVICES[device]
    points: dict = {}  # ops at the same intensity share one point and one label
    for r, ai in zip(placed, ais, strict=True):
        points.setdefault(round(ai, 3), []).append(r["op"])
    for k, (ai, names) in enumerate(sorted(points.items())):
        y = min(spec.fp32, ai * spec.bandwidth) / 1e9
        ax.scatter([ai], [y], zorder=3, color="black", s=18)
        label = f"{', '.join(names)} ({ai:.2f})"
        offset = (8, -12) if k % 2 == 0 else (-8, 8)
        ax.annotate(
            label, (ai, y), textcoords="offset points", xytext=offset, fontsize=7,
            ha="left" if k % 2 == 0 else "right",
        )  # fmt: skip
    unplaced = [r["op"] for r in rows if r not in placed]
    shape = "x".join(map(str, rows[0]["shape"])) if rows else "?"
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP / byte, bytes measured in the simulator)")
    ax.set_ylabel("attainable GFLOP/s")
    title = f"tessera_tile prebuilt ops on the {spec.name} roofline ({shape} {rows[0]['dtype']})"
    ax.set_title(title if rows else "no ops", fontsize=10)
    if unplaced:
        ax.text(
            0.01,
            0.01,
            f"not placed (0 counted FLOPs, data movement only): {', '.join(unplaced)}",
            transform=ax.transAxes,
            fontsize=7,
        )
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(path)
    axes = {
        "xscale": ax.get_xscale(),
        "yscale": ax.get_yscale(),
        "xlim": list(ax.get_xlim()),
        "ylim": list(ax.get_ylim()),
        "xlabel": ax.get_xlabel(),
        "ylabel": ax.get_ylabel(),
        "placed": sorted(r["op"] for r in placed),
    }
    plt.close(fig)
    return axes


if __name__ == "__main__":
    request = json.loads(sys.argv[1])
    for row in _measure_here(tuple(request["shape"]), request["dtype"]):
        print(json.dumps(row))
