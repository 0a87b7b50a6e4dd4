"""tt.autotune: model ranking, pruning against the shipped default, shape buckets, the caches,
the progress bar, and argument checks. Without a GPU the model chooses; on a GPU configs are
timed, so the tests that check what the model chose hold only without one."""

import importlib
import json
import os
import warnings
from dataclasses import dataclass

import numpy as np
import pytest

import tessera_tile as tt
from tessera_tile._runtime import cache as _cache
from tessera_tile._runtime import config as _config
from tessera_tile.autotune import bucket, key_part

model_chooses = pytest.mark.sim_only(reason="without a GPU the model chooses; a GPU times configs")


@dataclass(frozen=True)
class Cfg:
    block: int
    warps: int = 4


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TESSERA_TILE_CACHE_DIR", str(tmp_path))


def counting(scores: dict):
    """A model that returns ``scores[config.block]`` and counts its calls."""

    def model(config, x, *rest, **kw):
        model.calls += 1
        return scores[config.block]

    model.calls = 0
    return model


def make(configs, model=None, cache=True, name="launch"):
    def launch(x, y=None, *, config):
        return config

    launch.__qualname__ = name
    return tt.autotune(configs, key=["x"], model=model, cache=cache)(launch)


@pytest.mark.parametrize(
    ("n", "expected"),
    [(0, 0), (1, 1), (2, 2), (3, 4), (4, 4), (5, 8), (1000, 1024), (1024, 1024), (1025, 2048)],
)
def test_bucket_is_the_next_power_of_two(n, expected):
    assert bucket(n) == expected


def test_key_part_buckets_shapes_and_names_dtypes():
    assert key_part(np.zeros((1000, 3), np.float16)) == ["array", [1024, 4], "<f2"]
    assert key_part(7) == ["int", 8]
    assert key_part("ab") == ["str", "'ab'"]


@model_chooses
def test_model_picks_the_best_ranked_config():
    model = counting({64: 3.0, 128: 1.0, 256: 2.0})
    launch = make([Cfg(64), Cfg(128), Cfg(256)], model)
    assert launch(np.zeros((8, 8))) == Cfg(128)
    assert model.calls == 3


@model_chooses
def test_never_a_config_the_model_ranks_worse_than_the_default():
    model = counting({64: 1.0, 128: 5.0, 256: 1.0})  # a tie goes to the default
    assert make([Cfg(64), Cfg(128), Cfg(256)], model)(np.zeros(4)) == Cfg(64)


@model_chooses
def test_without_a_model_the_default_is_used_unless_configs_have_a_cost():
    assert make([Cfg(64), Cfg(128)])(np.zeros(4)) == Cfg(64)

    @dataclass(frozen=True)
    class Costed:
        block: int

        def cost(self, x, y=None):
            return abs(self.block - x.shape[0])

    assert make([Costed(64), Costed(128)], name="costed")(np.zeros(120)) == Costed(128)


def test_a_cached_choice_skips_the_model_in_memory_and_on_disk():
    model = counting({64: 2.0, 128: 1.0})
    first = make([Cfg(64), Cfg(128)], model)
    x = np.zeros((1000, 3), np.float32)
    chosen = first(x)
    assert model.calls == 2
    assert first(x) == chosen and first(np.zeros((999, 4), np.float32)) == chosen  # one bucket
    assert model.calls == 2
    assert first.stats["tuned"] == 1
    # A new instance (another process would be the same) reads the disk, not the model.
    second = make([Cfg(64), Cfg(128)], model)
    assert second(x) == chosen
    assert model.calls == 2 and second.stats["disk_hits"] == 1
    # Other dtypes are other entries.
    second(np.zeros((1000, 3), np.float64))
    assert model.calls == 4


def test_cache_false_keeps_nothing_on_disk(tmp_path):
    make([Cfg(64), Cfg(128)], counting({64: 2.0, 128: 1.0}), cache=False)(np.zeros(4))
    assert not list(tmp_path.rglob("*.json"))


