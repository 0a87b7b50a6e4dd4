"""Dask: tasks, bytes moved between chunks and wall time of a chunked layer norm, a chunked sum
and a K-chunked matmul, on a ``distributed.LocalCluster`` of 1 and 2 workers.

    NUMBA_ENABLE_CUDASIM=1 python benchmarks/distributed.py        # no GPU: the simulator
    python benchmarks/distributed.py --rows 4096 --cols 4096       # on a machine with GPUs

"moved" is what ``tessera_tile.dask.explain`` counts between chunks; "minimum" the least the
reduction needs (every partial but one leaves its chunk); "between workers" what the workers'
transfer logs recorded in the timed run. It prints; it asserts nothing.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import click
import numpy as np
from rich.console import Console
from rich.table import Table

# run as a script, this file's folder comes first on sys.path, and this file is named like
# the package it needs: take the folder out so that `import distributed` finds the package
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.modules.pop("distributed", None)


def _cases(rows: int, cols: int, chunks: int):
    import dask.array as da

    from tessera_tile import ops

    rng = np.random.default_rng(0)
    x = rng.standard_normal((rows, cols)).astype(np.float32)
    w = rng.uniform(0.5, 1.5, cols).astype(np.float32)
    b = rng.standard_normal(cols).astype(np.float32)
    m = rng.standard_normal((cols, 64)).astype(np.float32)
    col = (rows, -(-cols // chunks))
    return [
        ("layer_norm, columns in chunks", ops.layer_norm, (da.from_array(x, chunks=col), w, b)),
        ("sum over axis 0, rows in chunks", ops.sum,
         (da.from_array(x, chunks=(-(-rows // chunks), cols)),), {"axis": 0}),
        ("matmul, K in chunks", ops.matmul, (da.from_array(x, chunks=col), m)),
    ]  # fmt: skip


def _transferred(client) -> int:
    logs = client.run(
        lambda dask_worker: sum(t["total"] for t in dask_worker.transfer_incoming_log)
    )
    return int(sum(logs.values()))


@click.command()
@click.option("--rows", default=64, show_default=True, help="rows of x")
@click.option("--cols", default=256, show_default=True, help="columns of x (K of the matmul)")
@click.option("--chunks", default=4, show_default=True, help="chunks along the split axis")
@click.option("--repeat", default=2, show_default=True, help="timed runs (the best is shown)")
def main(rows: int, cols: int, chunks: int, repeat: int) -> None:
    import distributed

    import tessera_tile.dask as ttd

    where = "simulator" if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1" else "GPU"
    table = Table(title=f"tessera_tile.dask, {rows} x {cols} float32, {chunks} chunks ({where})")
    for col in ("case", "tasks", "moved B", "minimum B", "workers", "wall s", "between workers B"):
        table.add_column(col, justify="left" if col == "case" else "right")
    for n_workers in (1, 2):
        with (
            distributed.LocalCluster(
                n_workers=n_workers, threads_per_worker=1, processes=True, dashboard_address=":0"
            ) as cluster,
            distributed.Client(cluster) as client,
        ):
            for name, op, args, *kw in _cases(rows, cols, chunks):
                kwargs = kw[0] if kw else {}
                report = ttd.explain(op, *args, **kwargs)
                result = ttd.apply(op, *args, **kwargs)
                client.compute(result).result()  # warm: kernels built on every worker
                best = float("inf")
                for _ in range(repeat):
                    client.run(lambda dask_worker: dask_worker.transfer_incoming_log.clear())
                    start = time.perf_counter()
                    client.compute(result).result()
                    best = min(best, time.perf_counter() - start)
                table.add_row(
                    name, str(report.tasks), str(report.bytes_between_chunks),
                    str(report.minimum_between_chunks), str(n_workers), f"{best:.3f}",
                    str(_transferred(client)),
                )  # fmt: skip
    Console().print(table)


if __name__ == "__main__":
    main()
