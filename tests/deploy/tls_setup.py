"""TLS for the deploy tests: when the built programs take --tls_dir (the
shared TLS flags), certificates come from scripts/make_certs.sh and every
program runs with mutual TLS; programs built without those flags run in
plaintext, so the tests still exercise the deploy plumbing. Each test prints
which it used."""
import functools
import os
import subprocess

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BUILD = os.environ.get("LOOM_BUILD_DIR", os.path.join(ROOT, "build"))


@functools.lru_cache(None)
def tls_enabled():
    out = subprocess.run([os.path.join(BUILD, "bin", "loom-coordinator"), "--helpfull"],
                         capture_output=True, text=True)
    return "--tls_dir" in out.stdout + out.stderr


def certs(tmp, nodes=(), users=()):
    out = os.path.join(tmp, "certs")
    if not os.path.exists(os.path.join(out, "ca", "ca.crt")):
        args = [os.path.join(ROOT, "scripts", "make_certs.sh"), out]
        args += [f"--node={n}" for n in nodes] + [f"--user={u}" for u in users]
        subprocess.run(args, check=True, capture_output=True)
    return out


def coordinator_tls_args(tmp):
    if not tls_enabled():
        return []
    return [f"--tls_dir={certs(tmp)}/coordinator"]


def client_tls_args(tmp, identity):
    """For the health probe (which always takes one of the two)."""
    if not tls_enabled():
        return ["--insecure"]
    return [f"--tls_dir={certs(tmp)}/{identity}"]
