"""The main demo: run every example against NumPy, then show what its kernels compile to.

Kernels run on the GPU when there is one, else in tessera_tile's warp-aware simulator (a second
process with NUMBA_ENABLE_CUDASIM=1: the simulator and the real compiler cannot share one).
The compile reports (sm_80 and sm_90) need no GPU.
"""

import argparse
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
EXAMPLES = [
    "elementwise_chain",
    "row_reductions",
    "transpose",
    "matmul",
    "fused_softmax",
    "ops_demo",
]


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, HERE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def gpu_available() -> bool:
    probe = "from numba import cuda; print(cuda.is_available())"
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env)
    return out.stdout.strip().endswith("True")


def run_examples() -> None:
    import tessera_tile  # noqa: F401 - installs the warp-aware simulator when simulating

    for name in EXAMPLES:
        print(f"--- {name}")
        load(name).main()


def show_reports() -> None:
    from tessera_tile import inspect

    for name in EXAMPLES:
        module = load(name)
        for arch in ("sm_80", "sm_90"):
            for kernel, signature in module.KERNELS:
                print(inspect.compile(kernel, signature, arch=arch))
            for report in getattr(module, "compile_reports", lambda arch: [])(arch):
                print(report)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--run-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run_only:
        run_examples()
        return 0

    if gpu_available():
        print("CUDA GPU found: running the examples on it.")
        run_examples()
    else:
        print("No CUDA GPU: running the examples in tessera_tile's simulator.")
        env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
        done = subprocess.run([sys.executable, __file__, "--run-only"], env=env)
        if done.returncode:
            return done.returncode
    print("\nWhat the kernels compile to (NVVM -> ptxas, no GPU needed):")
    show_reports()
    return 0


if __name__ == "__main__":
    sys.exit(main())
