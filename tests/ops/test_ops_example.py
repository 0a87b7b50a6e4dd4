"""The ops example runs every op on device arrays and matches NumPy."""

from helpers import load_example


def test_ops_demo_matches_numpy(capsys):
    example = load_example("ops_demo")
    assert example.run(rows=3, cols=40, show=True) < 1e-5
    table = capsys.readouterr().out
    for name in ("softmax", "cross_entropy", "transpose", "argmin"):
        assert f"\n{name} " in table
