"""A Loom cluster on loopback for integration tests: a coordinator, node
agents and loomctl, run from build/bin as real processes. Every process is
started in its own process group and killed by pid at the end, so nothing
outlives a test.

Mutual TLS is on, as in production: the cluster makes its certificates with
scripts/make_certs.sh in its temp dir, passes --tls_dir to every program,
and hands out Python gRPC channels per identity (cluster.channel(identity=
"admin" | "user-alice" | "node-a" | "coordinator" | None, token=...)); tests
never build channels themselves."""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

BUILD = os.environ.get("LOOM_BUILD_DIR", os.path.join(os.path.dirname(__file__), "..", "..", "build"))
BIN = os.path.join(BUILD, "bin")
MAKE_CERTS = os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "make_certs.sh")
# Users whose certificates every cluster has, besides admin and its nodes.
USERS = ("alice", "bob", "mallory")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# The clusters of the running test, so that any timed-out wait can say what
# they were doing (most failures seen only in CI are timeouts).
_RUNNING_CLUSTERS = []


def wait_until(predicate, timeout, what, interval=0.1, details=None):
    """Polls predicate until it is true; a timeout fails naming `what`, with
    details() appended (a job's status, the logs' tails: what a failure seen
    only in CI needs to say why). Without details, the running clusters' jobs
    and logs' tails are appended."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    message = f"timed out after {timeout}s waiting for {what}"
    if details is None:
        details = lambda: "".join(c.post_mortem() for c in _RUNNING_CLUSTERS)
    message += f":\n{details()}"
    raise AssertionError(message)


def pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead for our purposes.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def placement(status):
    """{rank: node} from the rank lines of `loomctl status`."""
    nodes = {}
    for line in status.splitlines():
        fields = line.split()
        if len(fields) >= 4 and fields[0] == "rank" and fields[1].isdigit():
            nodes[int(fields[1])] = fields[-3]
    return nodes


def children_of(pid):
    """Pids whose parent is pid (from /proc)."""
    result = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().split(")")[-1].split()
            if int(fields[1]) == pid:
                result.append(int(entry))
        except (FileNotFoundError, ProcessLookupError, IndexError):
            pass
    return result


def write_corpus(directory, train_bytes=60000, val_bytes=8000):
    """A real text: the license files every Debian machine has."""
    text = b""
    licenses = "/usr/share/common-licenses"
    for name in sorted(os.listdir(licenses)):
        path = os.path.join(licenses, name)
        if os.path.isfile(path):
            with open(path, "rb") as f:
                text += f.read()
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "train.txt"), "wb") as f:
        f.write(text[:train_bytes])
    with open(os.path.join(directory, "val.txt"), "wb") as f:
        f.write(text[train_bytes:train_bytes + val_bytes])


TINY_JOB = """
name: {name}
model: {{vocab_size: 256, hidden_size: 32, num_layers: 2, num_heads: 2, num_kv_heads: 1,
        ffn_hidden_size: 64, max_seq_len: 64, rope_theta: 10000, tie_embeddings: false}}
train: {{steps: {steps}, global_batch_size: 4, micro_batch_size: 1, seq_len: 32,
        lr: 3.0e-3, warmup_steps: 1, lr_schedule: cosine, weight_decay: 0.1, grad_clip: 1.0,
        seed: 1234, precision: fp32, eval_interval: {eval_interval}, eval_windows: 4}}
