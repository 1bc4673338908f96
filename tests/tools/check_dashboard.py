#!/usr/bin/python3
"""Checks a Grafana dashboard against a live /metrics: the JSON parses, every panel has
PromQL, and every metric an expression names is one the server exports.

usage: check_dashboard.py DASHBOARD.json METRICS_TEXT_FILE
"""
import json
import re
import sys

# PromQL words that look like identifiers but are not metric names.
KEYWORDS = {
    "sum", "by", "without", "rate", "increase", "irate", "histogram_quantile", "max",
    "min", "avg", "count", "avg_over_time", "max_over_time", "label_values", "le",
    "and", "or", "unless", "on", "ignoring", "group_left", "group_right", "bool",
    "offset", "topk", "bottomk", "abs", "clamp_min", "clamp_max",
}


def exported_names(metrics_text):
    names = set()
    for line in metrics_text.splitlines():
        if line and not line.startswith("#"):
            names.add(re.match(r"[a-zA-Z_:][a-zA-Z0-9_:]*", line).group(0))
    return names


def metric_words(expr):
    # Drop label matchers and strings, template variables and range selectors.
    expr = re.sub(r'"[^"]*"', "", expr)
    expr = re.sub(r"\{[^}]*\}", "", expr)
    expr = re.sub(r"\[[^\]]*\]", "", expr)
    expr = re.sub(r"\$\w+", "", expr)
    expr = re.sub(r"\b(by|without|on|ignoring)\s*\([^)]*\)", "", expr)
    expr = re.sub(r"\b\d+(\.\d+)?([eE][+-]?\d+)?\b", "", expr)
    words = re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", expr)
    return [w for w in words if w not in KEYWORDS]


def main():
    dashboard = json.load(open(sys.argv[1]))
    exported = exported_names(open(sys.argv[2]).read())
    problems, checked = [], 0
    for panel in dashboard["panels"]:
        targets = panel.get("targets", [])
        if not targets:
            problems.append(f"panel {panel['title']!r} has no query")
        for target in targets:
            words = metric_words(target["expr"])
            if not words:
                problems.append(f"panel {panel['title']!r}: no metric in {target['expr']!r}")
            for word in words:
                checked += 1
                if word not in exported:
                    problems.append(f"panel {panel['title']!r}: {word} is not exported")
    variables = [v["name"] for v in dashboard["templating"]["list"]]
    if "datasource" not in variables:
        problems.append("no datasource variable")
    for problem in problems:
        print("check_dashboard:", problem)
    print(f"check_dashboard: {len(dashboard['panels'])} panels, {checked} metric references,"
          f" {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
