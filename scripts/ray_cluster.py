#!/usr/bin/env python3
"""Run a command against a small two-node Ray cluster on this machine, then stop the cluster.

    python scripts/ray_cluster.py -- python my_job.py     # RAY_ADDRESS set for the command
    python scripts/ray_cluster.py                         # up until Ctrl-C

The cluster is the tests' (:mod:`tests.fixtures.raycluster`): a head node and one worker node,
one CPU and a 100 MB object store each, explicit free ports, a private temporary directory, a
token of its own (passed to the command in ``RAY_AUTH_MODE``/``RAY_AUTH_TOKEN``), and the
repository on the nodes' ``PYTHONPATH``. Every process it started is stopped on exit, also
when the command fails or is interrupted.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from tests.fixtures.raycluster import ray_cluster  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", nargs="*", help="the command to run (after --); none: wait for Ctrl-C")
    args = parser.parse_args(argv)
    with ray_cluster() as cluster:
        print(f"Ray cluster at {cluster.address} (temporary directory {cluster.temp_dir})", flush=True)
        if not args.command:
            try:
                threading.Event().wait()
            except KeyboardInterrupt:
                return 0
        env = {**os.environ, "RAY_ADDRESS": cluster.address}
        return subprocess.run(args.command, env=env).returncode
    return 0


if __name__ == "__main__":
    sys.exit(main())