@model_chooses
def test_the_entry_records_a_model_choice(tmp_path):
    import json

    make([Cfg(64), Cfg(128)], counting({64: 2.0, 128: 1.0}))(np.zeros((3, 5), np.float32))
    (path,) = tmp_path.rglob("*.json")
    entry = json.loads(path.read_text())
    assert entry["key"]["bucket"] == [["array", [4, 8], "<f4"]]
    assert entry["key"]["arch"] == ("none" if not _config.gpu_present() else entry["key"]["arch"])
    assert entry["value"]["chosen_by"] == "model"
    assert entry["value"]["index"] == 1 and entry["value"]["config"] == "Cfg(block=128, warps=4)"


@pytest.mark.sim_only(reason="the GPU path with the simulator's events (equal times)")
def test_a_progress_bar_shows_while_timing_and_ranking_is_quiet(capsys, monkeypatch):
    scores = counting({64: 1, 128: 1, 256: 3})
    make([Cfg(64), Cfg(128), Cfg(256)], scores, name="quiet")(np.zeros(4))
    assert capsys.readouterr().err == ""  # the model ranks in microseconds: no bar
    monkeypatch.setattr(_config, "gpu_present", lambda: True)
    make([Cfg(64), Cfg(128), Cfg(256)], scores, name="bar")(np.zeros(4))
    err = capsys.readouterr().err
    assert "autotune bar: timing" in err and "2/2" in err and "━" in err


def test_bad_arguments_are_named():
    def launch(x, *, config):
        return config

    with pytest.raises(ValueError, match="configs is empty"):
        tt.autotune([], key=["x"])(launch)
    with pytest.raises(TypeError, match="hashable"):
        tt.autotune([[1]], key=["x"])(launch)
    with pytest.raises(ValueError, match=r"key names \['y'\]"):
        tt.autotune([Cfg(64)], key=["y"])(launch)
    with pytest.raises(TypeError, match="'config' argument"):
        tt.autotune([Cfg(64)], key=["x"])(lambda x: x)


@pytest.mark.sim_only(
    reason="the GPU path with the simulator's events, whose times are all equal (-1): it checks "
    "what is timed and recorded, not which config is fastest"
)
def test_with_a_gpu_pruned_configs_are_never_launched_and_choices_are_measured(monkeypatch):
    monkeypatch.setattr(_config, "gpu_present", lambda: True)
    launched = []

    def launch(x, *, config):
        launched.append(config.block)

    model = counting({64: 2.0, 128: 1.0, 256: 3.0})
    tuned = tt.autotune([Cfg(64), Cfg(128), Cfg(256)], key=["x"], model=model, warmup=2, repeat=5)(
        launch
    )
    tuned(np.zeros(4))
    assert launched.count(256) == 0  # ranked worse than the default: never timed
    timing, call = launched[:-1], launched[-1]
    assert timing.count(64) == timing.count(128) == 2 + 5
    assert call == 64  # equal times: the earlier config, the default, wins
    (entry,) = tuned.disk.entries()
    assert entry["value"]["chosen_by"] == "measured" and len(entry["value"]["times_ms"]) == 3
    assert entry["key"]["arch"].startswith("sm_")


def test_a_model_choice_is_tuned_again_where_a_gpu_can_measure(monkeypatch):
    # The first call without a GPU (the model chooses), the second with one, on either tier;
    # both under one arch, which the disk key names, so the second finds the first's entry.
    monkeypatch.setattr(importlib.import_module("tessera_tile.autotune"), "_arch", lambda: "sm_90")
    monkeypatch.setattr(_config, "gpu_present", lambda: False)
    model = counting({64: 2.0, 128: 1.0})
    first = make([Cfg(64), Cfg(128)], model)
    first(np.zeros(4))
    (entry,) = first.disk.entries()
    assert entry["value"]["chosen_by"] == "model"
    monkeypatch.setattr(_config, "gpu_present", lambda: True)
    again = make([Cfg(64), Cfg(128)], model)
    assert again.disk.get(again.disk_key((np.zeros(4),), {})) == entry["value"]
    again(np.zeros(4))
    assert again.stats["tuned"] == 1 and again.stats["disk_hits"] == 0
    (entry,) = again.disk.entries()
    assert entry["value"]["chosen_by"] == "measured"


