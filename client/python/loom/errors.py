"""Errors of the Loom client: each keeps the gRPC status code and message."""
from typing import Optional

import grpc


class LoomError(Exception):
    """A call the coordinator refused or could not answer.

    `code` is the grpc.StatusCode (e.g. NOT_FOUND, PERMISSION_DENIED,
    INVALID_ARGUMENT naming the spec field at fault); `message` its text.
    """

    def __init__(self, code: Optional[grpc.StatusCode], message: str):
        super().__init__(f"{code.name if code else 'ERROR'}: {message}")
        self.code = code
        self.message = message

    @classmethod
    def from_rpc(cls, error: grpc.RpcError) -> "LoomError":
        return cls(error.code(), error.details() or str(error))


class JobFailed(LoomError):
    """Job.wait() on a job that ended FAILED (or CANCELLED): `state` and
    `diagnosis` (the coordinator's failure reason) say why."""

    def __init__(self, job_id: str, state: str, diagnosis: str):
        super().__init__(None, f"job {job_id} ended {state}: {diagnosis}")
        self.job_id = job_id
        self.state = state
        self.diagnosis = diagnosis
