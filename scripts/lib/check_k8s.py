"""scripts/check-k8s's checks of what the schemas cannot see, on the rendered manifests (needs
PyYAML, which kubernetes-validate brings into the virtualenv).

  check_k8s.py cross-references NAME... -- RENDERED...
      selectors match pod templates; named ports, volumes, ConfigMaps, Secrets,
      ServiceAccounts and $(VAR) references exist; a StatefulSet's serviceName is a headless
      Service that selects its pods. Prints each kustomization's objects; exits 1 naming each
      failure.
  check_k8s.py configmap RENDERED OUT
      writes the modelmux.yaml of the ConfigMap that holds one to OUT"""

from __future__ import annotations

import re
import sys
from typing import Any

# Secrets the user creates before applying (deploy/k8s/README.md), not rendered here.
EXTERNAL_SECRETS = {"modelmux-admin-token"}


def matches(selector, labels):
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def cross_references(name: str, docs: list[dict[str, Any]]) -> tuple[list[str], str]:
    """(the failures of one kustomization's rendered objects, the line listing them)."""
    failures = []

    def fail(msg):
        failures.append(f"{name}: {msg}")

    by_kind = {}
    for d in docs:
        by_kind.setdefault(d["kind"], {})[d["metadata"]["name"]] = d
    seen = set()
    for d in docs:
        key = (d["kind"], d["metadata"]["name"])
        if key in seen:
            fail(f"{key[0]}/{key[1]} is defined twice")
        seen.add(key)

    workloads = []  # (what, template labels, pod spec)
    for kind in ("StatefulSet", "Deployment", "DaemonSet"):
        for wname, w in by_kind.get(kind, {}).items():
            what = f"{kind.lower()}/{wname}"
            spec = w["spec"]
            tlabels = spec["template"]["metadata"].get("labels", {})
            if not matches(spec["selector"].get("matchLabels", {}), tlabels):
                fail(f"{what}: selector.matchLabels does not match the pod template's labels")
            pod = spec["template"]["spec"]
            workloads.append((what, tlabels, pod))
            if kind == "StatefulSet":
                svc = by_kind.get("Service", {}).get(spec.get("serviceName"))
                if svc is None:
                    fail(f"{what}: serviceName {spec.get('serviceName')!r} is no Service here")
                elif svc["spec"].get("clusterIP") != "None":
                    fail(f"{what}: serviceName {svc['metadata']['name']} is not headless")
                elif not matches(svc["spec"].get("selector"), tlabels):
                    fail(f"{what}: Service {svc['metadata']['name']} does not select its pods")
            sa = pod.get("serviceAccountName")
            if sa and sa not in by_kind.get("ServiceAccount", {}):
                fail(f"{what}: ServiceAccount {sa} is not defined")
            volumes = {v["name"]: v for v in pod.get("volumes", [])}
            volumes.update({c["metadata"]["name"]: c for c in spec.get("volumeClaimTemplates", [])})
            for v in pod.get("volumes", []):
                cm = v.get("configMap", {}).get("name")
                if cm and cm not in by_kind.get("ConfigMap", {}):
                    fail(f"{what}: volume {v['name']}: ConfigMap {cm} is not defined")
                sec = v.get("secret", {}).get("secretName")
                if sec and sec not in by_kind.get("Secret", {}) and sec not in EXTERNAL_SECRETS:
                    fail(f"{what}: volume {v['name']}: Secret {sec} is not defined")
            for c in pod.get("containers", []) + pod.get("initContainers", []):
                cwhat = f"{what} container {c['name']}"
                ports = {p["name"] for p in c.get("ports", []) if "name" in p}
                for m in c.get("volumeMounts", []):
                    if m["name"] not in volumes:
                        fail(f"{cwhat}: volumeMount {m['name']} has no volume")
                for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                    p = c.get(probe) or {}
                    for handler in ("httpGet", "tcpSocket", "grpc"):
                        port = (p.get(handler) or {}).get("port")
                        if isinstance(port, str) and port not in ports:
                            fail(f"{cwhat}: {probe} uses port {port!r}, which it does not name")
                defined = set()
                for e in c.get("env", []):
                    for ref in re.findall(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", str(e.get("value", ""))):
                        if ref not in defined:
                            fail(f"{cwhat}: env {e['name']} uses $({ref}) before it is defined")
                    defined.add(e["name"])
                    src = e.get("valueFrom", {})
                    cm = src.get("configMapKeyRef", {}).get("name")
                    if cm and cm not in by_kind.get("ConfigMap", {}):
                        fail(f"{cwhat}: env {e['name']}: ConfigMap {cm} is not defined")
                    sec = src.get("secretKeyRef", {}).get("name")
                    if sec and sec not in by_kind.get("Secret", {}) and sec not in EXTERNAL_SECRETS:
                        fail(f"{cwhat}: env {e['name']}: Secret {sec} is not defined")
                for arg in c.get("command", []) + c.get("args", []):
                    for ref in re.findall(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", arg):
                        if ref not in defined:
                            fail(f"{cwhat}: {arg!r} uses $({ref}), which is not in its env")

    def selected(selector):
        return [w for w in workloads if matches(selector, w[1])]

    def named_ports(pods):
        return {p["name"] for _, _, pod in pods for c in pod["containers"] for p in c.get("ports", []) if "name" in p}

    for sname, s in by_kind.get("Service", {}).items():
        pods = selected(s["spec"].get("selector", {}))
        if not pods:
            fail(f"service/{sname}: its selector matches no pod template")
        for p in s["spec"].get("ports", []):
            target = p.get("targetPort")
            if isinstance(target, str) and target not in named_ports(pods):
                fail(f"service/{sname}: targetPort {target!r} is no named port of its pods")
    for pname in by_kind.get("PodDisruptionBudget", {}):
        sel = by_kind["PodDisruptionBudget"][pname]["spec"]["selector"].get("matchLabels", {})
        if not selected(sel):
            fail(f"poddisruptionbudget/{pname}: its selector matches no pod template")
    for nname, n in by_kind.get("NetworkPolicy", {}).items():
        pods = selected(n["spec"]["podSelector"].get("matchLabels", {}))
        if not pods:
            fail(f"networkpolicy/{nname}: its podSelector matches no pod template")
        for rule in n["spec"].get("ingress", []):
            for peer in rule.get("from", []):
                sel = peer.get("podSelector", {}).get("matchLabels")
                if sel and not selected(sel):
                    fail(f"networkpolicy/{nname}: a podSelector in `from` matches no pod template")
            for p in rule.get("ports", []):
                if isinstance(p.get("port"), str) and p["port"] not in named_ports(pods):
                    fail(f"networkpolicy/{nname}: port {p['port']!r} is no named port of its pods")
    listing = ", ".join(f"{d['kind']}/{d['metadata']['name']}" for d in docs)
    return failures, f"{name}: {len(docs)} objects: {listing}"


def configmap_config(docs: list[dict[str, Any]]) -> str | None:
    for d in docs:
        if d and d["kind"] == "ConfigMap" and "modelmux.yaml" in d.get("data", {}):
            text: str = d["data"]["modelmux.yaml"]
            return text
    return None


def _load(path: str) -> list[dict[str, Any]]:
    import yaml

    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d]


def main(argv: list[str]) -> int:
    if argv[:1] == ["cross-references"] and "--" in argv:
        args = argv[1:]
        sep = args.index("--")
        names, files = args[:sep], args[sep + 1 :]
        failures = []
        for name, path in zip(names, files, strict=True):
            found, listing = cross_references(name, _load(path))
            failures += found
            print(listing)
        for f in failures:
            print(f"error: {f}", file=sys.stderr)
        return 1 if failures else 0
    if argv[:1] == ["configmap"] and len(argv) == 3:
        text = configmap_config(_load(argv[1]))
        if text is None:
            sys.exit("error: no ConfigMap with a modelmux.yaml in the rendered manifests")
        with open(argv[2], "w") as f:
            f.write(text)
        return 0
    sys.exit(__doc__)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
