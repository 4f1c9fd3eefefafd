"""Loom's Python client: submit training jobs, follow their steps and logs.

    import loom
    client = loom.Client()                 # $LOOM_COORDINATOR, $LOOM_TLS_DIR, $LOOM_TOKEN
    job = client.submit("examples/tiny-llama.yaml")
    for step in job.steps():               # the `loomctl watch --format=jsonl` records
        print(step["step"], step["loss"])
    print(job.wait())                      # "SUCCEEDED"; raises JobFailed on FAILED

See docs/client.md.
"""
from loom.client import Client, Job
from loom.errors import JobFailed, LoomError

__all__ = ["Client", "Job", "JobFailed", "LoomError"]
