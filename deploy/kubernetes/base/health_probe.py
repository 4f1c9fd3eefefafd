#!/usr/bin/env python3
"""Liveness/readiness probe: asks the coordinator's grpc.health.v1 service
whether it is SERVING, over the same mutual TLS as every other caller (the
kubelet's built-in gRPC probe cannot do TLS). Exit 0 when serving, 1 when not
or unreachable, 2 on bad arguments. Needs only python3-grpcio.

usage: health_probe.py --address=HOST:PORT (--tls_dir=DIR | --insecure) [--timeout_s=3]
"""
import argparse
import os
import sys

import grpc

SERVING = b"\x08\x01"  # HealthCheckResponse{status: SERVING}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--address", required=True)
    parser.add_argument("--tls_dir")
    parser.add_argument("--insecure", action="store_true")
    parser.add_argument("--timeout_s", type=float, default=3.0)
    args = parser.parse_args()
    if bool(args.tls_dir) == args.insecure:
        parser.error("give exactly one of --tls_dir=DIR and --insecure")
    if args.insecure:
        channel = grpc.insecure_channel(args.address)
    else:
        def read(name):
            with open(os.path.join(args.tls_dir, name), "rb") as f:
                return f.read()
        creds = grpc.ssl_channel_credentials(read("ca.crt"), read("tls.key"), read("tls.crt"))
        channel = grpc.secure_channel(args.address, creds)
    # HealthCheckRequest{service: ""} is the empty message: the whole server.
    check = channel.unary_unary("/grpc.health.v1.Health/Check",
                                request_serializer=lambda _: b"",
                                response_deserializer=lambda b: b)
    try:
        status = check(None, timeout=args.timeout_s)
    except grpc.RpcError as e:
        print(f"health_probe: {args.address}: {e.code().name}: {e.details()}", file=sys.stderr)
        return 1
    if status != SERVING:
        print(f"health_probe: {args.address}: not SERVING ({status.hex()})", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
