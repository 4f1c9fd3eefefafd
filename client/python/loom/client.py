"""Client and Job: the coordinator's JobService from Python (docs/client.md).

Defaults come from the environment like loomctl's: $LOOM_COORDINATOR
(HOST:PORT; default 127.0.0.1:7070), $LOOM_TLS_DIR (ca.crt, and tls.crt /
tls.key for a certificate identity) and $LOOM_TOKEN (a bearer token).
"""
import json
import os
import time
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Optional, Union

import grpc
import yaml

from loom.errors import JobFailed, LoomError
from loom.v1 import job_pb2, job_pb2_grpc

SpecLike = Union[str, "os.PathLike[str]", Dict[str, Any]]

FINAL_STATES = ("SUCCEEDED", "FAILED", "CANCELLED")


def _state_name(state: int) -> str:
    return job_pb2.JobState.Name(state)


def step_record(progress: "job_pb2.JobProgress") -> Dict[str, Any]:
    """One step as `loomctl watch --format=jsonl` prints it."""
    record: Dict[str, Any] = {
        "step": progress.step,
        "total_steps": progress.total_steps,
        "loss": progress.loss,
        "tokens": progress.tokens,
        "step_seconds": progress.step_seconds,
        "tokens_per_second": progress.tokens_per_second,
        "mfu": progress.mfu,
        "attempt": progress.attempt,
        "lr": progress.lr,
        "grad_norm": progress.grad_norm,
        "max_memory_bytes": progress.max_memory_bytes,
        "time_unix_ms": progress.time_unix_ms,
    }
    if progress.has_val_loss:
        record["val_loss"] = progress.val_loss
    return record


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


class Client:
    """A connection to the coordinator.

    address: HOST:PORT (several comma-separated: the first is used);
    tls_dir: directory with ca.crt, and tls.crt and tls.key unless a token is
    given; token: a bearer token; insecure: plaintext (a development cluster
    started with --insecure). Unary calls time out after `timeout` seconds.
    """

    def __init__(self, address: Optional[str] = None, tls_dir: Optional[str] = None,
                 token: Optional[str] = None, insecure: bool = False, timeout: float = 60.0):
        self.address = (address or os.environ.get("LOOM_COORDINATOR") or "127.0.0.1:7070").split(",")[0]
        self.timeout = timeout
        token = token if token is not None else os.environ.get("LOOM_TOKEN") or None
        tls_dir = tls_dir if tls_dir is not None else os.environ.get("LOOM_TLS_DIR") or None
        options = [("grpc.keepalive_time_ms", 20000), ("grpc.keepalive_permit_without_calls", 1)]
        if insecure:
            self._channel = grpc.insecure_channel(self.address, options=options)
        else:
            if tls_dir is None:
                raise LoomError(grpc.StatusCode.INVALID_ARGUMENT,
                                "no TLS directory: pass tls_dir= or set $LOOM_TLS_DIR "
                                "(or insecure=True for a cluster started with --insecure)")
            ca = os.path.join(tls_dir, "ca.crt")
            if not os.path.exists(ca):
                raise LoomError(grpc.StatusCode.INVALID_ARGUMENT, f"{ca} does not exist")
            cert, key = os.path.join(tls_dir, "tls.crt"), os.path.join(tls_dir, "tls.key")
            has_identity = os.path.exists(cert) and os.path.exists(key)
            if token is None and not has_identity:
                raise LoomError(grpc.StatusCode.INVALID_ARGUMENT,
                                f"{tls_dir} has no tls.crt and tls.key, and no token was given "
                                "(token= or $LOOM_TOKEN)")
            credentials = grpc.ssl_channel_credentials(
                root_certificates=_read(ca),
                private_key=_read(key) if has_identity and token is None else None,
                certificate_chain=_read(cert) if has_identity and token is None else None)
            if token is not None:
                credentials = grpc.composite_channel_credentials(
                    credentials, grpc.access_token_call_credentials(token.strip()))
            self._channel = grpc.secure_channel(self.address, credentials, options=options)
        self._stub = job_pb2_grpc.JobServiceStub(self._channel)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _call(self, method: str, request: Any, timeout: Optional[float] = None) -> Any:
        try:
            return getattr(self._stub, method)(request, timeout=timeout or self.timeout)
        except grpc.RpcError as error:
            raise LoomError.from_rpc(error) from None

    @staticmethod
    def _spec(spec: SpecLike) -> "tuple[str, str, str]":
        """(yaml, source name, base dir) of a path or a dict."""
        if isinstance(spec, dict):
            return yaml.safe_dump(spec, sort_keys=False), "<dict>", os.getcwd()
        path = os.fspath(spec)
        try:
            text = _read(path).decode()
        except OSError as error:
            raise LoomError(grpc.StatusCode.INVALID_ARGUMENT,
                            f"cannot read job spec {path}: {error.strerror}") from None
        return text, path, os.path.dirname(os.path.abspath(path))

    def submit(self, spec: SpecLike) -> "Job":
        """Submits a job spec (a YAML file's path, or the spec as a dict)."""
        text, source, base_dir = self._spec(spec)
        response = self._call("SubmitJob", job_pb2.SubmitJobRequest(
            spec_yaml=text, source_name=source, base_dir=base_dir))
        return Job._from(self, response.job)

    def get(self, job_id: str) -> "Job":
        return Job._from(self, self._call("GetJob", job_pb2.GetJobRequest(
            id=job_id, view=job_pb2.JOB_VIEW_FULL)))

    def list(self) -> List["Job"]:
        """Every job the caller may see (an admin: all), page by page."""
        jobs: List[Job] = []
        request = job_pb2.ListJobsRequest(page_size=1000)
        while True:
            response = self._call("ListJobs", request)
            jobs.extend(Job._from(self, j) for j in response.jobs)
            if not response.next_page_token:
                return jobs
            request.page_token = response.next_page_token

    def plan(self, spec: SpecLike, candidates: int = 5, profile: str = "loom") -> Dict[str, Any]:
        """The planner's choice for a spec, as `loomctl plan --format=json` prints it."""
        text, source, _ = self._spec(spec)
        response = self._call("PlanJob", job_pb2.PlanJobRequest(
            spec_yaml=text, source_name=source, max_candidates=candidates, profile=profile))
        return json.loads(response.json)