@model_chooses
def test_tuned_ops_choose_tile_configs_with_the_analytic_model():
    """tessera_tile.tuned: the matmul family's TileConfigs ranked by tile_config.estimate."""
    from tessera_tile import tile_config, tuned

    rng = np.random.default_rng(3)
    a = rng.standard_normal((70, 40)).astype(np.float32)
    b = rng.standard_normal((40, 33)).astype(np.float32)
    np.testing.assert_allclose(tuned.matmul(a, b), a @ b, rtol=1e-5, atol=1e-5)  # f32, K = 40
    scores = [tuned.model(c, a, b) for c in tuned.CONFIGS]
    assert tuned.model(tuned.matmul.choose(a, b), a, b) == min(scores) <= scores[0]
    assert scores[-1] == float("inf")  # the tensor-core tile takes float16 only

    x, w = a.astype(np.float16), b.astype(np.float16)
    bias = np.linspace(-1, 1, 33).astype(np.float16)
    chosen = tuned.linear.choose(x, w, bias, "relu")
    assert chosen == tile_config.default_config(70, 33, 40, dtype="float16")
    assert chosen in tile_config.TENSOR_CORE_CANDIDATES
    expected = np.maximum(x.astype(np.float32) @ w.astype(np.float32) + bias, 0)
    got = tuned.linear(x, w, bias, "relu").astype(np.float32)
    np.testing.assert_allclose(got, expected, rtol=2e-3, atol=2e-3)  # float16 result rounding


@model_chooses
@pytest.mark.parametrize("shape", [(17, 300, 9), (300, 1024, 2048)])  # buckets no other test uses
def test_ops_default_configs_come_from_the_tuner(shape, monkeypatch):
    """ops.matmul without config= tunes at its first launch of a shape bucket (the model's
    choice here, as default_config makes it) and records it; explain reports that choice and
    tunes nothing, even where a GPU could time; an explicit config is used as given."""
    from tessera_tile import ops, tile_config, tuned

    m, k, n = shape
    a, b = np.zeros((m, k), np.float32), np.zeros((k, n), np.float32)
    expected = tile_config.default_config(m, n, k)
    with monkeypatch.context() as patch:
        patch.setattr(_config, "gpu_present", lambda: True)
        tuned_before = tuned.matmul.stats["tuned"]
        assert str(expected) in ops.matmul.explain(a, b).stages[0]
        assert tuned.matmul.stats["tuned"] == tuned_before  # a report times nothing
    if m * n <= 17 * 9:  # small enough to run in the simulator
        ops.matmul(a, b)
        assert tuned.matmul.stats["tuned"] == tuned_before + 1
        (entry,) = [
            e for e in tuned.matmul.disk.entries() if e["value"]["config"] == repr(expected)
        ]
        assert entry["value"]["chosen_by"] == "model"
    assert tuned.matmul.expected(a, b) == expected
    given = tile_config.CANDIDATES[-1]
    assert str(given) in ops.matmul.explain(a, b, config=given).stages[0]


def cache_warnings(caught) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, _cache.CacheWarning)]


def edit_entry(path, edit, resign: bool) -> None:
    """Edit a stored choice by hand; ``resign``: recompute its checksum too, as a careful
    editor would (then only the value's check can tell)."""
    entry = json.loads(path.read_text())
    entry["value"] = edit(entry["value"])
    if resign:
        entry["checksum"] = _cache.checksum(entry["header"], entry["key"], entry["value"])
    path.write_text(json.dumps(entry))


HAND_EDITS = {
    "index a string": lambda v: v | {"index": "1"},
    "index a float": lambda v: v | {"index": 1.0},
    "index out of range": lambda v: v | {"index": 7},
    "a list": lambda v: [v["index"]],
    "chosen_by missing": lambda v: {k: x for k, x in v.items() if k != "chosen_by"},
    "config of another index": lambda v: v | {"index": 0},
}


@model_chooses
@pytest.mark.parametrize("resign", [False, True], ids=["checksum", "resigned"])
@pytest.mark.parametrize("edit", HAND_EDITS)
def test_a_hand_edited_choice_warns_once_and_is_tuned_again(tmp_path, edit, resign):
    x = np.zeros((3, 5), np.float32)
    make([Cfg(64), Cfg(128)], counting({64: 2.0, 128: 1.0}))(x)
    (path,) = tmp_path.rglob("*.json")
    edit_entry(path, HAND_EDITS[edit], resign)
    again = make([Cfg(64), Cfg(128)], counting({64: 2.0, 128: 1.0}))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert again.expected(x) == Cfg(128)  # a report, then the call: one read each
        assert again(x) == Cfg(128)
    (message,) = cache_warnings(caught)
    assert str(path) in message
    assert again.stats["tuned"] == 1 and again.stats["disk_hits"] == 0
    assert _cache.read_entry(path).status == "ok"  # rebuilt
    assert make([Cfg(64), Cfg(128)])(x) == Cfg(128)


