"""Generates the gRPC stubs (generate.sh: protoc + grpc_python_plugin) before setuptools runs.

Install with the Debian packages (no index needed):
    pip install --no-build-isolation --no-deps client/python
The metadata lives in pyproject.toml.
"""
import os
import subprocess
import sys

from setuptools import setup

here = os.path.dirname(os.path.abspath(__file__))
try:
    subprocess.run(["bash", os.path.join(here, "generate.sh")], check=True)
except (OSError, subprocess.CalledProcessError) as e:
    sys.exit(f"trisolve: generating the gRPC stubs failed ({e}); see generate.sh's message above")

setup()
