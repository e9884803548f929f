"""The operations kit (`weir.ops`): the shipped Prometheus alert rules and Grafana dashboard read
only metrics weir exports, the rules file has the shape Prometheus loads, and each alert has its
runbook section in docs/operating.md.

The exported names come from the code: a member runs on the FakeBroker, handles records and
commits, and `WeirCollector` is asked for its metric families, whose sample names are then
derived from each family's type (a counter `x` exports `x_total`, a histogram `x` exports
`x_bucket`, `x_sum` and `x_count`). `promtool check rules` and `promtool test rules` run in
tests/integration/test_ops_promtool.py where promtool is built.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.fake_members import SETTINGS, TOPIC

from weir import GroupConsumer, Record
from weir.ops import FILES, path, read
from weir.ops.__main__ import main
from weir.prometheus import WeirCollector
from weir.testing import FakeBroker

ROOT = Path(__file__).resolve().parents[2]
OPERATING = ROOT / "docs" / "operating.md"

pytestmark = pytest.mark.timeout(60)


# -- what weir exports -----------------------------------------------------------------------------


def _sample_names(name: str, kind: str) -> set[str]:
    """The names a family's samples carry in the exposition format (prometheus_client's rules:
    a counter's samples end in `_total`, a histogram's in `_bucket`, `_sum`, `_count`)."""
    if kind == "counter":
        return {f"{name}_total"}
    if kind == "histogram":
        return {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
    return {name}


@pytest.fixture(scope="module")
def exported() -> set[str]:
    """Every sample name `WeirCollector` exports for a member that has handled records and
    committed on a FakeBroker (families without a sample, such as the stall watchdog's while
    nothing stalls, still count: their names come from their type)."""
    broker = FakeBroker()
    broker.create_topic(TOPIC, partitions=2)
    for i in range(20):
        broker.produce(TOPIC, key=f"k{i % 3}", value=str(i))
    done = threading.Event()
    seen: list[int] = []

    def handle(record: Record) -> None:
        seen.append(record.offset)
        if len(seen) == 20:
            done.set()

    consumer = GroupConsumer(handle, **SETTINGS, consumer_factory=broker.consumer_factory)
    with consumer:
        assert done.wait(30)
        broker.wait_until_committed(SETTINGS["group_id"], timeout=30)
        families = list(WeirCollector(consumer, member="m").collect())
    names: set[str] = set()
    for family in families:
        derived = _sample_names(family.name, family.type)
        actual = {s.name for s in family.samples}
        assert actual <= derived, (family.name, family.type, actual - derived)
        names |= derived
    # The collector ran over a real snapshot: the per-partition families have samples.
    assert any(s.name == "weir_partition_lag_records" for f in families for s in f.samples)
    return names


# -- the metric names a PromQL expression reads ----------------------------------------------------

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"' r"|'(?:[^'\\]|\\.)*'" r"|`[^`]*`")
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGE = re.compile(r"\[[^\[\]]*\]")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_OFFSET = re.compile(r"\boffset\s+-?[0-9a-z]+")
_NUMBER = re.compile(r"(?<![\w:])(?:0x[0-9a-fA-F]+|\d+(?:\.\d*)?(?:[eE][+-]?\d+)?)")
_IDENT = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
_KEYWORDS = {
    "and", "or", "unless", "bool", "by", "without", "on", "ignoring", "group_left",
    "group_right", "offset", "inf", "nan",
}  # fmt: skip


def metric_names(expr: str) -> set[str]:
    """The metric names `expr` selects: identifiers that are not a function or aggregation
    (followed by "("), a keyword, a label (in `{...}` or a `by (...)` list), a string, a
    duration or a number."""
    text = _STRING.sub(" ", expr)
    text = _MATCHERS.sub(" ", text)
    text = _RANGE.sub(" ", text)
    text = _GROUPING.sub(" ", text)
    text = _OFFSET.sub(" ", text)
    text = _NUMBER.sub(" ", text)
    names = set()
    for m in _IDENT.finditer(text):
        if text[m.end() :].lstrip().startswith("("):
            continue  # a function or an aggregation (its `by` list is gone already)
        if m.group().lower() in _KEYWORDS:
            continue
        names.add(m.group())
    return names


def test_metric_names_finds_the_selectors_and_nothing_else() -> None:
    expr = """
        sum by (group) (rate(weir_a_total{group=~"$group", x="rate(b)"}[5m] offset 1h))
        / on (group) group_left (member) max without (topic) (weir_b)
        > 0.01 and histogram_quantile(0.99, sum by (le) (rate(c_bucket[$__rate_interval]))) > 1e3
        or vector(1) unless weir_c:recorded >bool 2
    """
    assert metric_names(expr) == {"weir_a_total", "weir_b", "c_bucket", "weir_c:recorded"}


def variable_metric_names(query: str) -> set[str]:
    """The metric names a Grafana Prometheus variable's query reads: `label_values(expr, label)`,
    `label_values(label)` (none), `query_result(expr)`, `metrics(regex)` (none)."""
    m = re.fullmatch(r"\s*label_values\((.*),\s*\w+\s*\)\s*", query, re.S)
    if m:
        return metric_names(m.group(1))
    if re.fullmatch(r"\s*(?:label_values\(\s*\w+\s*\)|metrics\(.*\))\s*", query, re.S):
        return set()
    m = re.fullmatch(r"\s*query_result\((.*)\)\s*", query, re.S)
    assert m, f"a variable query this test cannot read: {query!r}"
    return metric_names(m.group(1))


# -- the alert rules ---------------------------------------------------------------------------

_DURATION = re.compile(r"(?:\d+(?:ms|[smhdwy]))+")
_GROUP_KEYS = {"name", "rules", "interval", "limit", "query_offset", "labels"}
_ALERT_KEYS = {"alert", "expr", "for", "keep_firing_for", "labels", "annotations"}


def rule_problems(doc: Any) -> list[str]:
    """What Prometheus would refuse in a rule file, or an operator would miss: the rule file
    format (groups of rules with alert, expr, for, labels, annotations; no unknown key), plus a
    severity, a summary, a description and a runbook on every alert."""
    problems: list[str] = []
    if not isinstance(doc, dict) or set(doc) != {"groups"} or not isinstance(doc["groups"], list):
        return ["the file must be a mapping with one key, groups: a list"]
    group_names: set[str] = set()
    alerts: set[str] = set()
    for g in doc["groups"]:
        if not isinstance(g, dict) or not isinstance(g.get("name"), str):
            problems.append(f"a group without a name: {g!r}")
            continue
        if g["name"] in group_names:
            problems.append(f"group {g['name']} twice")
        group_names.add(g["name"])
        problems += [f"group {g['name']}: unknown key {k}" for k in set(g) - _GROUP_KEYS]
        if not isinstance(g.get("rules"), list) or not g["rules"]:
            problems.append(f"group {g['name']}: no rules")
            continue
        for r in g["rules"]:
            name = r.get("alert") if isinstance(r, dict) else None
            if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
                problems.append(f"group {g['name']}: a rule without a valid alert name: {r!r}")
                continue
            if name in alerts:
                problems.append(f"{name} twice")
            alerts.add(name)
            problems += [f"{name}: unknown key {k}" for k in set(r) - _ALERT_KEYS]
            if not isinstance(r.get("expr"), str) or not r["expr"].strip():
                problems.append(f"{name}: no expr")
            if not isinstance(r.get("for"), str) or not _DURATION.fullmatch(r["for"]):
                problems.append(f"{name}: for must be a duration such as 5m, got {r.get('for')!r}")
            labels = r.get("labels")
            severity = labels.get("severity") if isinstance(labels, dict) else None
            if severity not in ("warning", "critical"):
                problems.append(f"{name}: labels.severity must be warning or critical")
            elif not all(isinstance(v, str) for v in labels.values()):
                problems.append(f"{name}: label values must be strings")
            notes = r.get("annotations")
            if not isinstance(notes, dict) or not all(isinstance(v, str) for v in notes.values()):
                problems.append(f"{name}: annotations must map names to strings")
                continue
            problems += [
                f"{name}: no {k} annotation"
                for k in ("summary", "description", "runbook")
                if not notes.get(k)
            ]
    return problems


def _alert_rules(doc: Any) -> Iterator[dict[str, Any]]:
    for g in doc["groups"]:
        yield from g["rules"]


def unknown_metrics(exprs: dict[str, str], exported: set[str]) -> dict[str, set[str]]:
    """Per expression (by its name), the metric names it reads that weir does not export; an
    expression that reads no metric at all is reported too (the check would be empty)."""
    unknown: dict[str, set[str]] = {}
    for where, expr in exprs.items():
        names = metric_names(expr)
        if not names:
            unknown[where] = {"<no metric name found>"}
        elif names - exported:
            unknown[where] = names - exported
    return unknown


def _rule_exprs(text: str) -> dict[str, str]:
    return {r["alert"]: r["expr"] for r in _alert_rules(yaml.safe_load(text))}


def test_the_rules_file_has_the_shape_prometheus_loads() -> None:
    doc = yaml.safe_load(read("alerts"))
    assert rule_problems(doc) == []
    names = {r["alert"] for r in _alert_rules(doc)}
    # The alerts issue 28 asked for, each by the metric it watches.
    assert {
        "WeirLagGrowing",
        "WeirOldestUnfinishedRecordOld",
        "WeirWatermarkStalled",
        "WeirPartitionBlocked",
        "WeirDeadLetterRate",
        "WeirRebalanceStorm",
        "WeirCommitFailures",
    } <= names


def test_the_shape_check_refuses_what_prometheus_would() -> None:
    good = yaml.safe_load(read("alerts"))
    rule = good["groups"][0]["rules"][0]
    cases: list[tuple[dict[str, Any], str]] = [
        ({**rule, "for": "15 minutes"}, "for must be a duration"),
        ({**rule, "expresion": rule["expr"]}, "unknown key expresion"),
        ({k: v for k, v in rule.items() if k != "expr"}, "no expr"),
        ({**rule, "labels": {"severity": "page"}}, "labels.severity"),
        ({**rule, "annotations": {"summary": "s", "description": "d"}}, "no runbook"),
    ]
    for bad_rule, message in cases:
        doc = {"groups": [{"name": "weir", "rules": [bad_rule]}]}
        assert any(message in p for p in rule_problems(doc)), (message, rule_problems(doc))
    twice = {"groups": [{"name": "weir", "rules": [rule, rule]}]}
    assert rule_problems(twice) == [f"{rule['alert']} twice"]


def test_every_alert_reads_only_metrics_weir_exports(exported: set[str]) -> None:
    assert unknown_metrics(_rule_exprs(read("alerts")), exported) == {}


def test_a_misspelled_metric_in_an_alert_is_caught(exported: set[str]) -> None:
    planted = read("alerts").replace("weir_partition_blocked", "weir_partition_blokced", 1)
    assert unknown_metrics(_rule_exprs(planted), exported) == {
        "WeirPartitionBlocked": {"weir_partition_blokced"}
    }
    # A counter named without the `_total` its samples carry is caught as well.
    planted = read("alerts").replace("weir_rebalances_total", "weir_rebalances", 1)
    assert unknown_metrics(_rule_exprs(planted), exported) == {
        "WeirRebalanceStorm": {"weir_rebalances"}
    }


def _anchors(markdown: str) -> set[str]:
    """GitHub's anchors for the headings of a Markdown page."""
    anchors = set()
    for line in markdown.splitlines():
        m = re.match(r"#{1,6}\s+(.*)", line)
        if m:
            text = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower())
            anchors.add(text.replace(" ", "-"))
    return anchors


