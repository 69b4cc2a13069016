"""The benchmark reports' figures: each computed from inputs whose answer is known."""

import json

import pytest
from bench_agent_apis import report as agent_report
from bench_cache import table as cache_table
from bench_load import summary as load_summary
from bench_python import hit_ratio, p99_ratio, ratio
from bench_ray_peer import load_bound, slots_bound
from bench_serve import cost, loads_ratio, shares_of_bare
from bench_serve import summary as serve_summary
from bench_structured import report as structured_report
from flood_ids import verdict, within_bound
from soak_report import report as soak_report


def bench(rps, p99=1.0, errors=0):
    return {"requests_per_second": rps, "latency_ms": {"p50": p99 / 2, "p99": p99}, "errors": errors}


def test_cache_ratio_is_modelmux_over_the_locked_cache():
    mean = {}
    for case in ("one_thread", "two_threads_same_model", "two_threads_one_model_each"):
        mean["hit", case], mean["locked_cache", case], mean["bare_mutex_map", case] = 10.0, 40.0, 5.0
    mean["miss", "zero_cost_loader"] = 2500.0
    lines = cache_table(mean)
    assert lines[1].split()[:4] == ["hit/one_thread", "10.0ns", "40.0ns", "0.25"]
    assert lines[-1].split() == ["miss/zero_cost_loader", "2.50us"]


def test_serve_shares_and_costs():
    bare = [bench(1000), bench(2000)]
    assert shares_of_bare([bench(900), bench(1000)], bare) == [0.9, 0.5]
    assert cost(98.0, 100.0) == pytest.approx(0.02)
    assert cost(110.0, 100.0) == pytest.approx(-0.1)
    zipf = {"server": {"loads_per_10k_requests": 300.0}, "global_lru": {"loads_per_10k_requests": 200.0}}
    assert loads_ratio(zipf) == 1.5


def test_serve_summary_judges_the_median_round(tmp_path):
    def write(prefix, name, runs):
        for i, r in enumerate(runs, 1):
            (tmp_path / f"modelmux-bench-{prefix}-{name}-{i}.json").write_text(json.dumps(r))

    write("a", "bare", [bench(1000), bench(1000), bench(1000)])
    write("a", "nolog", [bench(800), bench(900), bench(950)])  # 80%, 90%, 95%: median 90% >= 86%
    write("c", "plain", [bench(100), bench(100), bench(100)])
    write("c", "traced", [bench(99), bench(97), bench(90)])  # median 97: cost 3% > 2%
    zipf = {"requests_per_second": 10.0, "latency_ms": {"p99": 1.0}, "errors": 0,
            "server": {"loads": 10.0, "loads_per_10k_requests": 100.0, "hit_ratio": 0.9},
            "global_lru": {"requests": 1000, "loads": 5, "loads_per_10k_requests": 50.0, "hit_ratio": 0.95}}
    (tmp_path / "modelmux-bench-deploys.txt").write_text("1.5\n60\n2\n")
    lines = serve_summary(zipf, zipf, str(tmp_path))
    nolog = next(line for line in lines if "no access log" in line and line.startswith("(a)"))
    assert "90% of bare  ✓ (≥ 86%)" in nolog and "(rounds 80%, 90%, 95%)" in nolog
    traced = next(line for line in lines if "tracing on" in line)
    assert "cost +3.0%  ✗ (> 2%)" in traced
    assert any("ratio 2.000" in line for line in lines)
    assert any("not run" in line and "Chromium open" in line for line in lines)
    deploys = lines[-1]
    assert "3, took max 60.00 ms, median 2.00 ms  ✗ (≤ 50 ms)" in deploys


