"""The Grafana dashboard and Prometheus provisioning of docker/compose.yaml: every PromQL query names only
series an exporter defines (the CPU model's, the gateway's, TensorRT-LLM's backend's, Triton core's), and
the compose services wire Prometheus, the datasource and the dashboard together."""

from __future__ import annotations

import json
import re

import pytest
import yaml
from compose_env import interpolate
from dashboard_queries import DASHBOARD, dashboard_queries, label_values_metric, series_names
from repo_root import ROOT

from specpipe.openai.metrics import EXPORTED_SERIES as GATEWAY_SERIES
from specpipe.triton.models.scheduler_metrics import exported_series
from specpipe.trtllm.backend_metrics import TRITON_CORE_SERIES, TRTLLM_BACKEND_SERIES

DOCKER = ROOT / "docker"
EXPORTED = exported_series() | GATEWAY_SERIES | TRTLLM_BACKEND_SERIES | TRITON_CORE_SERIES


def test_series_names_are_parsed_out_of_promql():
    expr = (
        'histogram_quantile(0.9, sum by (le) (rate(specpipe:time_to_first_token_seconds_bucket{job=~"$source"}'
        '[$__rate_interval]))) / ignoring(position) group_left sum(nv_trt_llm_request_metrics{request_type="x y"})'
    )
    assert series_names(expr) == {"specpipe:time_to_first_token_seconds_bucket", "nv_trt_llm_request_metrics"}
    assert label_values_metric("label_values(specpipe:spec_decode_num_draft_tokens_total, job)") == {
        "specpipe:spec_decode_num_draft_tokens_total"
    }


def test_every_dashboard_query_names_exported_series_only():
    named = set()
    for expr in dashboard_queries():
        names = series_names(expr)
        assert names, expr
        assert names <= EXPORTED, f"{sorted(names - EXPORTED)} in {expr!r} is exported by no exporter"
        named |= names
    dashboard = json.loads(DASHBOARD.read_text())
    for variable in dashboard["templating"]["list"]:
        assert label_values_metric(variable["query"]["query"]) <= EXPORTED
    wanted = {
        "specpipe:spec_decode_num_accepted_tokens_per_pos_total",
        "specpipe:spec_decode_num_drafts_total",
        "specpipe:time_to_first_token_seconds_bucket",
        "specpipe:inter_token_latency_seconds_bucket",
        "specpipe:num_requests_waiting",
        "specpipe_request_errors_total",
        "specpipe_draft_length",
        "nv_trt_llm_request_metrics",
    }
    assert wanted <= named


def test_a_typo_in_a_query_is_caught():
    broken = "sum(rate(specpipe:spec_decode_num_acepted_tokens_total[5m]))"
    assert not series_names(broken) <= EXPORTED


def test_the_panels_operators_need_are_there():
    dashboard = json.loads(DASHBOARD.read_text())
    titles = {panel["title"] for panel in dashboard["panels"]}
    assert {
        "Throughput",
        "Time to first token",
        "Inter-token latency",
        "Acceptance",
        "Acceptance per draft position",
        "Chosen draft length against batch size",
        "Queue",
        "Errors",
    } <= titles
    quantiles = [e for e in dashboard_queries() if e.startswith("histogram_quantile(")]
    assert len(quantiles) == 6 and all("sum by (le)" in e for e in quantiles)
    assert {p["datasource"]["uid"] for p in dashboard["panels"]} == {"prometheus"}
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])


@pytest.fixture
def services():
    text = (DOCKER / "compose.yaml").read_text()
    return yaml.safe_load(
        interpolate(text, {"SPECPIPE_REPO": "/r", "SPECPIPE_ENGINES": "/e", "SPECPIPE_NAME": "tiny"})
    )["services"]


def test_prometheus_scrapes_triton_and_the_gateway(services):
    from specpipe.openai import CONTAINER_PORT

    config = yaml.safe_load((DOCKER / "prometheus" / "prometheus.yml").read_text())
    targets = {job["job_name"]: job["static_configs"][0]["targets"] for job in config["scrape_configs"]}
    assert targets == {"triton": ["triton:8002"], "gateway": [f"openai:{CONTAINER_PORT}"]}
    assert {"triton", "openai"} <= set(services)
    assert services["triton"]["ports"][-1].endswith(":8002")
    [mount] = services["prometheus"]["volumes"]
    assert (DOCKER / mount["source"]).resolve() == (DOCKER / "prometheus" / "prometheus.yml").resolve()
    assert f"--config.file={mount['target']}" in services["prometheus"]["command"]
    jobs = {job for expr in dashboard_queries() for job in re.findall(r'job="([^"]*)"', expr)}
    assert jobs == set(targets)  # the jobs the queries name are this file's


def test_grafana_is_provisioned_with_the_datasource_and_the_dashboard(services):
    grafana = services["grafana"]
    mounts = {v["target"]: (DOCKER / v["source"]).resolve() for v in grafana["volumes"]}
    provisioning, dashboards = mounts["/etc/grafana/provisioning"], mounts["/var/lib/grafana/dashboards"]
    [source] = yaml.safe_load((provisioning / "datasources" / "prometheus.yaml").read_text())["datasources"]
    assert (source["uid"], source["type"], source["url"]) == ("prometheus", "prometheus", "http://prometheus:9090")
    [provider] = yaml.safe_load((provisioning / "dashboards" / "specpipe.yaml").read_text())["providers"]
    assert provider["options"]["path"] == "/var/lib/grafana/dashboards"
    assert (dashboards / DASHBOARD.name).is_file()
    assert grafana["depends_on"] == ["prometheus"]