def test_every_alert_has_its_runbook_section() -> None:
    anchors = _anchors(OPERATING.read_text())
    for r in _alert_rules(yaml.safe_load(read("alerts"))):
        page, _, anchor = r["annotations"]["runbook"].partition("#")
        assert page == "docs/operating.md", r["alert"]
        assert anchor == r["alert"].lower(), r["alert"]
        assert anchor in anchors, f"docs/operating.md has no section {r['alert']}"


# -- the dashboard -------------------------------------------------------------------------------

_GRAFANA_VARIABLES = {"__rate_interval", "__interval", "__range", "__interval_ms", "__range_s"}


def _panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for p in panels:
        yield p
        yield from _panels(p.get("panels", []))


def dashboard_exprs(dashboard: dict[str, Any]) -> dict[str, str]:
    """Every query of every panel, by panel title and refId."""
    exprs = {}
    for p in _panels(dashboard["panels"]):
        if p["type"] == "row":
            continue
        assert p.get("targets"), f"panel {p['title']!r} has no query"
        for t in p["targets"]:
            exprs[f"{p['title']} {t['refId']}"] = t["expr"]
    return exprs


def test_every_dashboard_query_reads_only_metrics_weir_exports(exported: set[str]) -> None:
    dashboard = json.loads(read("dashboard"))
    assert unknown_metrics(dashboard_exprs(dashboard), exported) == {}
    variables = dashboard["templating"]["list"]
    for v in variables:
        if v["type"] == "query":
            names = variable_metric_names(v["query"]["query"])
            assert names and names <= exported, (v["name"], names - exported)


