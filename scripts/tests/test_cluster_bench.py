"""scripts/bench_cluster.py's figures and parsers."""

import json

from cluster_bench.client import metric_sum
from cluster_bench.report import pct
from cluster_bench.servers import available_remotes, config_yaml, remote_with
from cluster_bench.watch import NodeWatch


def test_pct_is_nearest_rank():
    values = [float(v) for v in range(1, 101)]
    assert pct(values, 0.5) == 50.0
    # The 99th of 100 values, not the largest (round(99.5) is 100: it read the maximum).
    assert pct(values, 0.99) == 99.0
    assert pct(values, 0.07) == 7.0
    assert pct(values, 0.995) == 100.0
    assert pct(values, 0.0) == 1.0
    assert pct([3.0], 0.99) == 3.0
    assert pct([], 0.5) is None


def test_metric_sum_adds_every_series():
    page = "\n".join([
        "# HELP modelmux_model_loads_total Loads.",
        'modelmux_model_loads_total{deployment="a"} 3',
        'modelmux_model_loads_total{deployment="b",x="}"} 4.5',
        "modelmux_model_loads_total_other 100",
        "etcd_mvcc_put_total 7",
    ])
    assert metric_sum(page, "modelmux_model_loads_total") == 7.5
    assert metric_sum(page, "etcd_mvcc_put_total") == 7.0
    assert metric_sum(page, "absent") == 0.0


def doc(*replicas):
    return {"applications": [{"deployments": [{"replicas": list(replicas)}]}]}


def test_remote_replicas_as_an_ingress_lists_them():
    listing = doc({"remote": True, "available": True, "node": "n1", "loaded": [{"id": "m1"}], "loading": ["m2"]},
                  {"remote": False, "available": True, "loaded": [{"id": "m3"}]})
    assert remote_with(listing, "m1")
    assert not remote_with(listing, "m2")
    assert remote_with(listing, "m2", ("loaded", "loading"))
    assert not remote_with(listing, "m3")  # the ingress's own replica
    assert available_remotes(listing) == 1 and available_remotes(listing, "n2") == 0


def test_node_watch_times_a_node_going_away():
    w = NodeWatch("n1", 10.0)
    up = json.dumps(doc({"remote": True, "available": True, "node": "n1"})).encode()
    down = json.dumps(doc({"remote": True, "available": False, "node": "n1"})).encode()
    gone = json.dumps(doc()).encode()
    assert not w(up, 10.5)
    assert not w(down, 11.0)
    assert not w(up, 11.5)  # it came back: a flap
    assert not w(down, 12.0)
    assert w(gone, 13.0)
    assert (w.first, w.unavailable, w.flaps, w.gone) == (1.0, 2.0, 1, 3.0)


def test_config_names_the_cluster_only_in_cluster_mode():
    assert "cluster:" in config_yaml(2, True)
    single = config_yaml(8, False)
    assert "cluster:" not in single and "num_replicas: 8" in single
