"""What one fused call copies between host and device and allocates, by input kind.

Counts numba's own transfer and allocation calls (``tessera_tile.sim.transfers``) around one
call of each fused function, after a first call has compiled it. Runs on a GPU when there is
one, else in the simulator (it re-executes itself with NUMBA_ENABLE_CUDASIM=1), where device
arrays take the same path.

    python benchmarks/device_path.py
"""

import os
import subprocess
import sys

if os.environ.get("NUMBA_ENABLE_CUDASIM") != "1":
    probe = subprocess.run(
        [sys.executable, "-c", "from numba import cuda; print(cuda.is_available())"],
        capture_output=True, text=True,
    )  # fmt: skip
    if not probe.stdout.strip().endswith("True"):
        os.environ["NUMBA_ENABLE_CUDASIM"] = "1"
        os.execv(sys.executable, [sys.executable, *sys.argv])

import numpy as np  # noqa: E402
from numba import cuda  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

import tessera_tile as tt  # noqa: E402
from tessera_tile import sim  # noqa: E402


@tt.fuse
def softmax(x):
    e = tt.exp(x - tt.max(x, axis=-1, keepdims=True))
    return e / tt.sum(e, axis=-1, keepdims=True)


@tt.fuse
def centred_total(x):
    return tt.sum(x - tt.mean(x))


@tt.fuse
def scale_and_row_sums(x, w):
    y = x * w
    return y, tt.sum(y, axis=-1)


def main() -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 256)).astype(np.float32)
    w = rng.standard_normal(256).astype(np.float32)
    cases = [
        ("softmax(x)", softmax, (x,)),
        ("centred_total(x): 2 kernels", centred_total, (x,)),
        ("scale_and_row_sums(x, w): 2 results", scale_and_row_sums, (x, w)),
    ]
    where = "the simulator" if tt._config.SIMULATED else "the GPU"
    table = Table(title=f"per call, after the first (measured in {where})")
    for column in ("call", "inputs", "host->device", "device->host", "device allocations"):
        table.add_column(column, justify="left" if column in ("call", "inputs") else "right")
    for name, fn, args in cases:
        for kind, inputs in (("NumPy", args), ("device", tuple(cuda.to_device(a) for a in args))):
            fn(*inputs)  # compile outside the count
            with sim.transfers() as counts:
                fn(*inputs)
            table.add_row(
                name, kind, str(counts["to_device"]), str(counts["copy_to_host"]),
                str(counts["device_array"]),
            )  # fmt: skip
    Console(width=110).print(table)
    print(
        "Device allocations: the results, plus temporaries between kernels and the per-block "
        "partials of full reductions. Host inputs are copied in once and results copied back."
    )


if __name__ == "__main__":
    main()
