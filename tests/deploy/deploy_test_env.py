"""What the deploy tests share: where the build and the repository are, the
certificates every program runs with (mutual TLS, from scripts/make_certs.sh),
and how a test that lacks a tool stops. Under scripts/test.sh, which installs
every tool first, a missing tool is a failure, not a skip."""
import os
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BUILD = os.environ.get("LOOM_BUILD_DIR", os.path.join(ROOT, "build"))


def certs(tmp, nodes=(), users=()):
    out = os.path.join(tmp, "certs")
    if not os.path.exists(os.path.join(out, "ca", "ca.crt")):
        args = [os.path.join(ROOT, "scripts", "make_certs.sh"), out]
        args += [f"--node={n}" for n in nodes] + [f"--user={u}" for u in users]
        subprocess.run(args, check=True, capture_output=True)
    return out


def coordinator_tls_args(tmp):
    return [f"--tls_dir={certs(tmp)}/coordinator"]


def client_tls_args(tmp, identity):
    """For the health probe."""
    return [f"--tls_dir={certs(tmp)}/{identity}"]


def missing_tool(reason):
    """Ends the test: skipped (ctest's 77) when run by hand, failed under
    scripts/test.sh (LOOM_REQUIRE_TEST_TOOLS=1), whose install step provides
    every tool."""
    if os.environ.get("LOOM_REQUIRE_TEST_TOOLS") == "1":
        print("FAIL: " + reason + " (scripts/install_deps.sh installs it)")
        sys.exit(1)
    print("SKIP: " + reason)
    sys.exit(77)
