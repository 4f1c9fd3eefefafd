"""deploy/kubernetes, offline: every kustomization (base and each overlay)
builds with `kubectl kustomize`, every object it renders validates against the
Kubernetes API schemas of kubernetes-models (tools/k8s-validate), the
monitoring overlay carries the current rules and dashboard, the manifests keep
the properties operators rely on (TLS on, probes on grpc.health.v1, requests
and limits, GPUs, host networking, IPC_LOCK, no API token), and the health
probe they run answers against a real coordinator."""
import os
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

from deploy_test_env import missing_tool

import yaml

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
K8S = os.path.join(ROOT, "deploy", "kubernetes")
VALIDATOR = os.path.join(ROOT, "tools", "k8s-validate")
BUILD = os.environ.get("LOOM_BUILD_DIR", os.path.join(ROOT, "build"))
PYTHON = "/usr/bin/python3"
KUSTOMIZATIONS = ["base", "overlays/monitoring", "overlays/cert-manager"]
KUBECTL = shutil.which("kubectl")
NODE = shutil.which("node")


def render(kustomization):
    out = subprocess.run([KUBECTL, "kustomize", os.path.join(K8S, kustomization)],
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise AssertionError(f"kubectl kustomize {kustomization}: {out.stderr}")
    return out.stdout


def validate(text):
    return subprocess.run([NODE, os.path.join(VALIDATOR, "validate.mjs")], input=text,
                          capture_output=True, text=True)


def objects(text):
    return {(o["kind"], o["metadata"]["name"]): o for o in yaml.safe_load_all(text) if o}


def container(obj):
    return obj["spec"]["template"]["spec"]["containers"][0]


class KubernetesManifestsTest(unittest.TestCase):
    def test_every_kustomization_builds_and_validates_against_the_api_schemas(self):
        for k in KUSTOMIZATIONS:
            with self.subTest(kustomization=k):
                out = validate(render(k))
                self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
                self.assertIn("0 problems", out.stdout)

    def test_the_validator_rejects_a_wrong_type_and_an_unknown_kind(self):
        bad = ("apiVersion: v1\nkind: Service\nmetadata: {name: x}\nspec: {ports: [{port: grpc}]}\n"
               "---\napiVersion: v1\nkind: Servcie\nmetadata: {name: y}\n")
        out = validate(bad)
        self.assertEqual(out.returncode, 1)
        self.assertIn("Service/x: /spec/ports/0/port: must be integer", out.stderr)
        self.assertIn("no schema for v1 Servcie", out.stderr)

    def test_monitoring_overlay_is_in_sync_with_rules_and_dashboard(self):
        out = subprocess.run([PYTHON, os.path.join(K8S, "sync_monitoring.py"), "--check"],
                             capture_output=True, text=True)
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
        mon = objects(render("overlays/monitoring"))
        self.assertIn(("PrometheusRule", "loom"), mon)
        self.assertTrue(mon[("ServiceMonitor", "loom-coordinator")]["spec"]["endpoints"][0]["honorLabels"])
        dashboard = mon[("ConfigMap", "loom-grafana-dashboard")]
        self.assertEqual(dashboard["metadata"]["labels"]["grafana_dashboard"], "1")
        self.assertIn("loom-dashboard.json", dashboard["data"])

    def test_coordinator_keeps_state_uses_tls_and_probes_grpc_health(self):
        base = objects(render("base"))
        sts = base[("StatefulSet", "loom-coordinator")]
        c = container(sts)
        self.assertEqual(sts["spec"]["replicas"], 1)
        self.assertEqual(sts["spec"]["volumeClaimTemplates"][0]["metadata"]["name"], "state")
        self.assertIn({"name": "state", "mountPath": "/var/lib/loom/state"}, c["volumeMounts"])
        self.assertIn("--state_dir=/var/lib/loom/state", c["args"])
        self.assertIn("--tls_dir=/etc/loom/tls", c["args"])
        for probe in ("readinessProbe", "livenessProbe"):
            cmd = c[probe]["exec"]["command"]
            self.assertIn("/opt/loom/probe/health_probe.py", cmd)
            self.assertIn("--tls_dir=/etc/loom/tls", cmd)
        self.assertTrue({"cpu", "memory"} <= set(c["resources"]["requests"]))
        self.assertIn("memory", c["resources"]["limits"])
        self.assertFalse(sts["spec"]["template"]["spec"]["automountServiceAccountToken"])
        self.assertEqual(base[("Service", "loom-coordinator")]["spec"]["ports"][0]["port"], 7070)
        self.assertEqual(base[("Service", "loom-coordinator-metrics")]["spec"]["ports"][0]["port"], 9464)

    def test_agents_run_on_gpu_nodes_with_host_network_shm_and_ipc_lock(self):
        for k in KUSTOMIZATIONS:
            with self.subTest(kustomization=k):
                ds = objects(render(k))[("DaemonSet", "loom-agent")]
                spec = ds["spec"]["template"]["spec"]
                c = container(ds)
                self.assertTrue(spec["hostNetwork"])
                self.assertFalse(spec["automountServiceAccountToken"])
                self.assertIn("nvidia.com/gpu", c["resources"]["limits"])
                self.assertEqual(c["securityContext"]["capabilities"]["add"], ["IPC_LOCK"])
                self.assertIn({"name": "shm", "mountPath": "/dev/shm"}, c["volumeMounts"])
                shm = next(v for v in spec["volumes"] if v["name"] == "shm")
                self.assertEqual(shm["emptyDir"]["medium"], "Memory")
                self.assertTrue(any(a.startswith("--tls_") for a in c["args"]), c["args"])
                self.assertFalse(any("--insecure" in a for a in c["args"]))
                tls = next(v for v in spec["volumes"] if v["name"] == "tls")
                self.assertEqual(len(set(tls) - {"name"}), 1, f"one source for the tls volume: {tls}")

    def test_no_program_runs_in_plaintext_and_all_live_in_the_namespace(self):
        for k in KUSTOMIZATIONS:
            for (kind, name), obj in objects(render(k)).items():
                with self.subTest(kustomization=k, object=f"{kind}/{name}"):
                    if kind != "Namespace":
                        self.assertEqual(obj["metadata"].get("namespace"), "loom")
                    if kind in ("StatefulSet", "DaemonSet"):
                        c = container(obj)
                        words = c.get("command", []) + c.get("args", [])
                        for probe in ("readinessProbe", "livenessProbe"):
                            words += c.get(probe, {}).get("exec", {}).get("command", [])
                        self.assertNotIn("--insecure", words)

    def test_health_probe_answers_for_a_live_coordinator_and_fails_for_none(self):
        coordinator = os.path.join(BUILD, "bin", "loom-coordinator")
        self.assertTrue(os.path.exists(coordinator), coordinator)
        probe = os.path.join(K8S, "base", "health_probe.py")
        tmp = tempfile.mkdtemp(prefix="loom-probe-")
        sys.path.insert(0, os.path.join(ROOT, "tests", "deploy"))
        from deploy_test_env import client_tls_args, coordinator_tls_args
        port = free_port()
        proc = subprocess.Popen([coordinator, f"--listen=127.0.0.1:{port}", "--metrics_listen=127.0.0.1:0",
                                 f"--state_dir={tmp}/state", *coordinator_tls_args(tmp)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            args = [PYTHON, probe, f"--address=127.0.0.1:{port}", *client_tls_args(tmp, "coordinator")]
            deadline = time.monotonic() + 30
            while subprocess.run(args, capture_output=True).returncode != 0:
                self.assertLess(time.monotonic(), deadline, "the probe never saw the coordinator SERVING")
                time.sleep(0.2)
        finally:
            proc.kill()
            proc.wait()
        self.assertEqual(subprocess.run(args, capture_output=True).returncode, 1)
        shutil.rmtree(tmp)


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


if __name__ == "__main__":
    if KUBECTL is None or NODE is None or not os.path.isdir(os.path.join(VALIDATOR, "node_modules")):
        missing_tool("needs kubectl, node and tools/k8s-validate/node_modules")
    unittest.main()
