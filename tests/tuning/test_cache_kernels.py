"""Fused functions across processes: a second process's first call of a function already
compiled reads its program and kernels from the persistent cache, so it traces nothing and
generates no code (counted), and computes the same results. Whether NVVM is skipped too is the
compile tier's test (tests/compile/test_cache_nvvm.py): the simulator never runs NVVM."""

import json
import shutil

import numpy as np
import pytest
from test_cache import read_only, run_python

import tessera_tile as tt
from tessera_tile._fusion import persist
from tessera_tile._runtime import cache as _cache

FUSED = """
    import json
    import numpy as np
    import tessera_tile as tt

    SCALE = 1.5

    def shift(x):
        return x - tt.max(x, axis=-1, keepdims=True)

    @tt.fuse
    def softmax_scaled(x, w):
        e = tt.exp(shift(x))
        return e / tt.sum(e, axis=-1, keepdims=True) * w + SCALE

    x = np.random.default_rng(0).standard_normal((5, 70)).astype(np.float32)
    w = np.linspace(-1, 1, 70, dtype=np.float32)
    y = softmax_scaled(x, w)
    print(json.dumps({"info": softmax_scaled.cache_info(), "y": y.tolist()}))
    """


@pytest.mark.sim_only(reason="runs the fused function in a simulator subprocess")
def test_a_second_process_traces_and_generates_nothing(tmp_path):
    runs = []
    for _ in range(2):
        done = run_python(FUSED, tmp_path, sim=True)
        assert done.returncode == 0, done.stderr
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    first, second = (r["info"] for r in runs)
    assert first["persistent"] is True
    assert (first["traced"], first["programs_from_disk"]) == (1, 0)
    assert first["kernels_generated"] == 1 and first["kernels_from_disk"] == 0
    assert (second["traced"], second["programs_from_disk"]) == (0, 1)
    assert second["kernels_generated"] == 0 and second["kernels_from_disk"] == 1

    x = np.random.default_rng(0).standard_normal((5, 70)).astype(np.float32)
    w = np.linspace(-1, 1, 70, dtype=np.float32)
    e = np.exp(x - x.max(-1, keepdims=True))
    expected = e / e.sum(-1, keepdims=True) * w + np.float32(1.5)
    for r in runs:  # float32: a few ulps of the exp approximation and the reciprocal
        np.testing.assert_allclose(np.array(r["y"], np.float32), expected, rtol=2e-6, atol=2e-6)


def test_the_fingerprint_follows_code_constants_closures_and_helpers():
    def make(k):
        def fn(x):
            return x * k

        return fn

    def uses_helper(x):
        return helper(x)  # noqa: F821 - bound below, as a module's global would be

    assert persist.fingerprint_function(make(2)) == persist.fingerprint_function(make(2))
    assert persist.fingerprint_function(make(2)) != persist.fingerprint_function(make(3))

    def applies(x):
        return act(x)  # noqa: F821 - bound below, as a module's global would be

    globals()["act"] = tt.exp
    with_exp = persist.fingerprint_function(applies)
    globals()["act"] = tt.log  # made by the same factory as tt.exp: same qualname
    assert persist.fingerprint_function(applies) != with_exp
    globals()["helper"] = lambda x: x + 1
    before = persist.fingerprint_function(uses_helper)
    globals()["helper"] = lambda x: x + 2
    assert persist.fingerprint_function(uses_helper) != before


def test_functions_reading_arbitrary_objects_are_not_persisted(tmp_path, monkeypatch):
    monkeypatch.setenv("TESSERA_TILE_CACHE_DIR", str(tmp_path))

    class Knob:  # its behaviour is not pinned down by the function's code
        value = 2.0

    knob = Knob()

    @tt.fuse
    def scaled(x):
        return x * knob.value

    assert persist.fingerprint_function(scaled.fn) is None
    scaled.explain(np.zeros(4, np.float32))
    assert scaled.cache_info()["persistent"] is False
    assert (
        not list((tmp_path / "programs").glob("*.json"))
        if (tmp_path / "programs").exists()
        else True
    )


def test_a_program_survives_the_round_trip():
    @tt.fuse
    def norm(x):
        c = x - tt.mean(x, axis=-1, keepdims=True)
        return c / tt.sqrt(tt.mean(c * c, axis=-1, keepdims=True) + 1e-5)

    x = np.zeros((3, 40), np.float32)
    before = norm.explain(x)
    from tessera_tile._fusion import runtime

    call = runtime.Call("norm", (x,))
    program = persist.load_program(persist.dump_program(norm._program(call)))
    norm._programs.clear()
    norm._programs.get(call.signature, lambda: program)
    after = norm.explain(x)
    assert (after.ir, after.bytes_fused, after.stages) == (
        before.ir,
        before.bytes_fused,
        before.stages,
    )


