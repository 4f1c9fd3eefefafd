"""A real Prometheus (Debian's package, loopback) scrapes the coordinator
during a running job, as deploy/prometheus/prometheus.yml configures it
(honor_labels, Loom's rules loaded): every query of the Grafana dashboard's
panels returns data from it, the dashboard's job filter sees Loom's job ids,
and the recording rules the alerts build on evaluate on the real series. A
rank of the job crashes once (the LOOM_TEST_FAULT drill), so that the recovery
panel plots a real recovery: a duration for every phase, and goodput."""

import json
import math
import os
import shutil
import subprocess
import unittest
import urllib.parse
import urllib.request

from loom_cluster import Cluster, free_port, tiny_job, wait_until

REPO = os.path.join(os.path.dirname(__file__), "..", "..")
DASHBOARD = os.path.join(REPO, "deploy", "grafana", "loom-dashboard.json")
RULES = [os.path.abspath(os.path.join(REPO, "deploy", "prometheus", "rules", f))
         for f in ("loom.rules.yml", "loom-site.rules.yml")]
PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"


RECOVERY_PANEL = "Recovery phases and goodput"
PHASES = {"detection", "stopping", "placement", "rendezvous", "checkpoint_load", "first_step"}


def dashboard_queries():
    with open(DASHBOARD) as f:
        dashboard = json.load(f)
    queries = []
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            # What Grafana sends with the job variable at "All".
            queries.append((panel["title"], target["expr"].replace("$job", ".*")))
    return queries


class Monitoring(unittest.TestCase):
    def setUp(self):
        self.cluster = Cluster("monitoring")
        self.addCleanup(self.cluster.stop)

    def query(self, port, expr):
        url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                body = json.load(r)
        except OSError:
            return None
        return body["data"]["result"] if body.get("status") == "success" else None

    def test_prometheus_scrapes_and_every_dashboard_query_has_data(self):
        self.assertTrue(os.path.exists(PROMETHEUS), "prometheus is installed by scripts/install_deps.sh")
        c = self.cluster
        c.start_coordinator()
        # Rank 1 crashes once after step 5: one recovery, scraped as it happens.
        c.start_agent("node-a", "cpu:2", env={**os.environ, "LOOM_TEST_FAULT": "after_step@5#1"})
        port = free_port()
        config = os.path.join(c.dir, "prometheus.yml")
        with open(config, "w") as f:
            f.write("global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
                    f"rule_files: {json.dumps(RULES)}\n"
                    "scrape_configs:\n"
                    "  - job_name: loom-coordinator\n"
                    "    honor_labels: true\n"
                    f"    static_configs: [{{targets: ['127.0.0.1:{c.metrics_port}']}}]\n")
        subprocess.run([shutil.which("promtool") or "/usr/bin/promtool", "check", "config", config],
                       check=True, capture_output=True)
        c._spawn([PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={c.dir}/tsdb",
                  f"--web.listen-address=127.0.0.1:{port}"], "prometheus.log")
        # Prometheus has seen the recovery histogram empty before the crash,
        # so that increase() over the window sees the crash's observations.
        wait_until(lambda: self.query(port, "loom_recovery_phase_seconds_count"), 60,
                   "Prometheus to scrape the coordinator")
        # On the whole-job path (in place off), whose six phases the panel's
        # query is checked for below.
        job = c.submit(tiny_job(steps=100000, ranks=2, eval_interval=5, ckpt_interval=0,
                                max_restarts=1).replace("hang_timeout_s: 0}",
                                                        "hang_timeout_s: 0, in_place: false}"))
        wait_until(lambda: c.state(job) == "RUNNING", 60, "the job to run")
        for title, expr in dashboard_queries():
            with self.subTest(panel=title, expr=expr):
                wait_until(lambda: self.query(port, expr), 60,
                           f"panel '{title}' query {expr} to return data\n" + c.log("prometheus.log")[-2000:])
        # The recovery panel: after the crash every phase has a duration (not
        # the NaN of an empty histogram) and the job's goodput is a fraction.
        recovery = [expr for title, expr in dashboard_queries() if title == RECOVERY_PANEL]
        self.assertEqual(len(recovery), 2, "the recovery panel plots phases and goodput")

        def phases_plotted():
            result = self.query(port, recovery[0]) or []
            return {r["metric"].get("phase") for r in result
                    if not math.isnan(float(r["value"][1]))} >= PHASES
        wait_until(phases_plotted, 90, f"every recovery phase in {recovery[0]}")
        goodput = self.query(port, recovery[1])
        self.assertTrue(goodput)
        self.assertTrue(0 <= float(goodput[0]["value"][1]) <= 1, goodput)
        # The dashboard's job variable (label_values(loom_job_step, job)) lists Loom job ids.
        self.assertTrue(self.query(port, f'loom_job_step{{job="{job}"}}'))
        for expr in ("loom:job_step_seconds:median6h", "loom:rank_memory:capacity_ratio",
                     "loom:rpc_server_errors:ratio_rate5m"):
            with self.subTest(recording_rule=expr):
                wait_until(lambda: self.query(port, expr), 60, f"recording rule {expr} to have data")
        up = self.query(port, 'up{job="loom-coordinator"}')
        self.assertEqual(up[0]["value"][1], "1")
        self.assertEqual(c.state(job), "RUNNING")  # scraped while it ran
        c.loomctl("cancel", job)


if __name__ == "__main__":
    unittest.main()
