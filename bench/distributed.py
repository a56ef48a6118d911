#!/usr/bin/env python3
"""Distributed throughput with 1, 2 and 4 CPU workers against embedded `rsembed run`.

Shows whether the queue costs throughput: one worker should be close to the
embedded run on the same input, and more workers should not be slower.

Builds nothing. First:

    cargo build --release -p rsembed-coordinator -p rsembed-worker --bins

then (ORT_DYLIB_PATH set; standard library only):

    python3 bench/distributed.py [--images 300] [--rounds 3] [--workers 1,2,4]

Every measurement gets a fresh nats-server store: the job id depends only on the
input and the model, so a reused server would find the job done and skip it.
Times are wall clock from process start (the embedded run, or the workers) to
the last chip file written, model loading included; `submit` is timed apart
and `finalize` is not run.
"""

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import zlib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def png(path, w, h, seed):
    """Writes a distinct RGB PNG without Pillow."""
    rows = bytearray()
    for y in range(h):
        rows.append(0)
        for x in range(w):
            rows += bytes(((x * 7 + y * 13 + seed * 29) & 255, ((x * 5) ^ seed) & 255, (y * 3 + seed) & 255))

    def chunk(tag, data):
        c = tag + data
        return struct.pack(">I", len(data)) + c + struct.pack(">I", zlib.crc32(c) & 0xFFFFFFFF)

    ihdr = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)
    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(bytes(rows), 6)) + chunk(b"IEND", b""))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Nats:
    def __init__(self, binary):
        self.store = tempfile.mkdtemp(prefix="nats-")
        self.port = free_port()
        self.url = f"nats://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [binary, "-js", "-a", "127.0.0.1", "-p", str(self.port), "-sd", self.store],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.time() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), 0.2).close()
                break
            except OSError:
                if time.time() > deadline:
                    raise SystemExit("nats-server did not start")
                time.sleep(0.05)

    def stop(self):
        self.proc.kill()
        self.proc.wait()
        shutil.rmtree(self.store, ignore_errors=True)


def env():
    e = dict(os.environ)
    e.setdefault("RSEMBED_LOG", "warn")
    e["NO_COLOR"] = "1"
    return e


def last_chip_file(out):
    """When the last chip file was written. Runs end there for both modes, and
    the poll that notices a finished job would lag by up to its interval;
    polling often enough to be exact would take CPU from the workers."""
    d = os.path.join(out, "chips")
    return max(os.stat(os.path.join(d, f)).st_mtime for f in os.listdir(d))


def embedded(a, bins, images, out):
    t0 = time.time()
    p = subprocess.run(
        [bins["rsembed"], "run", "--input", images, "--output", out, "--model", a.model,
         "--batch-size", str(a.batch_size), "--task-size", str(a.task_size), "--json"],
        capture_output=True, text=True, env=env())
    if p.returncode != 0:
        raise SystemExit(f"rsembed run failed:\n{p.stderr}")
    s = json.loads(p.stdout)
    return s["chips"], last_chip_file(out) - t0


def status(bins, nats, out):
    p = subprocess.run([bins["rsembed"], "status", "--nats", nats, "--output", out, "--json"],
                       capture_output=True, text=True, env=env())
    return json.loads(p.stdout) if p.returncode == 0 else None


