"""Generates loom/v1/*_pb2.py and *_pb2_grpc.py from the repository's protos
into the build, so the installed package carries stubs that match them.

protoc (protobuf-compiler) writes the messages, grpc_python_plugin
(protobuf-compiler-grpc) the service stubs; grpc_tools.protoc is used instead
when those are not installed. The stubs are never committed.
"""
import glob
import os
import shutil
import subprocess
import sys

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
PROTO_ROOT = os.path.normpath(os.path.join(HERE, "..", "..", "proto"))


def generate(out_dir):
    protos = sorted(glob.glob(os.path.join(PROTO_ROOT, "loom", "v1", "*.proto")))
    if not protos:
        raise SystemExit(f"loom-client: no protos under {PROTO_ROOT}/loom/v1 (build from the "
                         "repository: pip install --no-build-isolation --no-deps ./client/python)")
    os.makedirs(os.path.join(out_dir, "loom", "v1"), exist_ok=True)
    protoc = shutil.which("protoc")
    plugin = shutil.which("grpc_python_plugin")
    if protoc and plugin:
        command = [protoc, f"-I{PROTO_ROOT}", f"--python_out={out_dir}", f"--grpc_out={out_dir}",
                   f"--plugin=protoc-gen-grpc={plugin}", *protos]
    else:
        command = [sys.executable, "-m", "grpc_tools.protoc", f"-I{PROTO_ROOT}",
                   f"--python_out={out_dir}", f"--grpc_python_out={out_dir}", *protos]
    subprocess.run(command, check=True)
    open(os.path.join(out_dir, "loom", "v1", "__init__.py"), "a").close()


class BuildWithStubs(build_py):
    def run(self):
        super().run()
        generate(self.build_lib)


setup(cmdclass={"build_py": BuildWithStubs})
