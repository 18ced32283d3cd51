#!/usr/bin/env python3
"""What Python costs: one model from a sender to a receiver process on
loopback, from C++, from Python through xsilo, and through the paper's
Python stack (grpcio + pickle, boto3 + grpcio), side by side in one run.

    PYTHONPATH=build/python /usr/bin/python3 bench/python_overhead.py \
        [--tier big] [--rounds 5] [--cycles 3] [--baseline-rounds 2] [--out DIR]

Every stack does the same exchange per round: the sender builds a fresh
float32 model (its values differ each round, so nothing is deduplicated),
the clock starts, the model goes to the receiver process, which verifies
the XXH3-64 checksum of the bytes it got and answers "ok"; the clock stops
when the answer is back. Stacks:

  cpp:xsilo-grpc      build/bench/broadcast_memory --backend grpc --clients 1 --streams 1
  cpp:xsilo-grpc+s3   the same with --backend grpc+s3 (embedded S3 server)
  py:xsilo-grpc       this script, xsilo.Transport("grpc"), state_dict in and out
  py:xsilo-grpc+s3    this script, xsilo.Transport("grpc+s3")
  py:grpcio+pickle    grpcio unary call carrying pickle.dumps(state_dict)
  py:boto3+grpcio     pickle -> boto3 upload_fileobj to `xsilo s3d`, the key
                      over grpcio, boto3 download_fileobj -> pickle.loads

The xsilo stacks run in blocks of --rounds timed rounds, the baselines in
blocks of --baseline-rounds (each block after one untimed first round);
C++, Python and the baseline of each backend alternate, --cycles times
each. Prints a table (median and min seconds per stack over all timed
rounds, and the ratios the issue asks for) and writes
<out>/python_overhead.json. Needs Debian's
python3-grpcio and python3-boto3 for the baselines (skipped with a note
when absent).
"""

import argparse
import io
import json
import os
import pickle
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import torch

import xsilo

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIERS = {"small": 1_200_000, "medium": 11_700_000, "big": 66_362_880, "large": 265_000_000}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


HUGE_PAGES = False  # --huge-pages: advise the sender's torch memory like xsilo's own