@dataclass
class Job:
    """A job on the cluster. `state` and `info()` ask the coordinator anew."""

    id: str
    name: str = ""
    owner: str = ""
    client: Optional[Client] = field(default=None, repr=False, compare=False)

    @classmethod
    def _from(cls, client: Client, message: "job_pb2.Job") -> "Job":
        return cls(id=message.id, name=message.name, owner=message.owner, client=client)

    def _client(self) -> Client:
        if self.client is None:
            raise LoomError(None, "this Job has no client")
        return self.client

    def info(self) -> "job_pb2.Job":
        """The whole job message (state, plan, placement, history, incidents)."""
        return self._client()._call("GetJob", job_pb2.GetJobRequest(id=self.id, view=job_pb2.JOB_VIEW_FULL))

    @property
    def state(self) -> str:
        """PENDING, STARTING, RUNNING, RECOVERING, RESTARTING, PREEMPTED, SUCCEEDED, FAILED or
        CANCELLED."""
        return _state_name(self.info().state)

    def _watch(self, timeout: Optional[float]) -> Iterator["job_pb2.WatchJobResponse"]:
        try:
            yield from self._client()._stub.WatchJob(job_pb2.WatchJobRequest(id=self.id), timeout=timeout)
        except grpc.RpcError as error:
            if error.code() == grpc.StatusCode.DEADLINE_EXCEEDED and timeout is not None:
                raise TimeoutError(f"job {self.id} did not end within {timeout} s") from None
            raise LoomError.from_rpc(error) from None

    def steps(self, timeout: Optional[float] = None) -> Iterator[Dict[str, Any]]:
        """Each step as a dict (the `loomctl watch --format=jsonl` records),
        from the first, however late this starts, until the job ends."""
        last = (-1, -1)
        for update in self._watch(timeout):
            progress = list(update.backlog)
            progress.append(update.progress if update.HasField("progress") else update.job.last_progress)
            for p in progress:
                if p.step <= 0 or (p.attempt, p.step) <= last:
                    continue
                last = (p.attempt, p.step)
                yield step_record(p)

    def wait(self, timeout: Optional[float] = None) -> str:
        """Waits until the job ends and returns its final state; raises
        JobFailed (with the diagnosis) if it FAILED, TimeoutError after
        `timeout` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        final = None
        for update in self._watch(timeout):
            final = update.job
        if final is None or _state_name(final.state) not in FINAL_STATES:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            final = self._client()._call("GetJob", job_pb2.GetJobRequest(id=self.id), timeout=remaining)
        state = _state_name(final.state)
        if state == "FAILED":
            raise JobFailed(self.id, state, final.failure_reason or final.last_diagnosis)
        return state

    def logs(self, rank: int = 0, follow: bool = False, all_ranks: bool = False, tail: int = 0,
             attempt: int = 0) -> Iterator[str]:
        """A rank's log lines (every rank's, prefixed "[rank N] ", with
        all_ranks), from its node; `follow` keeps streaming until it ends."""
        request = job_pb2.StreamLogsRequest(id=self.id, rank=rank, all_ranks=all_ranks,
                                            follow=follow, tail_lines=tail, attempt=attempt)
        try:
            for response in self._client()._stub.StreamLogs(
                    request, timeout=None if follow else self._client().timeout * 10):
                for line in response.lines:
                    yield line.decode("utf-8", errors="replace")
        except grpc.RpcError as error:
            raise LoomError.from_rpc(error) from None

    def trace(self, step: int = 0, ranks: Optional[List[int]] = None,
              wait_seconds: int = 60) -> Dict[str, Any]:
        """Records one step (0: a few after the newest reported) on every rank
        (or `ranks`) of the running job and returns the Chrome trace-event
        document, as `loomctl trace` writes it (json.dump it to a file for
        ui.perfetto.dev); ranks whose trace did not come within wait_seconds
        are in its ["otherData"]["missing_ranks"]."""
        request = job_pb2.TraceJobRequest(id=self.id, step=step, ranks=ranks or [],
                                          wait_seconds=wait_seconds)
        response = self._client()._call("TraceJob", request, timeout=wait_seconds + 30)
        return json.loads(response.trace_json)

    def cancel(self) -> str:
        """Cancels the job; returns its state after the cancel was stored."""
        return _state_name(self._client()._call("CancelJob", job_pb2.CancelJobRequest(id=self.id)).state)