def test_structured_targets():
    rows = {"constrained_1": {"ratio": 0.95, "free_tok_s": 100.0, "constrained_tok_s": 95.0},
            "constrained_8": {"ratio": 0.85, "free_tok_s": 400.0, "constrained_tok_s": 340.0},
            "scrape8": {"scrape_share": 0.02, "scrape_every_ms": 1000, "wall_s": 1.0, "wall_scraped_s": 1.01,
                        "ratio": 1.01, "scrape_bytes": 5000, "scrape_ms": 20.0}}
    _, missed = structured_report(rows)
    assert missed == ["constrained_8: 0.850 < 0.90", "scrape share 0.0200 > 0.01"]
    _, missed = structured_report({})
    assert missed == ["constrained_1 missing", "constrained_8 missing", "scrape8 missing"]


def test_flood_bound():
    assert within_bound(100.0, 132.0, 32.0)
    assert not within_bound(100.0, 132.5, 32.0)
    assert within_bound(100.0, 90.0, 32.0)
    ok, line = verdict(100.0, 140.0, 32.0, 5)
    assert not ok and line == "  [FAIL] 5 unknown ids: RSS 100.0 -> 140.0 MiB (+40.0 MiB; at most +32)"


def test_soak_fails_on_an_unanswered_request():
    r = {"requests": 10, "requests_per_second": 5.0, "failed": 1, "latency_ms": {"p99": 3.0}, "transport_errors": 0}
    assert soak_report(r)[0]
    assert not soak_report({**r, "transport_errors": 1})[0]


def test_python_bench_ratios():
    assert hit_ratio(25, 100) == 0.75
    assert hit_ratio(0, 0) == 1.0
    runs = {("modelmux", "one_model"): {"bench": bench(1000.0, 2.0)},
            ("ray", "one_model"): {"bench": bench(100.0, 20.0)}}
    assert ratio(runs, "modelmux", "ray", "one_model", "requests_per_second") == 10.0
    assert p99_ratio(runs, "modelmux", "ray", "one_model") == 0.1


def test_ray_peer_bounds():
    # 16 slots, one 100 ms load each at a time: 160 loads/s; with an optimal hit ratio of 0.9,
    # one request in ten loads: 1600 requests/s at most.
    assert slots_bound(0.9) == pytest.approx(1600.0)
    assert load_bound(8, 0.75) == pytest.approx(320.0)
    assert load_bound(8, 1.0) > 1e9  # no miss: no bound


def test_load_summary_reads_the_best_runs():
    stage = {"seconds": 0.5}
    result = {"fetch": stage, "load": {"seconds": 1.0}}
    local = [{"read": {"seconds": s}, "parse_decode": stage, "parse_optimize": stage, "load": stage}
             for s in (0.4, 0.25)]
    lines = load_summary(100 * 2**20, 0.25, 0.0001, [result, result, bench(10.0), bench(5.0), bench(1.0)], local)
    assert lines[1] == "(a) local disk, raw `cat`:     400 MiB/s (0.250 s)"
    assert lines[2].split()[:3] == ["modelmux", "read", "400"]
    assert "100000 MiB/s (0.001 s)" in lines[6]  # the GET's time is floored at the timer's 1 ms
    assert "( 50% of bare)" in lines[-2]


def test_agent_api_targets():
    rows = {"streams8": {"chat_tok_s": 100.0, "responses_tok_s": 99.0, "messages_tok_s": 97.0,
                         "responses_ratio": 0.99, "responses_ratio_ci": [0.97, 1.01], "messages_ratio": 0.97},
            "chain": {"chained_p50_ms": 31.5, "inline_p50_ms": 30.0, "added_p50_ms": 1.5, "read_p50_ms": 0.4}}
    lines, missed = agent_report(rows)
    assert missed == ["messages: 0.970 < 0.98", "chaining adds 1.50 ms > 1 ms"]
    assert "| 0.990 (95%: 0.970-1.010) | >= 0.98 | ✓ |" in lines[2]
    assert "| 0.970 (95%: 0.970-0.970) | >= 0.98 | ✗ |" in lines[3]
    _, missed = agent_report({})
    assert missed == ["streams8 missing", "chain missing"]
