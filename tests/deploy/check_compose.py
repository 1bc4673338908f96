#!/usr/bin/python3
"""Parses deploy/compose.yaml and checks the stack: the three services, attnserve built
from the top-level Dockerfile with its ports, every mounted file present in the repo,
Prometheus scraping the attnserve service, Grafana provisioned with the dashboard. And
that deploy/compose.host.yaml (the same stack on host networking, which compose_test
runs) has the same services, images, build, mount points and grace period, and no
published ports.

usage: check_compose.py REPO_ROOT
"""
import os
import sys

import yaml

ROOT = sys.argv[1]
DEPLOY = os.path.join(ROOT, "deploy")
problems = []


def check(condition, what):
    if not condition:
        problems.append(what)


compose = yaml.safe_load(open(os.path.join(DEPLOY, "compose.yaml")))
services = compose["services"]
check(set(services) >= {"attnserve", "prometheus", "grafana"}, "missing services")
attnserve = services["attnserve"]
check(os.path.isfile(os.path.join(DEPLOY, attnserve["build"]["context"],
                                  attnserve["build"]["dockerfile"])), "Dockerfile not found")
check({"50051:50051", "8000:8000", "8080:8080"} <= set(attnserve["ports"]),
      "attnserve ports (gRPC, KServe HTTP, metrics)")
check("--http_port=8000" in attnserve["command"], "attnserve --http_port")
mounted = 0
for name, service in services.items():
    for volume in service.get("volumes", []):
        source = volume.split(":")[0]
        if source.startswith("."):
            mounted += 1
            check(os.path.isfile(os.path.join(DEPLOY, source)), f"{name}: {source} missing")
prometheus = yaml.safe_load(open(os.path.join(DEPLOY, "prometheus", "prometheus.yml")))
targets = [t for job in prometheus["scrape_configs"] for c in job["static_configs"]
           for t in c["targets"]]
check("attnserve:8080" in targets, "prometheus.yml does not scrape attnserve:8080")
datasources = yaml.safe_load(open(os.path.join(
    DEPLOY, "grafana", "provisioning", "datasources", "prometheus.yml")))
check(datasources["datasources"][0]["url"] == "http://prometheus:9090", "datasource URL")
host = yaml.safe_load(open(os.path.join(DEPLOY, "compose.host.yaml")))["services"]
check(set(host) == set(services), "compose.host.yaml: not the same services")
for name, service in services.items():
    other = host.get(name, {})
    check(other.get("network_mode") == "host", f"compose.host.yaml: {name} not on host")
    check("ports" not in other, f"compose.host.yaml: {name} publishes ports")
    for key in ("image", "build", "stop_grace_period", "depends_on"):
        check(other.get(key) == service.get(key), f"compose.host.yaml: {name}.{key} differs")
    check(sorted(v.split(":")[1] for v in other.get("volumes", [])) ==
          sorted(v.split(":")[1] for v in service.get("volumes", [])),
          f"compose.host.yaml: {name} mounts differ")
    for volume in other.get("volumes", []):
        check(os.path.isfile(os.path.join(DEPLOY, volume.split(":")[0])),
              f"compose.host.yaml: {volume.split(':')[0]} missing")
local = yaml.safe_load(open(os.path.join(DEPLOY, "prometheus", "prometheus-local.yml")))
check([t for job in local["scrape_configs"] for c in job["static_configs"]
       for t in c["targets"]] == ["127.0.0.1:8080"], "prometheus-local.yml target")
host_source = yaml.safe_load(open(os.path.join(
    DEPLOY, "grafana", "provisioning", "datasources", "prometheus-host.yml")))
check(host_source["datasources"][0]["url"] == "http://127.0.0.1:9090", "host datasource URL")
for problem in problems:
    print("check_compose:", problem)
print(f"check_compose: {len(services)} services, {mounted} mounted files, "
      f"{len(problems)} problems")
sys.exit(1 if problems else 0)
