#!/usr/bin/env python3
"""Federated averaging of a PyTorch model over xsilo, one process per party.

    PYTHONPATH=build/python /usr/bin/python3 examples/python/fedavg_torch.py \
        --clients 3 --rounds 3

starts 1 server and N client processes on this machine. The server (rank 0)
runs xsilo's FedAvg runtime from Python; each client trains a small torch
MLP on its own non-IID shard of a synthetic classification task, while
xsilo moves the weights over grpc+s3: metadata over gRPC, weights through
the S3-compatible object server that rank 0 embeds (nothing else to
install). The server prints one line per round and the final evaluation;
--json writes them to a file.

Every party can also be started by hand, e.g. on separate hosts:
    fedavg_torch.py --role server --address 0.0.0.0:50051 --clients 3
    fedavg_torch.py --role client --rank 1 --address SERVER:50051 --clients 3
"""

import argparse
import json
import math
import os
import socket
import subprocess
import sys

import torch
from torch import nn

import xsilo
import xsilo.fl

FEATURES, CLASSES = 32, 10


def make_model(seed):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(FEATURES, 128), nn.ReLU(), nn.Linear(128, CLASSES))


def client_data(rank, samples, seed):
    """Rank's shard: class centres shared by everyone, a rank-specific mix of
    classes (non-IID), 80% for training and 20% held out."""
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(CLASSES, FEATURES, generator=g) * 2.0
    g.manual_seed(seed * 1000 + rank)
    # Each client favours a few classes: Dirichlet-like weights from a Gamma draw.
    prefs = torch.distributions.Gamma(0.5, 1.0).sample((CLASSES,))
    labels = torch.multinomial(prefs / prefs.sum(), samples, replacement=True, generator=g)
    x = centres[labels] + torch.randn(samples, FEATURES, generator=g) * 1.5
    cut = int(samples * 0.8)
    return (x[:cut], labels[:cut]), (x[cut:], labels[cut:])


class MlpTrainer(xsilo.fl.TorchTrainer):
    def __init__(self, rank, args):
        super().__init__(make_model(args.seed))
        self.train_set, self.test_set = client_data(rank, args.samples, args.seed)
        self.batch = args.batch_size
        self.opt = torch.optim.SGD(self.model.parameters(), lr=args.lr)
        self.gen = torch.Generator().manual_seed(args.seed + rank)
        self.loss_fn = nn.CrossEntropyLoss()

    def train(self, epochs, steps):
        x, y = self.train_set
        n = len(y)
        if steps == 0:
            steps = max(1, epochs * math.ceil(n / self.batch))
        self.model.train()
        total = 0.0
        for _ in range(steps):
            idx = torch.randint(0, n, (self.batch,), generator=self.gen)
            self.opt.zero_grad()
            loss = self.loss_fn(self.model(x[idx]), y[idx])
            loss.backward()
            self.opt.step()
            total += loss.item()
        return {"samples": n, "loss": total / steps}

    def evaluate(self):
        x, y = self.test_set
        self.model.eval()
        with torch.no_grad():
            out = self.model(x)
            loss = self.loss_fn(out, y).item()
            accuracy = (out.argmax(1) == y).float().mean().item()
        return {"loss": loss, "accuracy": accuracy, "samples": len(y)}


def transport(args, rank):
    options = {}
    if args.transport.endswith("+s3"):
        # The model is small: send it through the object store all the same
        # (by default only tensors of 10 MiB and more go there).
        options["threshold"] = args.threshold
    return xsilo.Transport(args.transport, rank=rank, world_size=args.clients + 1,
                           address=args.address, options=options, connect_timeout=120)


def run_server(args):
    model = make_model(args.seed)
    report_rounds = []

    def on_round(r):
        report_rounds.append(r)
        print(f"round {r['round'] + 1}/{args.rounds}  clients {r['received']}/{r['selected']}  "
              f"eval loss {r['eval_loss']:.4f}  accuracy {r['eval_accuracy']:.3f}  "
              f"train loss {r['train_loss']:.4f}  {r['seconds']:.2f}s", flush=True)

    with transport(args, 0) as t:
        job = xsilo.fl.run_server(t, model.state_dict(), rounds=args.rounds,
                                  local_steps=args.local_steps, round_deadline=300,
                                  finish_deadline=120, on_round=on_round)
    final = job["final_evaluation"]
    print(f"final  clients {final['clients']}/{args.clients}  eval loss {final['loss']:.4f}  "
          f"accuracy {final['accuracy']:.3f}", flush=True)
    # The global model comes back as xsilo tensors: load it like any state_dict.
    model.load_state_dict({k: v.torch() for k, v in job["model"].items()})
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"transport": args.transport, "rounds": report_rounds, "final": final}, f,
                      indent=2)
    return 0


def run_client(args):
    trainer = MlpTrainer(args.rank, args)
    with transport(args, args.rank) as t:
        report = xsilo.fl.run_client(t, trainer, idle_timeout=600)
    return 0 if report["finished"] else 1


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(args):
    """Starts the server and every client as separate processes."""
    address = args.address or f"127.0.0.1:{free_port()}"
    common = [sys.executable, os.path.abspath(__file__), "--address", address,
              "--clients", str(args.clients), "--rounds", str(args.rounds),
              "--transport", args.transport, "--threshold", args.threshold,
              "--local-steps", str(args.local_steps), "--seed", str(args.seed)]
    server = subprocess.Popen(common + ["--role", "server"] +
                              (["--json", args.json] if args.json else []))
    clients = [subprocess.Popen(common + ["--role", "client", "--rank", str(r)])
               for r in range(1, args.clients + 1)]
    codes = [p.wait() for p in [server] + clients]
    if any(codes):
        print(f"fedavg_torch: exit codes server={codes[0]} clients={codes[1:]}", file=sys.stderr)
        return 1
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--role", choices=["launch", "server", "client"], default="launch")
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--clients", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--address", default="")
    ap.add_argument("--transport", default="grpc+s3")
    ap.add_argument("--threshold", default="always",
                    help="grpc+s3: tensors of at least this many bytes go through the object "
                         "store ('always', 'never' or bytes)")
    ap.add_argument("--local-steps", type=int, default=20)
    ap.add_argument("--samples", type=int, default=2000)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    torch.set_num_threads(1)  # several parties share this machine's cores
    if args.role == "server":
        return run_server(args)
    if args.role == "client":
        return run_client(args)
    return launch(args)


if __name__ == "__main__":
    sys.exit(main())
