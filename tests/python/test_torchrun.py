"""Two processes under torchrun (Gloo) train as one process on the same global batch."""

import json
import os
import socket
import subprocess
import sys

import pytest

from models import assert_close

HERE = os.path.dirname(os.path.abspath(__file__))
TORCHRUN = os.path.join(os.path.dirname(sys.executable), "torchrun")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(tmp_path, nproc, mode):
    out = str(tmp_path / f"{mode}-{nproc}")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([HERE, os.environ.get("PYTHONPATH", "")]))
    if nproc == 1:
        cmd = [sys.executable, os.path.join(HERE, "dp_worker.py"), out, mode]
    else:
        cmd = [TORCHRUN, "--nnodes", "1", "--nproc-per-node", str(nproc), "--master-addr", "127.0.0.1",
               "--master-port", str(free_port()), os.path.join(HERE, "dp_worker.py"), out, mode]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    ranks = [json.load(open(f"{out}.{i}")) for i in range(nproc)]
    assert all(x["world"] == nproc for x in ranks)
    return [sum(x["losses"][s] for x in ranks) / nproc for s in range(len(ranks[0]["losses"]))]


@pytest.mark.skipif(not os.path.exists(TORCHRUN), reason="no torchrun beside the interpreter")
@pytest.mark.parametrize("mode", ["offload", "resident"])
def test_two_processes_equal_one(tmp_path, mode):
    one = run(tmp_path, 1, mode)
    two = run(tmp_path, 2, mode)
    assert_close(two, one, 1e-5)
