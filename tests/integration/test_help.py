"""Help a person can read (docs/client.md): every loomctl verb has help
(`loomctl help VERB`, `loomctl VERB --help`), an unknown verb or flag names
the closest, and every flag a binary accepts appears in its --help. The flags
are enumerated from the code: each ABSL_FLAG defined in the source tree is
offered to each binary (`--NAME=x --help`); the ones it does not call unknown
are the ones it accepts, and each of those must be in its help."""

import os
import re
import subprocess
import unittest

from loom_cluster import BIN

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SOURCE_DIRS = ("client", "common", "coordinator", "export", "planner", "worker")
FLAG = re.compile(r"ABSL_FLAG\(\s*[\w:<>]+\s*,\s*(\w+)\s*,")
BINARIES = ("loom-coordinator", "loom-worker", "loom-trainer", "loomctl")


def defined_flags():
    names = set()
    for top in SOURCE_DIRS:
        for root, _, files in os.walk(os.path.join(REPO, top)):
            for name in files:
                if name.endswith(".cc"):
                    with open(os.path.join(root, name), errors="replace") as f:
                        names.update(FLAG.findall(f.read()))
    return sorted(names)


def run(binary, *args):
    return subprocess.run([os.path.join(BIN, binary), *args], capture_output=True, text=True,
                          timeout=30)


def loomctl_verbs():
    listing = run("loomctl", "help").stdout
    verbs = []
    in_verbs = False
    for line in listing.splitlines():
        if line == "verbs:":
            in_verbs = True
        elif in_verbs and line.startswith("   "):
            continue  # a wrapped summary
        elif in_verbs and line.startswith("  "):
            verbs.append(line.split()[0])
        elif in_verbs:
            break
    return verbs


class Help(unittest.TestCase):
    def test_every_verb_has_help_with_flags_and_an_example(self):
        verbs = loomctl_verbs()
        for verb in ("submit", "plan", "list", "status", "watch", "logs", "cancel", "export"):
            self.assertIn(verb, verbs)
        for verb in verbs:
            with self.subTest(verb=verb):
                by_help = run("loomctl", "help", verb)
                by_flag = run("loomctl", verb, "--help")
                self.assertEqual(by_help.returncode, 0, by_help.stderr)
                self.assertEqual(by_flag.returncode, 0, by_flag.stderr)
                self.assertEqual(by_help.stdout, by_flag.stdout)
                self.assertIn(f"usage: loomctl {verb}", by_help.stdout)
                self.assertIn("example:\n  loomctl ", by_help.stdout)
                self.assertTrue(all(len(line) <= 110 for line in by_help.stdout.splitlines()),
                                by_help.stdout)
        logs = run("loomctl", "help", "logs").stdout
        for flag in ("--rank=0", "--all", "--follow", "--tail=0", "--attempt=0"):
            self.assertIn(flag, logs)
        # No verb: the verb list on stderr, a usage error.
        bare = run("loomctl")
        self.assertEqual(bare.returncode, 2)
        self.assertIn("verbs:", bare.stderr)

    def test_unknown_verbs_and_flags_suggest_the_closest(self):
        for args, needle in ((("stauts", "j"), "unknown verb 'stauts' (did you mean 'status'?)"),
                             (("help", "wacth"), "did you mean 'watch'?"),
                             (("list", "--formt=json"), "unknown flag --formt (did you mean '--format'?)"),
                             (("status",), "status needs ID")):
            with self.subTest(args=args):
                result = run("loomctl", *args)
                self.assertEqual(result.returncode, 2, result.stderr)
                self.assertIn(needle, result.stderr)
        result = run("loom-coordinator", "--node_timout_s=3")
        self.assertEqual(result.returncode, 2)
        self.assertIn("did you mean '--node_timeout_s'?", result.stderr)
        result = run("loom-worker", "--work_dri=x")
        self.assertEqual(result.returncode, 2)
        self.assertIn("did you mean '--work_dir'?", result.stderr)

    def test_every_accepted_flag_is_in_the_binarys_help(self):
        flags = defined_flags()
        self.assertGreater(len(flags), 50)
        for binary in BINARIES:
            if binary == "loomctl":
                help_text = run(binary, "help").stdout + "".join(
                    run(binary, "help", verb).stdout for verb in loomctl_verbs())
            else:
                result = run(binary, "--help")
                self.assertEqual(result.returncode, 0, result.stderr)
                help_text = result.stdout
            accepted = []
            for name in flags:
                probe = run(binary, f"--{name}=x", "--help")
                if "unknown flag" in probe.stderr or "unknown argument" in probe.stderr:
                    continue
                accepted.append(name)
                with self.subTest(binary=binary, flag=name):
                    self.assertRegex(help_text, rf"--{name}\b")
            self.assertGreater(len(accepted), 3, binary)
            print(f"{binary}: {len(accepted)} flags accepted, each in its --help")
        # The coordinator's timeouts, which its old usage line left out.
        help_text = run("loom-coordinator", "--help").stdout
        for name in ("node_timeout_s", "heartbeat_interval_s", "collective_timeout_s"):
            self.assertIn(f"--{name}=", help_text)
        self.assertIn("flags from coordinator/:", help_text)


if __name__ == "__main__":
    unittest.main()
