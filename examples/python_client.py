#!/usr/bin/env python3
"""Submits a job with the Python client, prints each step as it comes and
the final validation loss (docs/client.md).

    pip install --no-build-isolation --no-deps ./client/python
    LOOM_COORDINATOR=127.0.0.1:7070 LOOM_TLS_DIR=certs/user-alice \\
        python3 examples/python_client.py examples/tiny-llama.yaml
"""
import sys

import loom


def main() -> int:
    spec = sys.argv[1] if len(sys.argv) > 1 else "examples/tiny-llama.yaml"
    client = loom.Client()
    job = client.submit(spec)
    print(f"submitted {job.id}", flush=True)
    val_loss = None
    for step in job.steps():
        print(f"step {step['step']}/{step['total_steps']} loss {step['loss']:.4f}", flush=True)
        if "val_loss" in step:
            val_loss = step["val_loss"]
    try:
        state = job.wait()
    except loom.JobFailed as failure:
        print(f"{job.id} failed: {failure.diagnosis}", file=sys.stderr)
        return 1
    print(f"{job.id} {state}; final validation loss {val_loss:.4f}" if val_loss is not None
          else f"{job.id} {state}; no evaluation step")
    return 0 if state == "SUCCEEDED" else 1


if __name__ == "__main__":
    sys.exit(main())
