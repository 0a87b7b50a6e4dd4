"""Steady-state figures of compiled kernels, read from the loops ``tessera_tile.inspect`` finds
in the SASS; shared by the benchmark scripts."""


def streamed(report, inputs: int, width: int) -> tuple[float, int]:
    """An elementwise kernel: its 16-byte loop's instructions per element (``width`` elements
    per load of each of ``inputs`` inputs), and the bytes each thread has in flight there."""
    loop = report.loop_with("LDG.E.128")
    elements = width * loop.count("LDG.E.128") // inputs
    return report.instructions_per_element(elements, loop), report.bytes_in_flight(loop)


def marginal(report, smaller, elements: int) -> float:
    """A row kept in registers has no loop: the instructions the kernel gains from ``smaller``
    (the same kernel over shorter rows) per extra element a thread handles, as the peers'
    figures are measured."""
    return (report.instructions - smaller.instructions) / elements


def whole(report, elements: int) -> float:
    """Every instruction of a loop-free kernel (per-row reductions, barriers and addressing
    included) over the elements one thread handles: an upper bound of the steady state."""
    return report.instructions / elements


def row_loop(report, elements: int = 16) -> float:
    """A row kernel that loops over rows (holding its weights across them): its row loop's
    instructions over the ``elements`` each thread handles per row, per-row reductions,
    barriers and addressing included."""
    return report.instructions_per_element(elements, report.hottest_loop)