data: {{train_path: data/train.txt, val_path: data/val.txt, format: text}}
parallelism: {{dp: {ranks}, tp: 1, pp: 1, cp: 1, ep: 1, zero_stage: 0}}
resources: {{device: cpu, ranks: {ranks}}}
checkpoint: {{dir: checkpoints, interval: {ckpt_interval}, keep: 2}}
fault_tolerance: {{max_restarts: {max_restarts}, hang_timeout_s: 0}}
"""


def tiny_job(name="tiny", steps=6, ranks=2, eval_interval=3, ckpt_interval=3, max_restarts=0):
    return TINY_JOB.format(name=name, steps=steps, ranks=ranks, eval_interval=eval_interval,
                           ckpt_interval=ckpt_interval, max_restarts=max_restarts)


class Cluster:
    def __init__(self, test_name):
        # Short enough for the agents' sockets (<dir>/node-X/agent.sock) to
        # fit a Unix socket path (107 bytes).
        self.dir = tempfile.mkdtemp(prefix=f"loom-{test_name[:40]}-")
        self.state_dir = os.path.join(self.dir, "state")
        self.port = free_port()
        self.metrics_port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.coordinator = None
        self.agents = {}
        self.processes = []
        self.certs = os.path.join(self.dir, "certs")
        self.make_certs()
        # Confinement: jobs read data only beneath data_root (relative spec
        # paths such as data/train.txt resolve there) and keep checkpoints in
        # checkpoint_root/<owner>/<job_id>; the coordinator and every agent
        # get the same roots, as on a cluster with a shared file system.
        self.data_root = os.path.join(self.dir, "inputs")
        self.checkpoint_root = os.path.join(self.dir, "checkpoints")
        write_corpus(os.path.join(self.data_root, "data"))
        _RUNNING_CLUSTERS.append(self)

    # -- identities ------------------------------------------------------------
    def make_certs(self, nodes=()):
        """Creates the CA and certificates (re-run: adds the missing ones)."""
        args = [MAKE_CERTS, self.certs] + [f"--user={u}" for u in USERS] + \
               [f"--node={n}" for n in nodes]
        subprocess.run(args, check=True, capture_output=True, timeout=60)

    def tls_dir(self, identity):
        """The certificate directory of an identity: "admin", "coordinator",
        "user-NAME", or a node's name (its directory is node-NAME)."""
        if identity in ("admin", "coordinator") or identity.startswith("user-"):
            return os.path.join(self.certs, identity)
        path = os.path.join(self.certs, f"node-{identity}")
        if not os.path.isdir(path):
            self.make_certs(nodes=[identity])
        return path

    def channel(self, identity="admin", token=None):
        """A gRPC channel to the coordinator with identity's certificate; None
        presents no certificate (only the CA); token adds `authorization:
        Bearer` to every call."""
        import grpc  # only the tests that speak gRPC need python3-grpcio

        def read(path):
            with open(path, "rb") as f:
                return f.read()
        ca = read(os.path.join(self.certs, "ca", "ca.crt"))
        if identity is None:
            credentials = grpc.ssl_channel_credentials(root_certificates=ca)
        else:
            d = self.tls_dir(identity)
            credentials = grpc.ssl_channel_credentials(
                root_certificates=ca, private_key=read(os.path.join(d, "tls.key")),
                certificate_chain=read(os.path.join(d, "tls.crt")))
        if token is not None:
            credentials = grpc.composite_channel_credentials(
                credentials, grpc.access_token_call_credentials(token))
        return grpc.secure_channel(self.address, credentials)

    def agent_channel(self, name="node-a", token=None):
        """A gRPC channel to agent `name`'s endpoint (its Unix socket,
        local credentials); token adds `authorization: Bearer` to every call."""
        import grpc

        credentials = grpc.local_channel_credentials(grpc.LocalConnectionType.UDS)
        if token is not None:
            credentials = grpc.composite_channel_credentials(
                credentials, grpc.access_token_call_credentials(token))
        return grpc.secure_channel(f"unix:{os.path.join(self.dir, name, 'agent.sock')}",
                                   credentials)

    # -- processes ---------------------------------------------------------
    def _spawn(self, args, log_name, env=None):
        with open(os.path.join(self.dir, log_name), "ab") as log:
            proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True, cwd=self.dir, env=env)
        self.processes.append(proc)
        return proc

    def start_coordinator(self, extra=()):
        self.coordinator = self._spawn(
            [os.path.join(BIN, "loom-coordinator"), f"--listen={self.address}",
             f"--metrics_listen=127.0.0.1:{self.metrics_port}", f"--state_dir={self.state_dir}",
             "--heartbeat_interval_s=0.5", "--node_timeout_s=3", "--kill_grace_s=2",
             f"--tls_dir={self.tls_dir('coordinator')}", *self.root_flags(), *extra],
            "coordinator.log")
        wait_until(lambda: self.loomctl("list", check=False).returncode == 0, 20,
                   "the coordinator to answer")
        return self.coordinator

    def root_flags(self):
        return [f"--data_roots={self.data_root}", f"--checkpoint_root={self.checkpoint_root}"]

    def start_agent(self, name="node-a", devices="cpu:2", env=None, extra=()):
        work = os.path.join(self.dir, name)
        proc = self._spawn([os.path.join(BIN, "loom-worker"), f"--coordinator={self.address}",
                            f"--devices={devices}", f"--work_dir={work}",
                            f"--tls_dir={self.tls_dir(name)}", *self.root_flags(), *extra],
                           f"{name}.log", env)
        self.agents[name] = proc
        return proc

    def kill(self, proc, sig=signal.SIGKILL):
        try:
            os.kill(proc.pid, sig)
        except ProcessLookupError:
            pass
        if sig == signal.SIGKILL:
            proc.wait(timeout=10)

    def stop(self):
        if self in _RUNNING_CLUSTERS:
            _RUNNING_CLUSTERS.remove(self)
        agents = {proc.pid for proc in self.agents.values()}
        for proc in reversed(self.processes):
            if proc.poll() is None:
                try:
                    # SIGINT stops an agent at once; its SIGTERM would drain
                    # (each job saving its next step), which a teardown does
                    # not need.
                    os.kill(proc.pid, signal.SIGINT if proc.pid in agents else signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + 10
        for proc in self.processes:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=5)
        # Ranks are children of agents in their own groups; any survivor is a
        # bug the tests report, but never leave it running.
        for pid in self.trainer_pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def rank_pids(self, attempt=None):
        """{(attempt, rank): pid} of the cluster's live trainers, from the rank
        directory on their command line (jobs/<job>/attempt_<n>/rank_<r>/: a
        survivor of an in-place recovery keeps the one it was launched in);
        only those of `attempt` when given."""
        pids = {}
        for pid in self.trainer_pids():
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmdline = f.read().decode(errors="replace")
            except FileNotFoundError:
                continue
            found = re.search(r"attempt_(\d+)/rank_(\d+)/", cmdline)
            if found and (attempt is None or int(found.group(1)) == attempt):
                pids[(int(found.group(1)), int(found.group(2)))] = pid
        return pids

    def trainer_pids(self):
        pids = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    cmd = f.read().split(b"\0")
            except (FileNotFoundError, ProcessLookupError):
                continue
            if cmd and cmd[0].endswith(b"loom-trainer") and any(
                    self.dir.encode() in part for part in cmd) and pid_alive(int(entry)):
                pids.append(int(entry))
        return pids

    def log(self, name):
        path = os.path.join(self.dir, name)
        if not os.path.exists(path):
            return ""
        with open(path, errors="replace") as f:
            return f.read()

    # -- client ------------------------------------------------------------
    def coordinator_rss_bytes(self):
        """The coordinator's resident set (VmRSS of /proc/PID/status)."""
        with open(f"/proc/{self.coordinator.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        return 0

    def loomctl_argv(self, *args, identity="admin"):
        """loomctl's command line as identity (a certificate directory, see
        tls_dir), or with only the CA (for a bearer token) when identity is None."""
        auth = [f"--tls_dir={self.tls_dir(identity)}"] if identity is not None else \
            [f"--tls_ca={os.path.join(self.certs, 'ca', 'ca.crt')}"]
        return [os.path.join(BIN, "loomctl"), f"--coordinator={self.address}", *auth, *args]

    def loomctl(self, *args, check=True, timeout=60, identity="admin", token=None):
        """Runs loomctl as identity; token goes in $LOOM_TOKEN."""
        env = dict(os.environ)
        env.pop("LOOM_TLS_DIR", None)
        env.pop("LOOM_TOKEN", None)
        if token is not None:
            env["LOOM_TOKEN"] = token
        result = subprocess.run(self.loomctl_argv(*args, identity=identity),
                                capture_output=True, text=True, timeout=timeout, cwd=self.dir,
                                env=env)
        if check and result.returncode != 0:
            raise AssertionError(f"loomctl {' '.join(args)} failed ({result.returncode}):\n"
                                 f"{result.stdout}\n{result.stderr}")
        return result

    def log_tails(self, lines=30):
        """The last lines of the coordinator's and every agent's log."""
        return "".join(f"\n--- {name} (last {lines} lines) ---\n" +
                       "\n".join(self.log(name).splitlines()[-lines:])
                       for name in ["coordinator.log"] + [f"{n}.log" for n in self.agents])

    def post_mortem(self):
        """What a timed-out wait appends: every job's state and history, and
        the logs' tails. Never raises (the coordinator may be the one gone)."""
        try:
            jobs = self.loomctl("list", check=False, timeout=20)
            text = f"\n--- {self.dir}: loomctl list ---\n{jobs.stdout}{jobs.stderr}"
            for line in jobs.stdout.splitlines()[1:7]:
                fields = line.split()
                if fields and fields[0] not in ("JOB", "ID"):
                    status = self.loomctl("status", fields[0], check=False, timeout=20)
                    text += f"\n--- loomctl status {fields[0]} ---\n{status.stdout}{status.stderr}"
        except Exception as error:  # the post-mortem must not hide the failure
            text = f"\n--- {self.dir}: loomctl failed: {error!r}"
        return text + self.log_tails()

    def wait_state(self, job_id, states, timeout=120):
        """Waits until the job is in one of states and returns that state; a
        timeout fails the test with the job's status and the logs' tails, so
        that a failure seen only in CI says why."""
        wait_until(lambda: self.state(job_id) in states, timeout, f"{job_id} to reach {states}",
                   details=lambda: self.status(job_id) + self.log_tails())
        return self.state(job_id)

    def expect_end(self, job_id, states, expected, timeout=120):
        """Waits as wait_state; a state other than expected fails the test
        with the job's status and the logs' tails."""
        state = self.wait_state(job_id, states, timeout)
        if state != expected:
            raise AssertionError(f"{job_id} reached {state}, not {expected}:\n"
                                 f"{self.status(job_id)}{self.log_tails()}")
        return state

    def write_spec(self, name, text):
        path = os.path.join(self.dir, f"{name}.yaml")
        with open(path, "w") as f:
            f.write(text)
        return path

    def submit(self, spec_text, name="job", identity="admin"):
        return self.loomctl("submit", self.write_spec(name, spec_text),
                            identity=identity).stdout.strip()

    def status(self, job_id, identity="admin"):
        return self.loomctl("status", job_id, identity=identity).stdout

    def checkpoint_dir(self, job_id, identity="admin"):
        """Where the job's checkpoints live: checkpoint_root/<owner>/<job_id>."""
        for line in self.status(job_id, identity).splitlines():
            if line.startswith("checkpoints:"):
                return line.split(None, 1)[1].strip()
        return None

    def state(self, job_id, identity="admin"):
        for line in self.status(job_id, identity).splitlines():
            if line.startswith("state:"):
                return line.split()[1]
        return None

    def metrics(self):
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as r:
            return r.read().decode()

    def metric_value(self, name, **labels):
        for line in self.metrics().splitlines():
            if not line.startswith(name) or line.startswith("#"):
                continue
            head, _, value = line.rpartition(" ")
            metric = head.split("{")[0]
            if metric != name:
                continue
            if all(f'{k}="{v}"' in head for k, v in labels.items()):
                return float(value)
        return None
