"""bench/long.py (through bench/timing.py) runs and reports what it promises: a smoke run ends with the JSON summary and writes its plot;
the growth exponent gives known answers. No timing is asserted."""

import json

import pytest

from bench import long as bench
from bench import timing


def test_growth_exponent_of_known_powers():
    lengths = [512, 1024, 2048, 4096]
    assert bench.growth_exponent(lengths, [L * 1e-6 for L in lengths]) == pytest.approx(1.0)
    assert bench.growth_exponent(lengths, [L**2 * 1e-9 for L in lengths]) == pytest.approx(2.0)
    assert bench.growth_exponent([512], [1.0]) is None


@pytest.mark.slow
def test_smoke_run_ends_with_the_summary_and_writes_the_plot(tmp_path, capsys):
    timing.main(["long", "--smoke", "--threads", "1", "--plot", str(tmp_path / "long.png")])
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["largest_common_length"] == 32
    for kind in bench.LONG_KINDS:
        for key in ("speedup", "memory_ratio", "inference_speedup", "inference_memory_ratio"):
            assert summary[f"{kind}_{key}"] > 0
    assert set(summary["growth_exponent"]) == set(bench.SIDES)
    assert (tmp_path / "long.png").stat().st_size > 10_000