def advise_huge_pages(t):
    """madvise(MADV_HUGEPAGE) over t's memory before its first touch, as
    xsilo does for its own Buffers of 8 MiB and more (this machine's THP
    mode is 'madvise': torch's memory gets 4 KiB pages otherwise)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    start = (t.data_ptr() + 4095) // 4096 * 4096
    end = (t.data_ptr() + t.numel() * t.element_size()) // 4096 * 4096
    if end > start:
        libc.madvise(ctypes.c_void_p(start), ctypes.c_size_t(end - start), 14)


def model(params, seed):
    """A state_dict of one float32 tensor whose bytes depend on seed."""
    w = torch.empty(params, dtype=torch.float32)
    if HUGE_PAGES:
        advise_huge_pages(w)
    torch.arange(params, dtype=torch.float32, out=w)
    w.mul_(1e-7).add_(seed)
    return {"w": w}


# ---- xsilo from Python ------------------------------------------------------

def xsilo_receiver(backend, address, rounds):
    with xsilo.Transport(backend, rank=1, world_size=2, address=address,
                         connect_timeout=120) as t:
        for _ in range(rounds):
            m = t.receive(timeout=900)
            sd = m.to_state_dict()
            ok = f"{xsilo.checksum(sd['w']):016x}" == m.params["xxh3"]
            t.send(0, xsilo.Message(type="ok" if ok else "damaged", round=m.round), timeout=120)
            # Free this round's model now, as the C++ receiver does, not when
            # the next round's assignment replaces it (inside the next timing).
            del m, sd
        t.receive(timeout=120)  # "bye": the sender stops first


def xsilo_sender(backend, params, rounds):
    address = f"127.0.0.1:{free_port()}"
    peer = subprocess.Popen([sys.executable, __file__, "--role", "xsilo-receiver", "--backend",
                             backend, "--address", address, "--rounds", str(rounds)])
    times = []
    with xsilo.Transport(backend, rank=0, world_size=2, address=address,
                         connect_timeout=120) as t:
        for r in range(rounds):
            sd = model(params, r + 1)
            checksum = xsilo.checksum(sd["w"])
            t0 = time.perf_counter()
            msg = xsilo.Message.from_state_dict(sd, type="model", round=r,
                                                params={"xxh3": f"{checksum:016x}"})
            t.broadcast([1], msg, timeout=900)
            ack = t.receive(timeout=900)
            times.append(time.perf_counter() - t0)
            if ack.type != "ok":
                raise RuntimeError(f"receiver reported {ack.type}")
            # The sent model goes before the next round's clock starts, as
            # the C++ sender's does (otherwise its 265 MB are unmapped inside
            # the next round's timed region, when `msg` is rebound).
            del msg, ack
        t.send(1, xsilo.Message(type="bye"), timeout=60)
    if peer.wait(timeout=120) != 0:
        raise RuntimeError("xsilo receiver failed")
    return times


# ---- C++ --------------------------------------------------------------------

def cpp(backend, tier, rounds):
    exe = os.path.join(ROOT, "build", "bench", "broadcast_memory")
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "bm.json")
        subprocess.run([exe, "--backend", backend, "--tier", tier, "--clients", "1",
                        "--streams", "1", "--rounds", str(rounds), "--json", out],
                       check=True, stdout=subprocess.DEVNULL)
        with open(out) as f:
            data = json.load(f)
    if data["failures"]:
        raise RuntimeError(f"broadcast_memory {backend}: {data['failures']} failures")
    return [run["seconds"] for run in data["runs"]]


# ---- the paper's Python stack -------------------------------------------------

GRPC_OPTIONS = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]


def grpc_receiver(mode, address, s3_endpoint, s3_keys):
    import grpc
    from concurrent import futures

    s3 = boto3_client(s3_endpoint, s3_keys) if mode == "boto3" else None

    def handle(request, context):
        if mode == "pickle":
            payload = request
        else:
            key = request.decode()
            buf = io.BytesIO()
            s3.download_fileobj("bench", key, buf)
            payload = buf.getbuffer()
        sd, checksum = pickle.loads(payload)
        return b"ok" if xsilo.checksum(sd["w"]) == checksum else b"damaged"

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2), options=GRPC_OPTIONS)
    handler = grpc.method_handlers_generic_handler(
        "bench", {"Send": grpc.unary_unary_rpc_method_handler(handle)})
    server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port(address)
    server.start()
    server.wait_for_termination()


def boto3_client(endpoint, keys):
    import boto3
    from botocore.config import Config

    return boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=keys[0],
                        aws_secret_access_key=keys[1], region_name="us-east-1",
                        config=Config(s3={"addressing_style": "path"}))


def grpc_sender(mode, params, rounds, s3d=None):
    import grpc

    address = f"127.0.0.1:{free_port()}"
    args = [sys.executable, __file__, "--role", f"grpc-receiver-{mode}", "--address", address]
    if s3d:
        args += ["--s3-endpoint", s3d["endpoint"], "--s3-keys", ",".join(s3d["keys"])]
    peer = subprocess.Popen(args)
    s3 = boto3_client(s3d["endpoint"], s3d["keys"]) if mode == "boto3" else None
    try:
        channel = grpc.insecure_channel(address, options=GRPC_OPTIONS)
        grpc.channel_ready_future(channel).result(timeout=120)
        call = channel.unary_unary("/bench/Send")
        times = []
        for r in range(rounds):
            sd = model(params, r + 1)
            checksum = xsilo.checksum(sd["w"])
            t0 = time.perf_counter()
            data = pickle.dumps((sd, checksum), protocol=pickle.HIGHEST_PROTOCOL)
            if mode == "pickle":
                ack = call(data, timeout=900)
            else:
                key = f"model-{r}"
                s3.upload_fileobj(io.BytesIO(data), "bench", key)
                ack = call(key.encode(), timeout=900)
            times.append(time.perf_counter() - t0)
            if ack != b"ok":
                raise RuntimeError(f"receiver reported {ack!r}")
            del data  # freed outside the clock, as the xsilo senders' models are
            if mode == "boto3":
                # The server lives through the whole run: leave no model
                # in its memory for the blocks after this one.
                s3.delete_object(Bucket="bench", Key=key)
        channel.close()
        return times
    finally:
        peer.kill()
        peer.wait()


def start_s3d():
    exe = os.path.join(ROOT, "build", "tools", "xsilo", "xsilo")
    d = tempfile.mkdtemp()
    port_file = os.path.join(d, "port")
    keys = ("benchaccess", "benchsecret0123456789")
    proc = subprocess.Popen([exe, "s3d", "--memory", "--port-file", port_file, "--access-key",
                             keys[0], "--secret-key", keys[1], "--bucket", "bench"],
                            stdout=subprocess.DEVNULL)
    try:
        for _ in range(600):
            if os.path.exists(port_file) and open(port_file).read().strip():
                break
            if proc.poll() is not None:
                break
            time.sleep(0.05)
        port = int(open(port_file).read().strip())
    except (OSError, ValueError):
        proc.kill()
        proc.wait()
        raise RuntimeError(f"xsilo s3d did not start (exit code {proc.returncode})")
    finally:
        shutil.rmtree(d, ignore_errors=True)
    return proc, {"endpoint": f"http://127.0.0.1:{port}", "keys": keys}


# ---- driver -------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tier", default="big", choices=sorted(TIERS))
    ap.add_argument("--rounds", type=int, default=5,
                    help="timed rounds per block (after one untimed first round)")
    ap.add_argument("--cycles", type=int, default=3,
                    help="C++, Python and baseline blocks of each backend, alternated, this many "
                         "times each")
    ap.add_argument("--baseline-rounds", type=int, default=2,
                    help="timed rounds of each baseline per cycle (after one untimed round)")
    ap.add_argument("--stacks", default="cpp,py,baselines",
                    help="which to run: cpp, py, baselines (comma separated)")
    ap.add_argument("--out", default=os.path.join(ROOT, "results", "python-overhead"))
    ap.add_argument("--huge-pages", action="store_true",
                    help="advise the Python sender's model memory for huge pages, as the C++ "
                         "sender's Buffers are")
    ap.add_argument("--role", default="driver")
    ap.add_argument("--backend", default="grpc")
    ap.add_argument("--address", default="")
    ap.add_argument("--s3-endpoint", default="")
    ap.add_argument("--s3-keys", default="")
    args = ap.parse_args()
    if args.rounds < 1 or args.cycles < 1 or args.baseline_rounds < 1:
        ap.error("--rounds, --cycles and --baseline-rounds must be at least 1")
    torch.set_num_threads(1)

    if args.role == "xsilo-receiver":
        return xsilo_receiver(args.backend, args.address, args.rounds)
    if args.role.startswith("grpc-receiver-"):
        return grpc_receiver(args.role.rsplit("-", 1)[1], args.address, args.s3_endpoint,
                             tuple(args.s3_keys.split(",")) if args.s3_keys else None)

    global HUGE_PAGES
    HUGE_PAGES = args.huge_pages
    params = TIERS[args.tier]
    nbytes = params * 4
    stacks = set(args.stacks.split(","))
    results = {}
    first_rounds = {}
    notes = []
    baselines = "baselines" in stacks
    if baselines:
        try:
            import boto3  # noqa: F401  (only whether they are installed)
            import grpc  # noqa: F401
        except ImportError as e:
            notes.append(f"baselines skipped: {e} (apt-get install python3-grpcio python3-boto3)")
            baselines = False
    # The blocks alternate, cycle after cycle: C++ xsilo, Python xsilo and
    # the paper's stack for the same backend, in that order in even cycles
    # and reversed in odd ones, so that the machine's drift over a run
    # weighs on all three alike (the ratios compare medians over the whole
    # run). Each block's first round (connection set-up, first touch of the
    # buffers) is kept apart from the timings.
    s3d = info = None
    if baselines:
        s3d, info = start_s3d()
    try:
        for cycle in range(args.cycles):
            for backend, base in [("grpc", "pickle"), ("grpc+s3", "boto3")]:
                order = [s for s in ("cpp", "py") if s in stacks]
                if baselines:
                    order.append("base")
                if cycle % 2:
                    order.reverse()
                for stack in order:
                    if stack == "cpp":
                        key = f"cpp:xsilo-{backend}"
                        t = cpp(backend, args.tier, args.rounds + 1)
                    elif stack == "py":
                        key = f"py:xsilo-{backend}"
                        t = xsilo_sender(backend, params, args.rounds + 1)
                    else:
                        key = "py:grpcio+pickle" if base == "pickle" else "py:boto3+grpcio"
                        t = grpc_sender(base, params, args.baseline_rounds + 1,
                                        info if base == "boto3" else None)
                    first_rounds.setdefault(key, []).append(t[0])
                    results.setdefault(key, []).extend(t[1:])
    finally:
        if s3d is not None:
            s3d.kill()
            s3d.wait()

    med = {k: statistics.median(v) for k, v in results.items()}
    print(f"{args.tier} tier: {nbytes / 1e6:.1f} MB float32, {args.cycles} cycles of "
          f"{args.rounds} rounds (xsilo) and {args.baseline_rounds} (baselines), loopback, "
          f"sender -> receiver process, checksum verified, answer back")
    print(f"{'stack':22} {'median_s':>9} {'min_s':>8} {'MB/s':>8}")
    for k, v in results.items():
        print(f"{k:22} {med[k]:9.3f} {min(v):8.3f} {nbytes / 1e6 / med[k]:8.1f}")
    ratios = {}
    for backend in ["grpc", "grpc+s3"]:
        c, p = f"cpp:xsilo-{backend}", f"py:xsilo-{backend}"
        if c in med and p in med:
            ratios[f"python_over_cpp:{backend}"] = med[p] / med[c]
    for base, backend in [("py:grpcio+pickle", "grpc"), ("py:boto3+grpcio", "grpc+s3")]:
        p = f"py:xsilo-{backend}"
        if base in med and p in med:
            ratios[f"{base}_over_xsilo-{backend}"] = med[base] / med[p]
    for k, v in ratios.items():
        print(f"{k:40} {v:7.3f}")
    for n in notes:
        print(n)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "python_overhead.json")
    with open(path, "w") as f:
        json.dump({"benchmark": "python_overhead", "tier": args.tier, "bytes": nbytes,
                   "huge_pages": HUGE_PAGES,
                   "rounds": args.rounds, "baseline_rounds": args.baseline_rounds,
                   "cycles": args.cycles, "seconds": results,
                   "first_round_seconds": first_rounds, "median_seconds": med,
                   "ratios": ratios, "notes": notes}, f, indent=2)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
