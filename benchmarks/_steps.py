"""The command line the benchmark scripts share: ``python SCRIPT [STEP|all]``, each step in a
process of its own, because the simulator must be switched on (``NUMBA_ENABLE_CUDASIM=1``)
before Numba is imported: the steps in ``simulated`` run with it, the others without."""

import argparse
import os
import subprocess
import sys


def run(doc: str, steps: dict, simulated: frozenset = frozenset()) -> None:
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("what", nargs="?", choices=[*steps, "all"], default="all")
    what = parser.parse_args().what
    on = os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0")
    if what != "all" and on == (what in simulated):
        steps[what]()
        return
    for step in steps if what == "all" else [what]:
        env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
        if step in simulated:
            env["NUMBA_ENABLE_CUDASIM"] = "1"
        subprocess.run([sys.executable, sys.argv[0], step], env=env, check=True)
