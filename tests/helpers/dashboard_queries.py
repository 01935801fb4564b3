"""The PromQL queries of the shipped Grafana dashboard and the series each one names."""

from __future__ import annotations

import json
import re

from repo_root import ROOT

DASHBOARD = ROOT / "docker" / "grafana" / "dashboards" / "specpipe.json"

#: PromQL words that are not series: aggregations, functions, operators, modifiers (Prometheus' lexer).
KEYWORDS = {
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "offset",
    "and",
    "or",
    "unless",
    "sum",
    "avg",
    "min",
    "max",
    "count",
    "topk",
    "bottomk",
    "quantile",
    "stddev",
    "stdvar",
    "inf",
    "nan",
}
_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


def series_names(expr: str) -> set[str]:
    """The metric names an expression selects: identifiers that are not functions (followed by ``(``),
    keywords, label names (inside ``{}`` or a ``by``/``on``/... list), ranges or strings."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # strings (label values)
    expr = re.sub(r"\{[^}]*\}", "", expr)  # label matchers
    expr = re.sub(r"\[[^\]]*\]", "", expr)  # ranges ([$__rate_interval])
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", r"\1", expr)  # label lists
    expr = re.sub(r"\$\w+", "", expr)
    names = set()
    for match in _NAME.finditer(expr):
        rest = expr[match.end() :].lstrip()
        if match.group() not in KEYWORDS and not rest.startswith("("):
            names.add(match.group())
    return names


def label_values_metric(query: str) -> set[str]:
    """The metric of a Grafana ``label_values(metric, label)`` variable query."""
    match = re.fullmatch(r"label_values\(\s*([^,]+?)\s*,\s*\w+\s*\)", query.strip())
    assert match, f"unexpected variable query {query!r}"
    return series_names(match.group(1))


def dashboard_queries() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel.get("targets", [])]
    assert exprs and all(exprs)
    return exprs