@model_chooses
def test_an_op_reads_past_a_tuning_entry_that_is_not_utf8(tmp_path):
    """ops.matmul's config comes from tuned.matmul's cache: a file of bytes that are not UTF-8
    there is one warning and a new choice per corruption, and the result stays right."""
    from numba import cuda

    from tessera_tile import ops, tuned

    rng = np.random.default_rng(7)
    a = rng.standard_normal((20, 16)).astype(np.float32)
    b = rng.standard_normal((16, 12)).astype(np.float32)
    expected = a.astype(np.float64) @ b.astype(np.float64)
    path = tuned.matmul.disk.directory / f"{_cache.digest(tuned.matmul.disk_key((a, b), {}))}.json"
    ops.matmul(a, b)
    for side in ("host", "device"):
        path.write_bytes(b"\xff\xfe" + path.read_bytes())
        tuned.matmul.clear()  # as a new process: the choice comes from the disk
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = ops.matmul(*((a, b) if side == "host" else map(cuda.to_device, (a, b))))
        got = got if side == "host" else got.copy_to_host()
        (message,) = cache_warnings(caught)
        assert str(path) in message and "not UTF-8" in message
        # float32 products summed over K = 16 terms of magnitude ~1: a few ulps of ~4
        np.testing.assert_allclose(got, expected, rtol=0, atol=1e-5)
        assert _cache.read_entry(path).status == "ok"  # rebuilt


# Two processes sharing one cache: the first tunes linear with the command, on a stand-in GPU
# whose timings make the last candidate win; the second reads the op's default config.
_TUNE_THEN_READ = """
import importlib
import sys

import numpy as np

from tessera_tile import ops, tuned
from tessera_tile._runtime import config as _config
from tessera_tile.cli import main

autotune = importlib.import_module("tessera_tile.autotune")  # tt.autotune is the decorator
autotune._arch = lambda: "sm_90"  # one architecture for both processes
x, w, bias = (np.zeros(shape, np.float32) for shape in [(64, 32), (32, 32), 32])
if sys.argv[1] == "tune":
    _config.gpu_present = lambda: True
    autotune._time_config = lambda launch, args, kwargs, config, *rest: (
        1 / (1 + tuned.CONFIGS.index(config)), None
    )
    main(["tune", "linear", "--shape", "64x32"], standalone_mode=False)
else:
    print(repr(ops.linear._plan(x, w, bias).tile_config()))
    print(repr(ops.matmul._plan(x, w).tile_config()))
"""


def test_tune_linear_changes_what_ops_linear_runs(tmp_path):
    import subprocess
    import sys

    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1", "TESSERA_TILE_CACHE_DIR": str(tmp_path)}

    def run(step):
        done = subprocess.run(
            [sys.executable, "-c", _TUNE_THEN_READ, step], env=env, capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    before = run("read").splitlines()
    assert before[0] == before[1]  # untuned: both take the model's choice
    tuned_line = run("tune")
    linear_config, matmul_config = run("read").splitlines()
    assert linear_config in tuned_line, (linear_config, tuned_line)
    assert linear_config != before[0] and matmul_config == before[1]


def test_a_call_every_config_refuses_raises_its_own_error(monkeypatch):
    """Timing (as on a GPU) arguments that no config takes: the call's own error, not a
    generic one (on an H200: a strided bfloat16 operand, refused by name)."""
    monkeypatch.setattr(_config, "gpu_present", lambda: True)

    def launch(x, *, config):
        raise ValueError(f"x of shape {np.shape(x)} is refused")

    tuner = tt.autotune([Cfg(1), Cfg(2)], key=["x"], cache=False)(launch)
    with pytest.raises(ValueError, match=r"x of shape \(3,\) is refused"):
        tuner.choose(np.zeros(3))
