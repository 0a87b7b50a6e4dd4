"""The roofline report of ``tessera-tile report``: every prebuilt op at a representative shape,
placed by the bytes its kernels move MEASURED in the simulator and the FLOPs counted from its
Tile IR.

The simulator must be on before numba is imported, so :func:`measure` runs ``python -m
tessera_tile.cli.roofline`` in a child process with ``NUMBA_ENABLE_CUDASIM=1``; that child prints
one JSON row per op. Traffic per element barely depends on the shape for the row ops and
reductions (a norm's weights are read once per block), so a small shape keeps the simulator
quick and places each where it would sit at scale; the matmul family is measured at one
128 x 128 x 128 float16 tile (see ``MATMUL_SHAPE``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np

from .. import profiling

SHAPE = (64, 512)  # rows x row length: one warp's row of 512 float32 fits on chip
DTYPE = "float32"
# The matmul family in the simulator: its tensor-core kernel (float16) at one 128 x 128 tile
# with K = N = H = 128 takes seconds; larger GEMMs take minutes. A GEMM's intensity grows with
# its size, so this point is a lower bound of where larger ones sit.
MATMUL_SHAPE = (128, 128)
MATMUL_DTYPE = "float16"
MATMUL_OPS = ("linear", "matmul", "mlp")
# Attention at one head of 128 queries and keys, D = 64 (float16: tensor cores): two K/V tiles
# per block of 64 query rows.
ATTENTION_SHAPE = (128, 64)
ATTENTION_DTYPE = "float16"


def stand_ins(name: str, shape: tuple, dtype: str, hidden: int | None = None) -> tuple:
    """``(args, kwargs)`` that stand in for arrays when an op is explained, measured or tuned.

    Every op takes ``x = zeros(shape, dtype)``. layer_norm also gets ``weight = ones(n)`` and
    ``bias = zeros(n)``, rms_norm ``weight = ones(n)`` (``n = shape[-1]``); cross_entropy takes
    ``shape`` as the logits (N, C) and int64 targets of class 0 (every row counts). The matmul
    family reads ``shape`` as (M, K) and multiplies by square weights: matmul ``b = zeros(K,
    K)``; linear ``w = zeros(K, K)``, ``bias = zeros(K)``; mlp ``w1 = zeros(K, H)``, ``b1 =
    zeros(H)``, ``w2 = zeros(H, K)``, ``b2 = zeros(K)`` with ``H = hidden``, default ``4 K`` (a
    transformer's MLP). attention reads ``shape`` as ``(..., S, D)`` and takes ``q = k = v =
    x``. Other arguments keep the op's defaults (reductions over every axis,
    softmax over the last, no activation for linear, gelu for mlp).
    """
    x = np.zeros(shape, dtype)
    n = shape[-1] if shape else 0
    h = 4 * n if hidden is None else hidden
    if name == "layer_norm":
        return (x, np.ones(n, dtype), np.zeros(n, dtype)), {}
    if name == "rms_norm":
        return (x, np.ones(n, dtype)), {}
    if name == "cross_entropy":
        return (x, np.zeros(shape[:1], np.int64)), {}
    if name == "matmul":
        return (x, np.zeros((n, n), dtype)), {}
    if name == "linear":
        return (x, np.zeros((n, n), dtype), np.zeros(n, dtype)), {}
    if name == "mlp":
        w1, w2 = np.zeros((n, h), dtype), np.zeros((h, n), dtype)
        return (x, w1, np.zeros(h, dtype), w2, np.zeros(n, dtype)), {}
    if name == "attention":
        return (x, x, x), {}
    return (x,), {}


def _measure_here(shape: tuple, dtype: str):
    """In the simulator: each op's measured bytes and counted FLOPs, one op at a time."""
    from .. import ops, sim

    for name in ops.__all__:
        op = getattr(ops, name)
        big = name in MATMUL_OPS
        at, dt = (MATMUL_SHAPE, MATMUL_DTYPE) if big else (shape, dtype)
        if name == "attention":
            at, dt = ATTENTION_SHAPE, ATTENTION_DTYPE
        hidden = at[-1] if big else None
        args, kwargs = stand_ins(name, at, dt, hidden)
        with sim.profile() as prof:
            op(*args, **kwargs)
        flops = profiling.explain_flops(op, *args, **kwargs)
        yield {
            "op": name,
            "shape": list(at),
            "dtype": dt,
            "bytes": prof.bytes_read + prof.bytes_written,
            "flops": flops,
            "launches": prof.launches,
        }