def test_a_misspelled_metric_in_a_panel_is_caught(exported: set[str]) -> None:
    text = read("dashboard")
    planted = json.loads(text.replace("weir_handler_latency_seconds_bucket", "weir_handler_l", 1))
    unknown = unknown_metrics(dashboard_exprs(planted), exported)
    assert unknown == {"Handler latency A": {"weir_handler_l"}}


def test_the_dashboard_is_one_grafana_can_import() -> None:
    dashboard = json.loads(read("dashboard"))
    panels = list(_panels(dashboard["panels"]))
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    defined = {v["name"] for v in dashboard["templating"]["list"]}
    for p in panels:
        pos = p["gridPos"]
        assert pos["x"] >= 0 and pos["x"] + pos["w"] <= 24 and pos["h"] > 0, p["title"]
        if p["type"] == "row":
            continue
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        assert p.get("description"), f"panel {p['title']!r} says nothing of what it shows"
        for t in p["targets"]:
            used = set(re.findall(r"\$\{?(\w+)", t["expr"]))
            assert used <= defined | _GRAFANA_VARIABLES, (p["title"], used - defined)


# -- python -m weir.ops ----------------------------------------------------------------------------


def test_the_files_ship_in_the_package() -> None:
    for name, file in FILES.items():
        assert path(name).name == file
        assert path(name).is_file()
    with pytest.raises(ValueError, match="no ops file 'grafana': one of alerts, dashboard"):
        path("grafana")


def test_python_m_weir_ops_lists_and_prints_them(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 0
    listing = capsys.readouterr().out
    assert "alerts" in listing and str(path("alerts")) in listing
    assert str(path("dashboard")) in listing
    assert main(["alerts"]) == 0
    assert capsys.readouterr().out == read("alerts")
    assert main(["dashboard"]) == 0
    assert json.loads(capsys.readouterr().out)["uid"] == "kafka-weir"
    assert main(["grafana"]) == 2
    assert capsys.readouterr().err == "usage: python -m weir.ops [alerts|dashboard]\n"
