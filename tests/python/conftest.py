"""Shared fixtures: free ports and separate peer processes (peer.py)."""

import json
import os
import socket
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
PEER = os.path.join(HERE, "peer.py")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Peers:
    """Starts peer.py roles as processes; collects their JSON reports."""

    def __init__(self):
        self.procs = []

    def start(self, role, **args):
        p = subprocess.Popen([sys.executable, PEER, role, json.dumps(args)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.procs.append(p)
        return p

    @staticmethod
    def report(p, timeout=600):
        out, err = p.communicate(timeout=timeout)
        assert p.returncode == 0, f"peer failed ({p.returncode}):\n{out}\n{err}"
        return json.loads(out.strip().splitlines()[-1])

    def kill_all(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()


@pytest.fixture
def peers():
    ps = Peers()
    yield ps
    ps.kill_all()


@pytest.fixture
def address():
    return f"127.0.0.1:{free_port()}"
