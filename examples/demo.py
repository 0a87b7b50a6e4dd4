"""The main demo: run every example against NumPy and print one line per check.

    python examples/demo.py             # the summary (what `make demo` runs)
    python examples/demo.py --reports   # then what each example's kernels compile to

Kernels run on the GPU when there is one, else in tessera_tile's warp-aware simulator (a child
process with NUMBA_ENABLE_CUDASIM=1). Each line says whether the check matched NumPy (within the
tolerance its example states), its largest error, and the global memory traffic of its kernels
as the simulator's profiler measured it (on a GPU: not measured, "-"). The compile reports
(sm_80 and sm_90) need no GPU; they run in a child process without the simulator, since the
simulator and the real compiler cannot share one.
"""

import argparse
import contextlib
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
EXAMPLES = [
    "axpy",
    "elementwise_chain",
    "row_reductions",
    "transpose",
    "large_shared_tile",
    "matmul",
    "fused_softmax",
    "ops_demo",
    "bf16_mlp_block",
    "algebraic_fusion",
    "dask_layer_norm",
    "training_step",
]


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, HERE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def checks(module) -> list:
    """An example's ``(label, check)`` pairs: its own ``checks()`` when it has several, else its
    ``run()``, which asserts against NumPy and returns the largest error."""
    if hasattr(module, "checks"):
        return module.checks()
    return [(module.__name__, module.run)]


def measured(check, simulated: bool):
    """Run one check: (matched NumPy, largest error or the failure, bytes moved or None)."""
    meter = contextlib.nullcontext()
    if simulated:
        from tessera_tile import sim

        meter = sim.profile()
    with meter as prof:
        try:
            error = check()
        except AssertionError as failure:
            return False, str(failure).strip().splitlines()[0], None
    return True, error, prof.bytes_read + prof.bytes_written if prof else None


def summarize() -> bool:
    """Run every example's checks; print one line each; True when all matched NumPy."""
    from tessera_tile._runtime import config as _config

    simulated = _config.SIMULATED
    print(f"{'check':44} {'matches NumPy':>13} {'max error':>10} {'traffic (B)':>12}")
    all_matched = True
    for name in EXAMPLES:
        for label, check in checks(load(name)):
            matched, error, moved = measured(check, simulated)
            all_matched &= matched
            shown = f"{error:10.2e}" if matched else f"  {error}"
            print(f"{label:44} {'yes' if matched else 'NO':>13} {shown} {moved or '-':>12}")
    where = "measured by the simulator's profiler" if simulated else "not measured on a GPU"
    print("max error: as each example measures it (absolute; relative for ops.* and the row sums)")
    print(f"traffic: global memory bytes the check's kernels moved ({where})")
    return all_matched


def show_reports() -> None:
    from tessera_tile import inspect

    for name in EXAMPLES:
        module = load(name)
        for arch in ("sm_80", "sm_90"):
            for kernel, signature in module.KERNELS:
                print(inspect.compile(kernel, signature, arch=arch))
            for report in getattr(module, "compile_reports", lambda arch: [])(arch):
                print(report)


def gpu_available() -> bool:
    probe = "from numba import cuda; print(cuda.is_available())"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=_real())
    return out.stdout.strip().endswith("True")


def _real() -> dict:
    """The environment without the simulator."""
    return {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}


def _child(flag: str, env: dict) -> int:
    return subprocess.run([sys.executable, __file__, flag], env=env).returncode


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--reports", action="store_true", help="also print what the kernels compile to"
    )
    parser.add_argument("--summary-only", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--reports-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.summary_only:
        return 0 if summarize() else 1
    if args.reports_only:
        show_reports()
        return 0

    if gpu_available():
        print("CUDA GPU found: running the examples on it.")
        env = _real()
    else:
        print("No CUDA GPU: running the examples in tessera_tile's simulator.")
        env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    sys.stdout.flush()
    failed = _child("--summary-only", env)
    if args.reports:
        print("\nWhat the kernels compile to (NVVM -> ptxas, no GPU needed):", flush=True)
        failed |= _child("--reports-only", _real())
    else:
        print("(compile reports of every kernel: python examples/demo.py --reports)")
    return failed


if __name__ == "__main__":
    sys.exit(main())