def test_an_unreadable_payload_warns_once_and_is_rewritten(tmp_path, monkeypatch):
    import warnings

    from tessera_tile import fusion as fusion_module

    monkeypatch.setattr(fusion_module, "_programs_disk", _cache.DiskCache("programs", tmp_path))

    @tt.fuse
    def doubled(x):
        return x * 2

    x = np.zeros(8, np.float32)
    doubled.explain(x)
    (path,) = (tmp_path / "programs").glob("*.json")
    entry = json.loads(path.read_text())
    entry["value"] = "bm90IGEgcGlja2xl"  # valid JSON, valid base64, not a pickle
    entry["checksum"] = _cache.checksum(entry["header"], entry["key"], entry["value"])
    path.write_text(json.dumps(entry))
    again = tt.fuse(doubled.fn)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        again.explain(x)
    assert len([w for w in caught if w.category is _cache.CacheWarning]) == 1
    assert again.cache_info()["traced"] == 1
    third = tt.fuse(doubled.fn)
    third.explain(x)
    assert third.cache_info()["programs_from_disk"] == 1


TWO_FUNCTIONS = """
    import json
    import numpy as np
    from numba import cuda
    import tessera_tile as tt

    @tt.fuse
    def affine(x):
        return x * 2.0 + 1.0

    @tt.fuse
    def centred(x):
        return x - tt.mean(x, axis=-1, keepdims=True)

    x = np.linspace(-4, 4, 37, dtype=np.float32)
    print(json.dumps({
        "affine": affine(x).tolist(),
        "affine_device": affine(cuda.to_device(x)).copy_to_host().tolist(),
        "centred": centred(x).tolist(),
        "centred_device": centred(cuda.to_device(x)).copy_to_host().tolist(),
    }))
    """


def check_two_functions(done) -> None:
    """The results of TWO_FUNCTIONS, host and device. affine: x * 2 is exact and the add
    rounds once (an FMA too), so equal to NumPy's float32; centred: float32 sum of 37 values
    of at most 4 against a float64 reference, a few ulps of 4."""
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout.strip().splitlines()[-1])
    x = np.linspace(-4, 4, 37, dtype=np.float32)
    for side in ("", "_device"):
        np.testing.assert_array_equal(np.float32(got["affine" + side]), x * np.float32(2) + 1)
        x64 = x.astype(np.float64)
        np.testing.assert_allclose(got["centred" + side], x64 - x64.mean(), rtol=0, atol=4e-6)


def cache_warnings(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "CacheWarning" in line]


@pytest.fixture(scope="module")
def warm_cache(tmp_path_factory):
    """A cache directory TWO_FUNCTIONS filled: two programs, their kernels."""
    directory = tmp_path_factory.mktemp("warm")
    check_two_functions(run_python(TWO_FUNCTIONS, directory, sim=True))
    return directory


def flip_constant(data: bytes) -> bytes:
    assert data.count(b"C0 = 2.0") == 1
    return data.replace(b"C0 = 2.0", b"C0 = 3.0")  # valid JSON: x * 3 + 1, silently, before


ENTRY_CORRUPTIONS = {
    "not UTF-8": lambda data: data[:30] + b"\xff\xfe" + data[30:],
    "truncated": lambda data: data[: len(data) // 2],
    "flipped constant": flip_constant,
}


@pytest.mark.sim_only(reason="runs fused functions in simulator subprocesses")
@pytest.mark.parametrize("corruption", ENTRY_CORRUPTIONS)
def test_corrupt_entries_warn_once_each_and_are_rebuilt(warm_cache, tmp_path, corruption):
    shutil.copytree(warm_cache, tmp_path, dirs_exist_ok=True)
    entries = sorted(tmp_path.glob("*/*.json"))
    if corruption == "flipped constant":  # the one entry holding the constant
        entries = [p for p in entries if b"C0 = 2.0" in p.read_bytes()]
    for path in entries:
        path.write_bytes(ENTRY_CORRUPTIONS[corruption](path.read_bytes()))
    done = run_python(TWO_FUNCTIONS, tmp_path, sim=True)
    check_two_functions(done)
    warned = cache_warnings(done.stderr)
    assert len(warned) == len(entries), warned  # one per corrupt entry, none per reader
    for path in entries:
        assert sum(str(path) in line for line in warned) == 1, (path, warned)
        assert _cache.read_entry(path).status == "ok"  # rebuilt
    again = run_python(TWO_FUNCTIONS, tmp_path, sim=True)
    check_two_functions(again)
    assert cache_warnings(again.stderr) == []


@pytest.mark.sim_only(reason="runs fused functions in a simulator subprocess")
def test_a_read_only_cache_warns_once_and_computes(tmp_path):
    code = (
        TWO_FUNCTIONS
        + """
    @tt.autotune(["a", "b"], key=["x"])
    def launch(x, *, config):
        return config

    assert launch(x) == "a"
    """
    )
    with read_only(tmp_path):
        done = run_python(code, tmp_path, sim=True)
    check_two_functions(done)
    (warned,) = cache_warnings(done.stderr)  # programs, kernels and autotune: one directory
    assert "cannot write" in warned