def distributed(a, bins, images, out, k):
    nats = Nats(a.nats_server)
    workers = []
    logs = []
    try:
        t0 = time.monotonic()
        p = subprocess.run(
            [bins["rsembed"], "submit", "--nats", nats.url, "--input", images, "--output", out,
             "--model", a.model, "--task-size", str(a.task_size), "--json"],
            capture_output=True, text=True, env=env())
        submit_s = time.monotonic() - t0
        if p.returncode != 0:
            raise SystemExit(f"rsembed submit failed:\n{p.stderr}")
        intra = max(1, (os.cpu_count() or 1) // k)
        t0 = time.time()
        for i in range(k):
            log = tempfile.TemporaryFile()
            logs.append(log)
            workers.append(subprocess.Popen(
                [bins["rsembed-worker"], "--nats", nats.url, "--model", a.model,
                 "--batch-size", str(a.batch_size), "--intra-threads", str(intra),
                 "--name", f"bench-{k}-{i}"],
                stdout=log, stderr=subprocess.STDOUT, env=env()))
        deadline = time.monotonic() + a.timeout
        while True:
            s = status(bins, nats.url, out)
            if s and s.get("finished"):
                break
            if s and s.get("failed"):
                raise SystemExit(f"tasks failed: {s}")
            for w, log in zip(workers, logs):
                if w.poll() is not None:
                    log.seek(0)
                    raise SystemExit(f"a worker exited early:\n{log.read().decode(errors='replace')}")
            if time.monotonic() > deadline:
                raise SystemExit(f"not finished within {a.timeout}s: {s}")
            time.sleep(a.poll)
        return s["chips"], last_chip_file(out) - t0, submit_s
    finally:
        for w in workers:
            if w.poll() is None:
                w.send_signal(signal.SIGTERM)
        for w in workers:
            try:
                w.wait(timeout=30)
            except subprocess.TimeoutExpired:
                w.kill()
                w.wait()
        for log in logs:
            log.close()
        nats.stop()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--images", type=int, default=300)
    ap.add_argument("--size", type=int, default=256, help="image side in pixels (the tiny model's input is 256)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workers", default="1,2,4")
    ap.add_argument("--task-size", type=int, default=8)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--model", default=os.path.join(ROOT, "fixtures/models/tiny-siglip"))
    ap.add_argument("--target-dir", default=os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target")))
    ap.add_argument("--nats-server", default=os.environ.get("NATS_SERVER") or shutil.which("nats-server")
                    or os.path.join(ROOT, ".cache/venv/bin/nats-server"))
    ap.add_argument("--poll", type=float, default=0.2, help="seconds between status polls")
    ap.add_argument("--timeout", type=float, default=600)
    a = ap.parse_args()
    if not os.environ.get("ORT_DYLIB_PATH"):
        raise SystemExit("set ORT_DYLIB_PATH to libonnxruntime")
    bins = {b: os.path.join(a.target_dir, "release", b) for b in ("rsembed", "rsembed-worker")}
    for b in bins.values():
        if not os.access(b, os.X_OK):
            raise SystemExit(f"{b} missing: cargo build --release -p rsembed-coordinator -p rsembed-worker --bins")
    ks = [int(k) for k in a.workers.split(",")]
    work = tempfile.mkdtemp(prefix="rsembed-dist-")
    try:
        images = os.path.join(work, "images")
        os.makedirs(images)
        for i in range(a.images):
            png(os.path.join(images, f"img_{i:04d}.png"), a.size, a.size, i)
        print(f"{a.images} images {a.size}x{a.size}, task size {a.task_size}, batch {a.batch_size}, "
              f"{os.cpu_count()} cores, {a.rounds} rounds", flush=True)
        rates = {"embedded": []}
        rates.update({k: [] for k in ks})
        submits = []
        chips_seen = set()
        n = 0
        for r in range(1, a.rounds + 1):
            n += 1
            chips, secs = embedded(a, bins, images, os.path.join(work, f"out-{n}"))
            chips_seen.add(chips)
            rates["embedded"].append(chips / secs)
            line = [f"round {r}: embedded {chips / secs:7.1f}"]
            for k in ks:
                n += 1
                chips, secs, sub = distributed(a, bins, images, os.path.join(work, f"out-{n}"), k)
                chips_seen.add(chips)
                rates[k].append(chips / secs)
                submits.append(sub)
                line.append(f"{k}w {chips / secs:7.1f}")
            print("  ".join(line) + " chips/s", flush=True)
        if len(chips_seen) != 1:
            print(f"warning: chip counts differ between runs: {sorted(chips_seen)}", file=sys.stderr)
        base = statistics.median(rates["embedded"])
        print(f"\nchips per run: {sorted(chips_seen)}; submit median {statistics.median(submits):.2f}s (not in the times)")
        print("| workers | intra threads | chips/s (median) | vs embedded |")
        print("|---|---|---|---|")
        print(f"| embedded `rsembed run` | default | {base:.1f} | 1.00 |")
        for k in ks:
            m = statistics.median(rates[k])
            intra = max(1, (os.cpu_count() or 1) // k)
            print(f"| {k} | {intra} | {m:.1f} | {m / base:.2f} |")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
