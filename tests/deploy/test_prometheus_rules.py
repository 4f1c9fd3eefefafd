"""The alerting and recording rules in deploy/prometheus/rules: promtool
accepts them and their unit tests pass, they read only series the coordinator
exports, every alert links to a dashboard panel that plots what it alerts on,
and every alert has a unit test that fires it and one that must not."""
import json
import os
import re
import shutil
import subprocess
import sys
import unittest

from deploy_test_env import missing_tool

import yaml

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
RULES = os.path.join(ROOT, "deploy", "prometheus", "rules")
RULE_FILES = [os.path.join(RULES, f) for f in ("loom.rules.yml", "loom-site.rules.yml")]
RULE_TESTS = os.path.join(RULES, "tests", "loom.rules.test.yml")
DASHBOARD = os.path.join(ROOT, "deploy", "grafana", "loom-dashboard.json")
METRICS_CC = os.path.join(ROOT, "coordinator", "service", "metrics.cc")
# [moe] The expert-load families live beside it, on the same registry.
MOE_METRICS_CC = os.path.join(ROOT, "coordinator", "service", "moe_metrics.cc")
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"
# Series Prometheus adds itself, not the coordinator.
PROMETHEUS_SERIES = {"up"}


def rules():
    for path in RULE_FILES:
        with open(path) as f:
            for group in yaml.safe_load(f)["groups"]:
                yield from group["rules"]


def series_in(expr):
    """Metric names an expression reads (loom_* series and recording rules)."""
    return set(re.findall(r"\b(loom:[a-z0-9_:]+|loom_[a-z0-9_]+|up)\b(?![a-z0-9_:]*\()", expr))


def exported_series():
    names = set()
    for path in (METRICS_CC, MOE_METRICS_CC):
        with open(path) as f:
            names |= set(re.findall(r'"(loom_[a-z0-9_]+)"', f.read()))
    return names


class PrometheusRulesTest(unittest.TestCase):
    def test_promtool_checks_the_rules(self):
        out = subprocess.run([PROMTOOL, "check", "rules", *RULE_FILES], capture_output=True, text=True)
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr)

    def test_promtool_unit_tests_pass(self):
        out = subprocess.run([PROMTOOL, "test", "rules", RULE_TESTS], capture_output=True, text=True)
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr)

    def test_rules_and_their_tests_read_only_exported_series(self):
        exported = exported_series()
        self.assertIn("loom_job_mfu", exported, "metric names are read from " + METRICS_CC)
        recorded = {r["record"] for r in rules() if "record" in r}
        for rule in rules():
            for name in series_in(rule["expr"]) - recorded - PROMETHEUS_SERIES:
                with self.subTest(rule=rule.get("alert") or rule.get("record"), series=name):
                    self.assertIn(name, exported)
        with open(RULE_TESTS) as f:
            tests = yaml.safe_load(f)["tests"]
        for case in tests:
            for s in case.get("input_series", []):
                name = s["series"].split("{")[0]
                with self.subTest(input_series=s["series"]):
                    self.assertTrue(name in exported or name in PROMETHEUS_SERIES, name)

    def test_every_alert_links_to_the_panel_that_plots_it(self):
        with open(DASHBOARD) as f:
            panels = {p["id"]: p for p in json.load(f)["panels"]}
        recorded = {r["record"]: r["expr"] for r in rules() if "record" in r}

        def raw_series(expr):
            names = set()
            for name in series_in(expr):
                names |= raw_series(recorded[name]) if name in recorded else {name}
            return names

        for rule in rules():
            if "alert" not in rule:
                continue
            with self.subTest(alert=rule["alert"]):
                link = rule["annotations"]["dashboard"]
                m = re.fullmatch(r"/d/loom-overview/loom\?viewPanel=(\d+)", link)
                self.assertIsNotNone(m, link)
                panel = panels.get(int(m.group(1)))
                self.assertIsNotNone(panel, link)
                self.assertIn(rule["alert"], panel.get("description", ""),
                              f"panel '{panel['title']}' names the alert that links to it")
                queries = " ".join(t["expr"] for t in panel["targets"])
                shown = raw_series(rule["expr"]) & series_in(queries)
                self.assertTrue(shown, f"panel '{panel['title']}' plots none of {raw_series(rule['expr'])}")

    def test_dashboard_reads_only_exported_series_and_plots_expert_load(self):
        with open(DASHBOARD) as f:
            panels = json.load(f)["panels"]
        exported = exported_series()
        recorded = {r["record"] for r in rules() if "record" in r}
        for panel in panels:
            for target in panel["targets"]:
                for name in series_in(target["expr"]) - recorded - PROMETHEUS_SERIES:
                    # A histogram's series carry a suffix the family name lacks.
                    family = re.sub(r"_(bucket|sum|count)$", "", name)
                    with self.subTest(panel=panel["title"], series=name):
                        self.assertTrue(name in exported or family in exported, name)
        moe = [p for p in panels if p["title"] == "Expert load (MoE)"]
        self.assertEqual(len(moe), 1)
        shown = series_in(" ".join(t["expr"] for t in moe[0]["targets"]))
        self.assertTrue({"loom_job_expert_tokens", "loom_job_moe_imbalance"} <= shown, shown)

    def test_every_alert_has_a_firing_and_a_quiet_unit_test(self):
        with open(RULE_TESTS) as f:
            tests = yaml.safe_load(f)["tests"]
        fired, quiet = set(), set()
        for case in tests:
            for t in case.get("alert_rule_test", []):
                (fired if t.get("exp_alerts") else quiet).add(t["alertname"])
        for rule in rules():
            if "alert" in rule:
                with self.subTest(alert=rule["alert"]):
                    self.assertIn(rule["alert"], fired)
                    self.assertIn(rule["alert"], quiet)


if __name__ == "__main__":
    if not os.path.exists(PROMTOOL):
        missing_tool("promtool is not installed (Debian package prometheus)")
    unittest.main()
