"""deploy/slurm/loom.sbatch against a real Slurm 22.05 on this machine: a
private munged, slurmctld and two slurmd (two CPU "nodes", no GPUs) on
loopback ports, all as root with their files in a scratch directory. The demo
spec (shortened) runs to SUCCEEDED with one agent per node and the batch job
exits 0; a second run is scancel'ed while it trains, and then no process of
it is left. Exits 77 (ctest: skipped) with the reason where it cannot run as
root or the daemons cannot start. Kills every daemon it started by pid."""
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from deploy_test_env import BUILD, ROOT, missing_tool  # noqa: E402
SBATCH_SCRIPT = os.path.join(ROOT, "deploy", "slurm", "loom.sbatch")
NODES = ("loom-n1", "loom-n2")
DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "srun", "scontrol", "squeue", "scancel")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(what, timeout, predicate):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.5)


class Slurm:
    """munged + slurmctld + one slurmd per node, configured under `dir`."""

    def __init__(self, dir):
        self.dir = dir
        self.conf = os.path.join(dir, "slurm.conf")
        self.env = dict(os.environ, SLURM_CONF=self.conf)
        self.pid_files = []

    def start(self):
        d = self.dir
        for sub in ("state", "spool", "log"):
            os.makedirs(os.path.join(d, sub))
        key = os.path.join(d, "munge.key")
        with open(key, "wb") as f:
            f.write(os.urandom(128))
        os.chmod(key, 0o600)
        sock = os.path.join(d, "munge.sock")
        self.pid_files.append(os.path.join(d, "munged.pid"))
        self.run("munged", "--force", f"--socket={sock}", f"--key-file={key}",
                 f"--log-file={d}/log/munged.log", f"--pid-file={d}/munged.pid",
                 f"--seed-file={d}/munged.seed")
        host = socket.gethostname().split(".")[0]
        ctld, ports = free_port(), [free_port() for _ in NODES]
        nodes = "\n".join(f"NodeName={n} NodeHostname={host} NodeAddr=127.0.0.1 Port={p} CPUs=2 "
                          "State=UNKNOWN" for n, p in zip(NODES, ports))
        with open(self.conf, "w") as f:
            f.write(f"""ClusterName=loomtest
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld}
SlurmdPort={ports[0]}
AuthType=auth/munge
AuthInfo=socket={sock}
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool/%n
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd-%n.pid
SlurmctldLogFile={d}/log/slurmctld.log
SlurmdLogFile={d}/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
MpiDefault=none
ReturnToService=2
KillWait=5
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SlurmdParameters=config_overrides
{nodes}
PartitionName=loom Nodes={",".join(NODES)} Default=YES MaxTime=30 State=UP
""")
        self.pid_files.append(os.path.join(d, "slurmctld.pid"))
        self.run("slurmctld", "-f", self.conf)
        for n in NODES:
            self.pid_files.append(os.path.join(d, f"slurmd-{n}.pid"))
            self.run("slurmd", "-f", self.conf, "-N", n)
        wait_until("both nodes idle", 30, lambda: self.idle_nodes() == len(NODES))

    def run(self, *args, check=True):
        return subprocess.run(args, env=self.env, capture_output=True, text=True, check=check,
                              timeout=60)

    def idle_nodes(self):
        out = self.run("sinfo", "-h", "-N", "-o", "%N %t", check=False).stdout
        return sum(1 for line in out.splitlines() if line.split()[-1] == "idle")

    def job_state(self, job_id):
        out = self.run("squeue", "-h", "-j", job_id, "-o", "%T", check=False).stdout.strip()
        return out or "GONE"

    def stop(self):
        for path in reversed(self.pid_files):
            try:
                with open(path) as f:
                    os.kill(int(f.read().strip()), signal.SIGTERM)
            except (OSError, ValueError):
                pass
        time.sleep(1)
        for path in self.pid_files:
            try:
                with open(path) as f:
                    os.kill(int(f.read().strip()), signal.SIGKILL)
            except (OSError, ValueError):
                pass

    def log(self, name):
        try:
            with open(os.path.join(self.dir, "log", name)) as f:
                return f.read()[-3000:]
        except OSError:
            return ""


def help_text(program):
    """What a program prints for --helpfull (its flags, or a usage line)."""
    out = subprocess.run([os.path.join(BUILD, "bin", program), "--helpfull"],
                         capture_output=True, text=True)
    return out.stdout + out.stderr


