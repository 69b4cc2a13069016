"""The figures every report uses."""

import pytest
from benchutil import cpu_model, median_high, median_low, nearest_rank, simd_level


def test_medians_of_an_odd_count_are_the_middle():
    assert median_high([3, 1, 2]) == median_low([3, 1, 2]) == 2


def test_medians_of_an_even_count_take_one_middle_each():
    assert median_high([4, 1, 3, 2]) == 3
    assert median_low([4, 1, 3, 2]) == 2
    assert median_low(iter([10.0, 20.0])) == 10.0


def test_nearest_rank_percentiles():
    values = list(range(1, 101))  # 1..100
    assert nearest_rank(values, 0.5) == 50
    assert nearest_rank(values, 0.9) == 90
    assert nearest_rank(values, 0.99) == 99
    assert nearest_rank(values, 1.0) == 100
    assert nearest_rank(values, 0.0) == 1  # at least the first
    assert nearest_rank([5.0, 1.0], 0.5) == 1.0
    assert nearest_rank([], 0.5) == 0.0


def test_the_machine_is_named_from_cpuinfo():
    lines = ["processor\t: 0\n", "model name\t: Some CPU @ 2.0GHz\n", "flags\t: fpu avx2 fma\n"]
    assert cpu_model(lines) == "Some CPU @ 2.0GHz"
    assert cpu_model(["processor\t: 0\n"]) == "?"
    assert simd_level("".join(lines)) == "AVX2"
    assert simd_level("flags: avx2 avx512f avx512_vnni") == "AVX-512 VNNI"
    assert simd_level("flags: sse4_2", none="baseline") == "baseline"


@pytest.mark.parametrize("p", [0.25, 0.5, 0.75])
def test_nearest_rank_is_a_member(p):
    values = [0.3, 0.1, 0.7, 0.2]
    assert nearest_rank(values, p) in values
