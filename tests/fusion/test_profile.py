"""tt.profile(): per fused kernel, the predicted bytes (= what the simulator measures), counted
FLOPs and roofline bound; without a GPU the report says nothing was timed."""

import numpy as np
import pytest

import tessera_tile as tt
from tessera_tile import ops, profiling


@pytest.mark.sim_only(reason="the static report: no GPU times the launches")
def test_the_profile_records_each_fused_kernel_with_measured_bytes():
    x = np.random.default_rng(1).standard_normal((8, 64)).astype(np.float32)
    with tt.sim.profile() as measured, tt.profile(device="a100") as prof:
        y = ops.softmax(x)
        ops.rms_norm(y, np.ones(64, np.float32))
    assert not prof.measured
    assert [r.name.startswith("fused_row_") for r in prof.records] == [True, True]
    assert sum(r.bytes for r in prof.records) == measured.bytes_read + measured.bytes_written
    # softmax over 8 x 64: max, subtract, exp, sum and divide, one FLOP per element each
    assert prof.records[0].flops == 5 * 8 * 64
    row = prof.rows()[0]
    spec = profiling.DEVICES["a100"]
    assert row["bound"] == "memory" and "time_ms" not in row
    assert row["roofline_ms"] == pytest.approx(prof.records[0].bytes / spec.bandwidth * 1e3)
    text = str(prof)
    assert "no GPU, so nothing was timed" in text and "A100" in text


@pytest.mark.sim_only(reason="the simulator's launches, counted beside the profile's records")
def test_each_record_gives_the_grid_block_and_dynamic_shared_memory_of_its_launches():
    from numba import cuda

    from tessera_tile._runtime import launch

    seen = []
    original = launch._launch

    def launching(kernel, grid, threads, params, stream, shared, kept=False):
        seen.append(
            profiling.launch_shape([launch.KernelLaunch(kernel, grid, threads, (), None, shared)])
        )
        return original(kernel, grid, threads, params, stream, shared, kept)

    x = cuda.to_device(np.ones((64, 512), np.float32))
    q = cuda.to_device(np.ones((1, 128, 128), np.float16))
    with pytest.MonkeyPatch.context() as mp, tt.profile() as prof:
        mp.setattr(launch, "_launch", launching)
        ops.softmax(x)
        ops.attention(q, q, q)  # 128 query rows per block of 128 threads, dynamic shared memory
    assert [r.launch for r in prof.records] == seen
    assert seen[0] == "8 x 256" and "KiB dyn" in seen[1], seen
    assert all(shape in str(prof) for shape in seen)


def test_add_gives_static_figures_without_running():
    x = np.zeros((16, 32), np.float32)
    w, b = np.ones(32, np.float32), np.zeros(32, np.float32)
    with tt.profile() as prof:
        prof.add(ops.layer_norm, x, w, b)
        prof.add(ops.transpose, x)
    layer_norm, transpose = prof.rows()
    assert layer_norm["bytes"] == ops.layer_norm.explain(x, w, b).bytes_fused
    assert layer_norm["flops"] > 16 * 32 and transpose["flops"] == 0
    assert transpose["bytes"] == 2 * 16 * 32 * 4


def test_profile_checks_its_device_and_does_not_nest():
    with pytest.raises(ValueError, match="device must be one of"), tt.profile(device="v100"):
        pass
    with tt.profile(), pytest.raises(RuntimeError, match="already active"), tt.profile():
        pass
    assert profiling.active() is None


@pytest.mark.sim_only(
    reason="the GPU path with the simulator's events, which time nothing: it checks what is "
    "recorded, not the times"
)
def test_on_a_gpu_each_launch_is_timed_on_its_stream(monkeypatch):
    from tessera_tile._runtime import config as _config

    monkeypatch.setattr(_config, "gpu_present", lambda: True)
    x = np.zeros((4, 32), np.float32)
    with tt.profile() as prof:
        ops.softmax(x)
    assert prof.measured
    (record,) = prof.records
    assert record.time_ms is not None and record.note == ""
    assert "time µs" in str(prof)


def _hand_written_calls():
    """One call of each op that launches hand-written kernels, on device arrays, and a fused
    function whose matmul runs as a composer GEMM stage."""
    from numba import cuda

    rng = np.random.default_rng(2)

    def dev(*shape, dtype=np.float32):
        return cuda.to_device(rng.standard_normal(shape).astype(dtype))

    @tt.fuse
    def gelu_linear(x, w):
        return tt.gelu(x @ w)

    a, b = dev(16, 16), dev(16, 16)
    q = dev(1, 1, 16, 16, dtype=np.float16)
    logits, targets = dev(4, 16), cuda.to_device(np.array([0, 3, 15, 7], np.int64))
    long_row = dev(1, 8193, dtype=np.float64)
    return [
        ("matmul_", ops.matmul, (a, b), {}),
        ("flash_attention", ops.attention, (q, q, q), {}),
        ("cross_entropy", ops.cross_entropy, (logits, targets), {"reduction": "none"}),
        ("transpose", ops.transpose, (a,), {}),
        ("layer_norm_long", ops.layer_norm, (long_row,), {}),
        ("matmul", gelu_linear, (a, b), {}),  # its generated epilogue in parentheses
    ]


@pytest.mark.sim_only(reason="the static report: no GPU times the launches")
def test_the_profile_records_the_hand_written_kernels_of_every_op():
    """Every launch goes through one path, so the profile sees the ops' hand-written kernels
    (and a fused matmul's GEMM stage), a kept call's launches too, each with explain's bytes
    and FLOPs."""
    for name, op, args, kwargs in _hand_written_calls():
        explain = op.explain(*args, **kwargs)
        with tt.profile() as prof:
            op(*args, **kwargs)
            op(*args, **kwargs)  # a kept call (device arrays, same layouts)
        assert len(prof.records) == 2, (name, prof.records)
        first, kept = prof.records
        assert name in first.name, (name, first.name)
        assert first == kept
        assert first.bytes == explain.bytes_fused, name
        assert first.flops == profiling.explain_flops(op, *args, **kwargs), name
        if op in (ops.matmul, ops.attention):
            assert first.flops > 0, name