def processes_under(path):
    """pids of processes whose command line or working directory is under path."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError:
            continue
        if path in cmdline or cwd.startswith(path):
            found.append(f"{pid}: {cmdline[:200]}")
    return found


class SlurmTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.slurm = SLURM
        cls.tmp = os.path.dirname(SLURM.dir)
        cls.tls = "on"
        print(f"TLS {cls.tls}: the programs built here "
              f"{'take' if cls.tls == 'on' else 'do not take'} --tls_dir", flush=True)

    @classmethod
    def tearDownClass(cls):
        for job in cls.slurm.run("squeue", "-h", "-o", "%i", check=False).stdout.split():
            cls.slurm.run("scancel", job, check=False)
        cls.slurm.stop()
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def write_job(self, name, steps):
        """The demo spec on the license texts, as scripts/demo.sh prepares it."""
        d = os.path.join(self.tmp, name)
        os.makedirs(os.path.join(d, "data"))
        licenses = "/usr/share/common-licenses"
        text = b""
        for f in sorted(os.listdir(licenses)):
            if os.path.isfile(os.path.join(licenses, f)):
                with open(os.path.join(licenses, f), "rb") as src:
                    text += src.read()
        cut = len(text) * 9 // 10
        for name, part in (("train.txt", text[:cut]), ("val.txt", text[cut:])):
            with open(os.path.join(d, "data", name), "wb") as out:
                out.write(part)
        with open(os.path.join(ROOT, "examples", "demo.yaml")) as f:
            spec = f.read()
        # Shorter: a smaller model and fewer steps, one CPU rank per node.
        spec = re.sub(r"steps: 150", f"steps: {steps}", spec)
        spec = re.sub(r"hidden_size: 384", "hidden_size: 64", spec)
        spec = re.sub(r"num_layers: 6", "num_layers: 2", spec)
        spec = re.sub(r"num_heads: 6, num_kv_heads: 2", "num_heads: 4, num_kv_heads: 2", spec)
        spec = re.sub(r"ffn_hidden_size: 1024", "ffn_hidden_size: 128", spec)
        spec = re.sub(r"eval_interval: 50", "eval_interval: 5", spec)
        spec = re.sub(r"interval: 50, keep", "interval: 5, keep", spec)
        spec = re.sub(r"global_batch_size: 16, micro_batch_size: 4, seq_len: 128",
                      "global_batch_size: 4, micro_batch_size: 2, seq_len: 32", spec)
        self.assertIn(f"steps: {steps}", spec)
        path = os.path.join(d, "job.yaml")
        with open(path, "w") as f:
            f.write(spec)
        return d, path

    def sbatch(self, d, spec=None, **extra_env):
        env = dict(self.slurm.env, LOOM_BIN=os.path.join(BUILD, "bin"), LOOM_TLS=self.tls,
                   LOOM_HOME=ROOT, LOOM_RUN_DIR=os.path.join(d, "run"),
                   LOOM_WORK_DIR=os.path.join(d, "work"), LOOM_PORT=str(free_port()), **extra_env)
        out = subprocess.run(["sbatch", "--parsable", "--nodes=2", f"--chdir={d}",
                              f"--output={d}/batch.out", SBATCH_SCRIPT, *([spec] if spec else [])],
                             env=env, capture_output=True, text=True, timeout=60)
        self.assertEqual(out.returncode, 0, out.stderr)
        return out.stdout.strip().split(";")[0]

    def batch_out(self, d):
        try:
            with open(os.path.join(d, "batch.out")) as f:
                return f.read()[-4000:]
        except OSError:
            return "(no batch output)"

    def exit_code(self, job_id):
        out = self.slurm.run("scontrol", "show", "job", job_id, check=False).stdout
        m = re.search(r"JobState=(\S+).*?ExitCode=(\d+):(\d+)", out, re.S)
        return (m.group(1), int(m.group(2))) if m else ("GONE", None)

    def test_1_demo_job_succeeds_on_two_nodes(self):
        d, spec = self.write_job("succeed", steps=10)
        job = self.sbatch(d, spec)
        wait_until("the batch job to end", 300, lambda: self.slurm.job_state(job) == "GONE"
                   or self.exit_code(job)[0] in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"))
        out = self.batch_out(d)
        print(out[-1500:], flush=True)
        self.assertEqual(self.exit_code(job), ("COMPLETED", 0), out + self.slurm.log("slurmctld.log"))
        self.assertIn("SUCCEEDED", out)
        self.assertIn("on 2 nodes (loom-n1 loom-n2)", out)
        for n in NODES:
            with open(os.path.join(d, "run", f"agent-{n}.log")) as f:
                self.assertIn(n, f.read())
        self.assertEqual(processes_under(d), [])

    def test_2_scancel_mid_run_leaves_nothing_running(self):
        d, spec = self.write_job("cancel", steps=100000)
        job = self.sbatch(d, spec)
        trainers = lambda: [p for p in processes_under(d) if "loom-trainer" in p]  # noqa: E731
        def training():
            if self.slurm.job_state(job) == "GONE":
                raise AssertionError("the batch job ended early:\n" + self.batch_out(d))
            return len(trainers()) >= 2
        wait_until("two ranks to train", 120, training)
        time.sleep(2)  # mid-run: steps are being taken
        self.slurm.run("scancel", job)
        wait_until("the job to leave the queue", 120, lambda: self.slurm.job_state(job) == "GONE"
                   or self.exit_code(job)[0] == "CANCELLED")
        wait_until("every process of the job to end", 60, lambda: processes_under(d) == [])
        self.assertEqual(self.exit_code(job)[0], "CANCELLED")

    def test_4_a_job_that_cannot_succeed_fails_the_batch_job(self):
        """A spec whose training data is missing: refused at submission or
        failed by its ranks; either way the batch job exits non-zero and
        leaves nothing behind."""
        d, spec = self.write_job("fail", steps=10)
        os.remove(os.path.join(d, "data", "train.txt"))
        job = self.sbatch(d, spec)
        wait_until("the batch job to end", 300, lambda: self.slurm.job_state(job) == "GONE"
                   or self.exit_code(job)[0] in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"))
        out = self.batch_out(d)
        state, code = self.exit_code(job)
        self.assertEqual(state, "FAILED", out)
        self.assertNotEqual(code, 0, out)
        self.assertIn("train.txt", out)
        wait_until("every process of the job to end", 60, lambda: processes_under(d) == [])

    def test_3_agents_join_a_long_lived_coordinator(self):
        """Agents-only mode: the coordinator runs outside Slurm, the batch job
        registers the allocation's nodes, a job submitted with loomctl runs on
        them, and scancel ends the agents and their ranks."""
        d, spec = self.write_job("agents", steps=100000)
        port = free_port()
        certs = os.path.join(d, "certs")
        tls = []
        if self.tls == "on":
            subprocess.run([os.path.join(ROOT, "scripts", "make_certs.sh"), certs, "--host=127.0.0.1",
                            *[f"--node={n}" for n in NODES]], check=True, capture_output=True)
        insecure = ["--insecure"] if "--insecure" in help_text("loom-coordinator") else []
        tls = lambda who: [f"--tls_dir={certs}/{who}"] if self.tls == "on" else insecure  # noqa: E731
        # The same roots for the coordinator and the agents, where the build confines files.
        roots = {"LOOM_DATA_ROOTS": d, "LOOM_CHECKPOINT_ROOT": os.path.join(d, "checkpoints")}
        confine = ([f"--data_roots={d}", f"--checkpoint_root={d}/checkpoints"]
                   if "--data_roots" in help_text("loom-coordinator") else [])
        with open(os.path.join(d, "coordinator.log"), "wb") as log:
            coordinator = subprocess.Popen(
                [os.path.join(BUILD, "bin", "loom-coordinator"), f"--listen=127.0.0.1:{port}",
                 "--metrics_listen=127.0.0.1:0", f"--state_dir={d}/state", *tls("coordinator"),
                 *confine], stdout=log, stderr=subprocess.STDOUT)
        try:
            loomctl = lambda *a: subprocess.run(  # noqa: E731
                [os.path.join(BUILD, "bin", "loomctl"), f"--coordinator=127.0.0.1:{port}",
                 *tls("admin"), *a], capture_output=True, text=True, timeout=30)
            job = self.sbatch(d, LOOM_COORDINATOR=f"127.0.0.1:{port}", LOOM_CERTS=certs,
                              **(roots if confine else {}))
            wait_until("both nodes to register", 60,
                       lambda: all(n in loomctl("nodes").stdout for n in NODES))
            loom_job = loomctl("submit", spec).stdout.strip()
            self.assertTrue(loom_job, loomctl("list").stderr)
            wait_until("the job to run on the Slurm nodes", 120,
                       lambda: "RUNNING" in loomctl("status", loom_job).stdout)
            self.slurm.run("scancel", job)
            wait_until("the agents' job to leave the queue", 120,
                       lambda: self.slurm.job_state(job) == "GONE"
                       or self.exit_code(job)[0] == "CANCELLED")
            wait_until("every agent and rank to end", 60,
                       lambda: [p for p in processes_under(d) if "loom-coordinator" not in p] == [])
        finally:
            coordinator.kill()
            coordinator.wait()
        self.assertEqual(processes_under(d), [])


def skip_reason():
    if os.geteuid() != 0:
        return "needs root (munged, slurmctld and slurmd run as root here)"
    missing = [d for d in DAEMONS if shutil.which(d) is None]
    if missing:
        missing_tool(f"not installed: {', '.join(missing)} (Debian: slurm-wlm munge)")
    return None


SLURM = None

if __name__ == "__main__":
    reason = skip_reason()
    if reason is None:
        tmp = tempfile.mkdtemp(prefix="loom-slurm-")
        os.chmod(tmp, 0o755)
        SLURM = Slurm(os.path.join(tmp, "slurm"))
        try:
            SLURM.start()
        except Exception as e:  # the daemons cannot run on this machine
            reason = (f"munged/slurmctld/slurmd cannot start here: {e}\n"
                      + SLURM.log("slurmctld.log") + SLURM.log("munged.log"))
            SLURM.stop()
            shutil.rmtree(tmp, ignore_errors=True)
    if reason:
        print("SKIP: " + reason)
        sys.exit(77)
    unittest.main()