def measure(shape: tuple = SHAPE, dtype: str = DTYPE, progress=None) -> list[dict]:
    """Run :func:`_measure_here` in a simulator child process; ``progress(row)`` is called as
    each op's row arrives."""
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    spec = json.dumps({"shape": list(shape), "dtype": dtype})
    command = [sys.executable, "-m", "tessera_tile.cli.roofline", spec]
    rows = []
    with subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as child:
        for line in child.stdout:
            if line.startswith("{"):
                rows.append(json.loads(line))
                if progress is not None:
                    progress(rows[-1])
        errors = child.stderr.read()
    if child.returncode != 0:
        raise RuntimeError(f"the simulator run failed:\n{errors.strip()[-2000:]}")
    return rows


def _roof(spec: profiling.DeviceSpec, dtype: str) -> float:
    """The compute roof of an op's dtype: float16 runs on the tensor cores."""
    return spec.fp16_tensor if dtype == "float16" else spec.fp32


def _groups(placed: list[dict], first: dict) -> list[tuple[float, str, list]]:
    """Points within 15% of each other's intensity share one label: (intensity, label, rows)."""
    out: list = []
    for r in sorted(placed, key=lambda r: r["flops"] / r["bytes"]):
        ai = r["flops"] / r["bytes"]
        name = r["op"]
        if (r["shape"], r["dtype"]) != (first["shape"], first["dtype"]):
            name += f" [{'x'.join(map(str, r['shape']))} {r['dtype']}]"
        if out and ai <= out[-1][0] * 1.15:
            out[-1][2].append(r)
            out[-1] = (out[-1][0], f"{out[-1][1]}, {name}", out[-1][2])
        else:
            out.append((ai, name, [r]))
    return out


def plot(rows: list[dict], device: str, path: str) -> dict:
    """A log-log roofline (FLOP/byte against GFLOP/s) of A100, H100 and H200 (FP32 roofs;
    ``device``'s FP16 tensor-core roof dashed); the ops are placed on ``device``'s roof for
    their dtype at their measured arithmetic intensity. Returns the axes' scales, limits and
    labels (the CLI's ``--json`` reports them)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9.5, 6.2), dpi=110)
    placed = [r for r in rows if r["flops"] > 0 and r["bytes"] > 0]
    ais = [r["flops"] / r["bytes"] for r in placed]
    spec = profiling.DEVICES[device]
    lo = min([*ais, 0.05]) / 2
    hi = max(spec.fp16_tensor / spec.bandwidth * 4, max(ais, default=1) * 2)
    xs = np.geomspace(lo, hi, 300)
    for key, other in profiling.DEVICES.items():
        ax.plot(
            xs,
            np.minimum(other.fp32, xs * other.bandwidth) / 1e9,
            lw=2.5 if key == device else 1.2,
            alpha=1.0 if key == device else 0.6,
            label=f"{other.name}: {other.bandwidth / 1e12:.2f} TB/s, "
            f"{other.fp32 / 1e12:.1f} TFLOP/s FP32",
        )
    ax.plot(
        xs,
        np.minimum(spec.fp16_tensor, xs * spec.bandwidth) / 1e9,
        ls="--",
        color="gray",
        label=f"{spec.name}: {spec.fp16_tensor / 1e12:.0f} TFLOP/s FP16 tensor cores (dense)",
    )
    first = rows[0] if rows else {}
    for k, (ai, label, group) in enumerate(_groups(placed, first)):
        for r in group:
            x = r["flops"] / r["bytes"]
            y = min(_roof(spec, r["dtype"]), x * spec.bandwidth) / 1e9
            ax.scatter([x], [y], zorder=3, color="black", s=18)
        y = min(_roof(spec, group[0]["dtype"]), ai * spec.bandwidth) / 1e9
        right = ai > hi / 30 or k % 2 == 1  # labels near the right edge go to the left
        ax.annotate(
            f"{label} ({ai:.2f})", (ai, y), textcoords="offset points",
            xytext=(-8, 8) if right else (8, -12), fontsize=7, ha="right" if right else "left",
        )  # fmt: skip
    unplaced = [r["op"] for r in rows if r not in placed]
    shape = "x".join(map(str, first.get("shape", []))) or "?"
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP / byte, bytes measured in the simulator)")
    ax.set_ylabel("attainable GFLOP/s")
    title = f"tessera_tile prebuilt ops on the {spec.name} roofline ({shape} {first.get('dtype')})"
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
        print(json.dumps(row), flush=True)
