"""deploy/systemd: install.sh lays the units, environment files, user and
monitoring files beneath a scratch root; `systemd-analyze verify` accepts the
installed units without a single warning; the units carry the hardening and
restart policy operators rely on; every variable a unit expands is set in its
environment file; and a reinstall (an upgrade) keeps edited settings."""
import configparser
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

from deploy_test_env import missing_tool

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
HERE = os.path.join(ROOT, "deploy", "systemd")
BUILD = os.environ.get("LOOM_BUILD_DIR", os.path.join(ROOT, "build"))
ANALYZE = shutil.which("systemd-analyze")
UNITS = {"loom-coordinator.service": "coordinator.env", "loom-worker.service": "worker.env"}


def read_unit(path):
    parser = configparser.ConfigParser(strict=False, interpolation=None, delimiters=("=",))
    parser.optionxform = str
    with open(path) as f:
        parser.read_string(f.read().replace("\\\n", " "))
    return parser


def verify(paths):
    out = subprocess.run([ANALYZE, "verify", *paths], capture_output=True, text=True)
    return out.returncode, (out.stdout + out.stderr).strip()


class SystemdUnitsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="loom-systemd-")
        cls.root = os.path.join(cls.tmp, "root")
        cls.prefix = os.path.join(cls.tmp, "prefix")
        cls.install()
        # The units run PREFIX/bin/...; install.sh put the binaries at ROOT/PREFIX/bin.
        os.symlink(cls.root + cls.prefix, cls.prefix)

    @classmethod
    def install(cls):
        subprocess.run([os.path.join(HERE, "install.sh"), f"--bin_dir={BUILD}/bin",
                        f"--prefix={cls.prefix}", f"--root={cls.root}"], check=True)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp)

    def installed(self, *parts):
        return os.path.join(self.root, *parts)

    def test_systemd_analyze_verify_passes_without_warnings(self):
        paths = [self.installed("etc", "systemd", "system", u) for u in UNITS]
        rc, out = verify(paths)
        self.assertEqual((rc, out), (0, ""))

    def test_verify_would_catch_a_broken_unit(self):
        broken = os.path.join(self.tmp, "broken.service")
        with open(self.installed("etc", "systemd", "system", "loom-coordinator.service")) as f:
            text = f.read().replace("ProtectSystem=strict", "ProtectSystm=strict")
        with open(broken, "w") as f:
            f.write(text)
        rc, out = verify([broken])
        self.assertIn("ProtectSystm", out)

    def test_units_are_hardened_restart_and_log_to_journald(self):
        for unit in UNITS:
            with self.subTest(unit=unit):
                u = read_unit(os.path.join(HERE, unit))
                self.assertIn("network-online.target", u["Unit"]["After"])
                self.assertIn("network-online.target", u["Unit"]["Wants"])
                s = u["Service"]
                expected = {"User": "loom", "Group": "loom", "Restart": "on-failure",
                            "ProtectSystem": "strict", "NoNewPrivileges": "true",
                            "ProtectHome": "true", "PrivateTmp": "true", "CapabilityBoundingSet": "",
                            "StandardOutput": "journal", "StandardError": "journal"}
                for key, value in expected.items():
                    self.assertEqual(s.get(key), value, key)
                self.assertTrue(s["ReadWritePaths"].startswith("/var/lib/loom/"))
                self.assertIn("--tls_dir=${LOOM_TLS_DIR}", s["ExecStart"])
                self.assertNotIn("--insecure", s["ExecStart"])

    def test_every_variable_a_unit_expands_is_set_in_its_env_file(self):
        for unit, env in UNITS.items():
            with self.subTest(unit=unit):
                u = read_unit(os.path.join(HERE, unit))
                self.assertEqual(u["Service"]["EnvironmentFile"], f"/etc/loom/{env}")
                used = set(re.findall(r"\$\{?([A-Z_]+)\}?", u["Service"]["ExecStart"]))
                with open(os.path.join(HERE, env)) as f:
                    defined = {line.split("=", 1)[0] for line in f
                               if re.match(r"^[A-Z_]+=", line)}
                self.assertEqual(used - defined, set())

    def test_reinstall_keeps_edited_settings_and_installs_monitoring(self):
        env = self.installed("etc", "loom", "worker.env")
        with open(env, "a") as f:
            f.write("LOOM_WORKER_ARGS=--kill_grace_s=9\n")
        self.install()
        with open(env) as f:
            self.assertIn("--kill_grace_s=9", f.read())
        for path in [("etc", "prometheus", "loom", "loom.rules.yml"),
                     ("etc", "grafana", "provisioning", "dashboards", "loom.yaml"),
                     ("var", "lib", "grafana", "dashboards", "loom", "loom-dashboard.json"),
                     ("usr", "lib", "sysusers.d", "loom.conf")]:
            self.assertTrue(os.path.exists(self.installed(*path)), os.path.join(*path))


if __name__ == "__main__":
    if ANALYZE is None:
        missing_tool("systemd-analyze is not installed (Debian package systemd)")
    unittest.main()
