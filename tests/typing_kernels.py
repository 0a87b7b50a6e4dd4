"""Kernels numba-cuda types or refuses, for the simulator tier (which must refuse the same) and
the compile tier (which checks numba-cuda itself): shared- and local-array shapes, ``*args``, and
``reshape``. Plain functions: each tier jits them its own way."""

import collections

from numba import cuda, float32

N = 16
SHAPE = (4, 4)
_Config = collections.namedtuple("_Config", "n")


def _kernels():
    cfg, m = _Config(8), 8

    def literal(x):
        s = cuda.shared.array(32, float32)
        s[0] = x[0]
        x[1] = s[0]

    def folded_literals(x):  # Python folds 16 * 2 into 32
        s = cuda.shared.array(16 * 2, float32)
        s[0] = x[0]
        x[1] = s[0]

    def global_name(x):
        s = cuda.shared.array(N, float32)
        s[0] = x[0]
        x[1] = s[0]

    def closure_name(x):
        s = cuda.shared.array(m, float32)
        s[0] = x[0]
        x[1] = s[0]

    def tuple_of_names(x):
        s = cuda.shared.array((N, m), float32)
        s[0, 0] = x[0]
        x[1] = s[0, 0]

    def item_of_a_global(x):
        s = cuda.shared.array(SHAPE[0], float32)
        s[0] = x[0]
        x[1] = s[0]

    def global_times_two(x):
        s = cuda.shared.array(N * 2, float32)
        s[0] = x[0]
        x[1] = s[0]

    def negated_global(x):
        s = cuda.shared.array(-N, float32)
        s[0] = x[0]

    def field_of_a_closure(x):
        s = cuda.shared.array(cfg.n, float32)
        s[0] = x[0]
        x[1] = s[0]

    def keyword_expression(x):
        s = cuda.shared.array(shape=N * 2, dtype=float32)
        s[0] = x[0]
        x[1] = s[0]

    def local_array_expression(x):
        s = cuda.local.array(N * 2, float32)
        s[0] = x[0]
        x[1] = s[0]

    typed = [literal, folded_literals, global_name, closure_name, tuple_of_names, item_of_a_global]
    refused = [
        global_times_two, negated_global, field_of_a_closure, keyword_expression,
        local_array_expression,
    ]  # fmt: skip
    return [(f, True) for f in typed] + [(f, False) for f in refused]


# (kernel function, whether numba-cuda types its shape)
SHAPES = _kernels()
SHAPE_IDS = [fn.__name__ for fn, _ in SHAPES]
SIGNATURE = "void(float32[::1])"


def star_args_kernel(*args):  # numba-cuda: "Signature mismatch" for two arrays
    args[1][0] = args[0][0]


def reshape_kernel(x, y):  # numba-cuda: layout C reshapes, layout A is refused
    z = x.reshape((2, 2))
    y[0] = z[1, 1]
