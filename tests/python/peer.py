"""One party of a multi-process test: `python peer.py <role> <json args>`.

Prints one JSON line with what it saw as its last stdout line; exits
non-zero on failure. The tests in this folder start these as subprocesses,
so every party is a real, separate process (as in a federation).
"""

import json
import os
import sys
import zlib

import torch

import xsilo
import xsilo.fl


def vm(field):
    """A /proc/self/status figure in bytes (VmRSS, VmHWM)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(field)


def reset_peak_rss():
    """Resets VmHWM to the current RSS (Linux >= 4.0)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def crc_of(t):
    """crc32 of a tensor's bytes, read through a zero-copy numpy view."""
    x = xsilo.tensor(t) if not isinstance(t, xsilo.Tensor) else t
    return zlib.crc32(memoryview(x).cast("B"))


def transport(args, rank):
    return xsilo.Transport(
        args["transport"], rank=rank, world_size=args["world_size"], address=args["address"],
        options=args.get("options", {}), connect_timeout=120)


def send_big(args):
    """Rank 0: sends one tensor of args['nbytes'] to every client; reports its RSS growth."""
    n = args["nbytes"] // 4
    payload = torch.ones(n, dtype=torch.float32)
    payload[::4096] = torch.arange(0, n, 4096, dtype=torch.float32)  # not all equal bytes
    crc = crc_of(payload)
    msg = xsilo.Message.from_state_dict({"weights": payload}, type="big")
    with transport(args, 0) as t:
        peers = list(range(1, args["world_size"]))
        rss_before = vm("VmRSS")
        reset_peak_rss()
        t.broadcast(peers, msg, timeout=300)
        peak = vm("VmHWM")
        done = [t.receive(timeout=300) for _ in peers]
        ok = all(d.params.get("crc") == crc for d in done)
        for p in peers:
            t.send(p, xsilo.Message(type="bye"), timeout=120)
    print(json.dumps({"rss_before": rss_before, "peak": peak, "growth": peak - rss_before,
                      "crc": crc, "clients_ok": ok}))
    return 0 if ok else 1


def receive_big(args):
    """Client: receives the big tensor, checks that it views the received bytes."""
    with transport(args, args["rank"]) as t:
        m = t.receive(timeout=300)
        w = m.tensors["weights"]
        base, length = w.storage
        arr = w.numpy()
        ten = m.to_state_dict()["weights"]
        inside = (base <= arr.ctypes.data and arr.ctypes.data + arr.nbytes <= base + length
                  and ten.data_ptr() == arr.ctypes.data and w.data_ptr == arr.ctypes.data)
        crc = crc_of(w)
        t.send(0, xsilo.Message(type="done", params={"crc": crc}), timeout=120)
        if t.receive(timeout=120).type != "bye":
            return 1
    print(json.dumps({"inside": inside, "readonly": not arr.flags.writeable, "crc": crc,
                      "nbytes": w.nbytes, "storage_len": length}))
    return 0


def echo(args):
    """Rank 1: sends every message it receives back to rank 0, until 'stop'."""
    with transport(args, 1) as t:
        while True:
            m = t.receive(timeout=120)
            if m.type == "stop":
                break
            t.send(0, m, timeout=120)
    print(json.dumps({"ok": True}))
    return 0


def resolve(args):
    """Resolves a pickled proxy (hex) in this process and reports checksums."""
    import pickle

    p = pickle.loads(bytes.fromhex(args["proxy"]))
    target = p.resolve()
    if isinstance(target, dict):
        out = {k: [str(v.dtype), list(v.shape), crc_of(v.contiguous())] for k, v in target.items()}
    elif isinstance(target, memoryview):
        out = {"bytes": zlib.crc32(target), "len": len(target)}
    else:
        out = {"type": type(target).__name__}
    print(json.dumps(out))
    return 0


class OffsetTrainer(xsilo.fl.Trainer):
    """Client k turns the model w into w + k and weighs it k."""

    def __init__(self, rank):
        super().__init__()
        self.rank = rank
        self.w = torch.zeros(4)

    def get_parameters(self):
        return {"w": self.w.clone()}

    def set_parameters(self, tensors):
        self.w = tensors["w"].torch().clone()

    def train(self, epochs, steps):
        self.w += self.rank
        return {"samples": self.rank, "loss": 1.0}

    def evaluate(self):
        return {"loss": float(self.w[0]), "accuracy": 0.5, "samples": 1}


def fl_server(args):
    """Rank 0 with a checkpoint directory; with die_after_round it SIGKILLs
    itself once that round is finished (and checkpointed)."""
    import signal

    rounds = []

    def on_round(r):
        rounds.append(r["round"])
        if r["round"] == args.get("die_after_round"):
            os.kill(os.getpid(), signal.SIGKILL)

    with transport(args, 0) as t:
        job = xsilo.fl.run_server(t, {"w": torch.zeros(4)}, rounds=args["rounds"],
                                  round_deadline=120, finish_deadline=120, on_round=on_round,
                                  checkpoint_dir=args["checkpoint_dir"])
    print(json.dumps({"rounds": rounds, "w": job["model"]["w"].torch().tolist(),
                      "final_clients": job["final_evaluation"]["clients"]}))
    return 0


def fl_client(args):
    with transport(args, args["rank"]) as t:
        report = xsilo.fl.run_client(t, OffsetTrainer(args["rank"]), idle_timeout=300)
    print(json.dumps({"finished": report["finished"], "rounds": report["rounds_trained"]}))
    return 0


ROLES = {"fl_server": fl_server, "fl_client": fl_client, "send_big": send_big, "receive_big": receive_big, "echo": echo, "resolve": resolve}

if __name__ == "__main__":
    sys.exit(ROLES[sys.argv[1]](json.loads(sys.argv[2])))
