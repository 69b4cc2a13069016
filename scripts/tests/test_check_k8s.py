"""scripts/check-k8s's cross-references, on objects as kustomize renders them."""

from check_k8s import configmap_config, cross_references


def statefulset(labels, service="peers", volumes=(), mounts=(), env=()):
    return {"kind": "StatefulSet", "metadata": {"name": "app"}, "spec": {
        "serviceName": service, "selector": {"matchLabels": labels},
        "template": {"metadata": {"labels": labels}, "spec": {
            "volumes": list(volumes),
            "containers": [{"name": "c", "ports": [{"name": "http", "containerPort": 8000}],
                            "volumeMounts": list(mounts), "env": list(env)}]}}}}


def service(name, selector, headless=False, target="http"):
    spec = {"selector": selector, "ports": [{"port": 80, "targetPort": target}]}
    if headless:
        spec["clusterIP"] = "None"
    return {"kind": "Service", "metadata": {"name": name}, "spec": spec}


def test_a_consistent_set_passes():
    labels = {"app": "modelmux"}
    docs = [statefulset(labels), service("peers", labels, headless=True), service("front", labels)]
    failures, listing = cross_references("k", docs)
    assert failures == []
    assert listing == "k: 3 objects: StatefulSet/app, Service/peers, Service/front"


def test_each_broken_reference_is_named():
    labels = {"app": "modelmux"}
    docs = [
        statefulset(labels, volumes=[{"name": "cfg", "configMap": {"name": "missing"}}],
                    mounts=[{"name": "nope", "mountPath": "/x"}],
                    env=[{"name": "A", "value": "$(B)"}, {"name": "B", "value": "1"}]),
        service("peers", labels),  # not headless
        service("front", {"app": "other"}, target="grpc"),
        service("front", labels),  # twice
    ]
    failures, _ = cross_references("k", docs)
    want = [
        "k: Service/front is defined twice",
        "k: statefulset/app: serviceName peers is not headless",
        "k: statefulset/app: volume cfg: ConfigMap missing is not defined",
        "k: statefulset/app container c: volumeMount nope has no volume",
        "k: statefulset/app container c: env A uses $(B) before it is defined",
    ]
    for w in want:
        assert w in failures
    # The second `front` replaced the first in the by-name index: its selector matches.
    assert not any("selector matches no pod template" in f for f in failures)


def test_the_configmap_config_is_found():
    docs = [{"kind": "ConfigMap", "metadata": {"name": "x"}, "data": {"other": "1"}},
            {"kind": "ConfigMap", "metadata": {"name": "y"}, "data": {"modelmux.yaml": "applications: []\n"}}]
    assert configmap_config(docs) == "applications: []\n"
    assert configmap_config(docs[:1]) is None
