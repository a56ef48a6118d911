#!/usr/bin/env python3
"""Control-plane scale benchmark (issue 29): status, finalize, manifest sizes,
JetStream bytes per task and the resume of an embedded run, at 10^4 to 10^7 tasks.

Builds nothing. First:

    cargo build --release -p rsembed-coordinator -p rsembed-worker -p rsembed-bench-scale --bins

then (ORT_DYLIB_PATH set for the embedded run's resume; standard library only):

    python3 bench/scale/scale.py --sizes 10000,100000 --json scale.json

Per size, in stages that a rerun with the same --work skips when done:

  inputs    N one-pixel PNG files (one chip each; hard links of one file), in
            folders of 1000
  submit    the real `rsembed submit --task-files 1`: N tasks, tasks.txt
  work      --workers `scale-worker` processes: the worker's own pull loop,
            task runner and state writes, with the simulated engine, until the
            task stream is empty
  records   (sizes above --generate-above only) the job above is one image;
            `scale-records` grows it to N done tasks through JobState::put_done
            with generated records and sparse placeholder chip files
  jetstream the sum of every stream's state.bytes (tombstones included), from
            nats-server's monitoring endpoint, divided by the tasks
  status    --polls runs of `rsembed status --json`: wall time and peak RSS
  finalize  `rsembed finalize --json`: wall time and peak RSS
  sizes     manifest.json, manifest/files.parquet, manifest/failures.parquet
  resume    `rsembed run` on the same input and output, every task done
            (sizes up to --resume-max), twice: the first reads the workers'
            chip files whole once and leaves a done record per task, the
            second resumes from the records; wall time and peak RSS

Results go to the --json file (merged by size, so sizes can be run apart) and
a markdown table of every size in it is printed.
"""

import argparse
import json
import os
import platform
import shutil
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
PER_DIR = 1000


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def tiny_png():
    """The smallest PNG the worker takes as a whole image: 1x1 RGB, 69 bytes."""

    def chunk(tag, data):
        c = tag + data
        return struct.pack(">I", len(data)) + c + struct.pack(">I", zlib.crc32(c) & 0xFFFFFFFF)

    ihdr = struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr)
            + chunk(b"IDAT", zlib.compress(b"\x00\x80\x40\x20", 9)) + chunk(b"IEND", b""))


def write_images(folder, n):
    """n inputs, all hard links of one PNG: a file of its own would take a
    4 KiB block each (4 GB at 10^6), and the planner and the worker see
    distinct paths, which is all that tells inputs apart."""
    # ext4 allows 65,000 links to one inode: a new source every 60,000.
    first = None
    for i in range(n):
        if i % 60_000 == 0:
            if first:
                os.remove(first)
            first = os.path.join(folder, f"tiny{i // 60_000}.png")
            with open(first, "wb") as f:
                f.write(tiny_png())
        d = os.path.join(folder, f"d{i // PER_DIR:05d}")
        if i % PER_DIR == 0:
            os.makedirs(d, exist_ok=True)
        os.link(first, os.path.join(d, f"i{i:08d}.png"))
    if first:
        os.remove(first)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def disk_usage(path):
    """Bytes allocated on disk under `path` (st_blocks, so sparse files count
    for what they hold) and the number of files."""
    used, files = 0, 0
    for dirpath, _, names in os.walk(path):
        for n in names:
            st = os.lstat(os.path.join(dirpath, n))
            used += st.st_blocks * 512
            files += 1
    return used, files


class Nats:
    """nats-server with JetStream and the monitoring endpoint, on a store that
    outlives it (a rerun of the benchmark restarts it on the same store)."""

    def __init__(self, binary, store, log_path):
        self.port, self.mport = free_port(), free_port()
        self.url = f"nats://127.0.0.1:{self.port}"
        self.log = open(log_path, "ab")
        self.proc = subprocess.Popen(
            [binary, "-js", "-a", "127.0.0.1", "-p", str(self.port), "-m", str(self.mport),
             "-sd", store],
            stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 60
        while True:
            try:
                self.get("/healthz?js-enabled-only=true")
                break
            except OSError:
                if time.time() > deadline or self.proc.poll() is not None:
                    raise SystemExit(f"nats-server did not start (log: {log_path})")
                time.sleep(0.1)

    def get(self, path):
        with urllib.request.urlopen(f"http://127.0.0.1:{self.mport}{path}", timeout=60) as r:
            return json.loads(r.read())

    def streams(self):
        """Every stream of every account: name -> state (messages, bytes, ...)."""
        j = self.get("/jsz?accounts=true&streams=true")
        out = {}
        for acc in j.get("account_details") or []:
            for s in acc.get("stream_detail") or []:
                out[s["name"]] = s["state"]
        return out, j

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def env():
    e = dict(os.environ)
    e.setdefault("RSEMBED_LOG", "warn")
    e["NO_COLOR"] = "1"
    return e


def timed(cmd, log_dir, name, timeout):
    """Runs `cmd`; returns (exit code, stdout, wall seconds, peak RSS in bytes)
    with the RSS from wait4's rusage (the process alone, not its children)."""
    out_path = os.path.join(log_dir, f"{name}.out")
    err_path = os.path.join(log_dir, f"{name}.err")
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        t0 = time.monotonic()
        p = subprocess.Popen(cmd, stdout=out, stderr=err, env=env())
        watchdog = threading.Timer(timeout, p.kill)
        watchdog.start()
        _, status, ru = os.wait4(p.pid, 0)
        wall = time.monotonic() - t0
        watchdog.cancel()
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode == -signal.SIGKILL and wall >= timeout:
        return None, "", wall, ru.ru_maxrss * 1024
    with open(out_path) as f:
        stdout = f.read()
    return p.returncode, stdout, wall, ru.ru_maxrss * 1024


def must(rc, stdout, log_dir, name):
    if rc != 0:
        with open(os.path.join(log_dir, f"{name}.err")) as f:
            err = f.read()[-4000:]
        raise SystemExit(f"{name} failed (exit {rc}):\n{err}\n{stdout[-2000:]}")


def last_json(stdout):
    """The JSON document a command printed (the last line that parses)."""
    try:
        return json.loads(stdout)
    except ValueError:
        for line in reversed(stdout.strip().splitlines()):
            try:
                return json.loads(line)
            except ValueError:
                continue
    return None


class Size:
    """One size's work folder and the stages it has done."""

    def __init__(self, a, n):
        self.a, self.n = a, n
        self.generated = n > a.generate_above
        self.dir = os.path.join(a.work, f"n{n}")
        self.images = os.path.join(self.dir, "images")
        self.out = os.path.join(self.dir, "out")
        self.store = os.path.join(self.dir, "nats")
        self.logs = os.path.join(self.dir, "logs")
        self.state_path = os.path.join(self.dir, "stages.json")
        os.makedirs(self.logs, exist_ok=True)
        self.stages = {}
        if os.path.exists(self.state_path):
            with open(self.state_path) as f:
                self.stages = json.load(f)

    def save(self, stage, result):
        self.stages[stage] = result
        tmp = self.state_path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.stages, f, indent=1)
        os.replace(tmp, self.state_path)


def stage_inputs(s):
    n = 1 if s.generated else s.n
    if os.path.isdir(s.images):
        shutil.rmtree(s.images)
    os.makedirs(s.images)
    t0 = time.monotonic()
    write_images(s.images, n)
    return {"images": n, "seconds": time.monotonic() - t0, "hard_links_of_one_file": True}


def stage_submit(s, bins, nats):
    rc, out, wall, rss = timed(
        [bins["rsembed"], "submit", "--nats", nats.url, "--input", s.images, "--output", s.out,
         "--model", s.a.model, "--task-files", "1", "--json"],
        s.logs, "submit", s.a.timeout)
    must(rc, out, s.logs, "submit")
    j = last_json(out)
    return {"tasks": j["tasks"], "published": j["published"], "seconds": wall, "peak_rss": rss}


def stage_work(s, bins, nats):
    k = s.a.workers
    workers = []
    t0 = time.monotonic()
    for i in range(k):
        out = open(os.path.join(s.logs, f"worker-{i}.out"), "ab")
        err = open(os.path.join(s.logs, f"worker-{i}.err"), "ab")
        workers.append((subprocess.Popen(
            [bins["scale-worker"], "--nats", nats.url, "--model", s.a.model,
             "--tasks-in-flight", str(s.a.tasks_in_flight), "--decode-threads", "1",
             "--name", f"scale-{i}"],
            stdout=out, stderr=err, env=env()), out, err))
    last_report = 0
    try:
        while True:
            streams, _ = nats.streams()
            left = streams.get("RSEMBED_TASKS", {}).get("messages", 0)
            if left == 0:
                break
            for w, _, _ in workers:
                if w.poll() is not None:
                    raise SystemExit(f"a scale-worker exited early; see {s.logs}/worker-*.err")
            if time.monotonic() - last_report > 60:
                last_report = time.monotonic()
                log(f"  {left} tasks left after {time.monotonic() - t0:.0f}s")
            if time.monotonic() - t0 > s.a.work_timeout:
                raise SystemExit(f"tasks not done within {s.a.work_timeout}s: {left} left")
            time.sleep(1)
        wall = time.monotonic() - t0
    finally:
        for w, _, _ in workers:
            if w.poll() is None:
                w.send_signal(signal.SIGTERM)
        for w, out, err in workers:
            try:
                w.wait(timeout=120)
            except subprocess.TimeoutExpired:
                w.kill()
                w.wait()
            out.close()
            err.close()
    tally = {"done": 0, "failed": 0, "retried": 0}
    for i in range(k):
        with open(os.path.join(s.logs, f"worker-{i}.out")) as f:
            rep = last_json(f.read()) or {}
        for key in tally:
            tally[key] += rep.get(key, 0)
    if tally["failed"]:
        raise SystemExit(f"{tally['failed']} tasks failed; see {s.logs}/worker-*.err")
    chips_used, chips_files = disk_usage(os.path.join(s.out, "chips"))
    tasks = s.stages["submit"]["tasks"]
    return {"workers": k, "tasks_in_flight": s.a.tasks_in_flight, "seconds": wall,
            "tasks_per_s": tasks / wall, "tally": tally,
            "chip_files": chips_files, "chip_disk_bytes": chips_used}


def stage_records(s, bins, nats):
    rc, out, wall, rss = timed(
        [bins["scale-records"], "--nats", nats.url, "--output", s.out, "--tasks", str(s.n),
         "--placeholders", s.a.placeholders],
        s.logs, "records", s.a.work_timeout)
    must(rc, out, s.logs, "records")
    return {"seconds": wall, "peak_rss": rss, "records_per_s": s.n / wall, **(last_json(out) or {})}


def stage_jetstream(s, nats):
    streams, j = nats.streams()
    total = sum(st.get("bytes", 0) for st in streams.values())
    varz = nats.get("/varz")
    return {"streams": {k: {"messages": v.get("messages"), "bytes": v.get("bytes"),
                            "num_subjects": v.get("num_subjects"),
                            "num_deleted": v.get("num_deleted")} for k, v in streams.items()},
            "bytes": total, "bytes_per_task": total / s.n, "store": j.get("store"),
            "nats_server_mem": varz.get("mem"), "nats_server_version": varz.get("version")}


def stage_status(s, bins, nats):
    polls = []
    first = None
    for i in range(s.a.polls):
        rc, out, wall, rss = timed(
            [bins["rsembed"], "status", "--nats", nats.url, "--output", s.out, "--json"],
            s.logs, "status", s.a.timeout)
        if rc is None:
            polls.append({"wall": wall, "peak_rss": rss, "timed_out": True})
            log(f"  status poll {i + 1} timed out after {wall:.0f}s; no more polls")
            break
        must(rc, out, s.logs, "status")
        j = last_json(out)
        if first is None:
            first = j
            if not j.get("finished") or j.get("done") != s.n:
                raise SystemExit(f"status does not show {s.n} tasks done: {j}")
        polls.append({"wall": wall, "peak_rss": rss})
    walls = [p["wall"] for p in polls]
    rss = [p["peak_rss"] for p in polls]
    return {"polls": polls, "wall_median": statistics.median(walls), "wall_min": min(walls),
            "wall_max": max(walls), "peak_rss_median": statistics.median(rss),
            "peak_rss_max": max(rss), "done": first and first.get("done")}


def stage_finalize(s, bins, nats):
    rc, out, wall, rss = timed(
        [bins["rsembed"], "finalize", "--nats", nats.url, "--output", s.out, "--json"],
        s.logs, "finalize", s.a.finalize_timeout)
    if rc is None:
        return {"timed_out": True, "seconds": wall, "peak_rss": rss}
    must(rc, out, s.logs, "finalize")
    j = last_json(out) or {}
    if not j.get("manifest"):
        raise SystemExit(f"finalize wrote no manifest: {j}")
    return {"seconds": wall, "peak_rss": rss, "tasks_per_s": s.n / wall,
            "rows": j.get("rows"), "done": j.get("done")}


def file_size(path):
    try:
        return os.path.getsize(path)
    except OSError:
        return None


def stage_sizes(s):
    stac = os.path.join(s.out, "stac")
    stac_bytes, stac_files = disk_usage(stac) if os.path.isdir(stac) else (0, 0)
    return {"manifest_json": file_size(os.path.join(s.out, "manifest.json")),
            "files_parquet": file_size(os.path.join(s.out, "manifest", "files.parquet")),
            "failures_parquet": file_size(os.path.join(s.out, "manifest", "failures.parquet")),
            "tasks_txt": file_size(os.path.join(s.out, "tasks.txt")),
            "stac_items_parquet": file_size(os.path.join(stac, "items.parquet")),
            "stac_files": stac_files, "stac_disk_bytes": stac_bytes}


def stage_resume(s, bins):
    """Two resumes: the first finds chip files the workers wrote and no done
    record in state/ (it reads each file whole once and writes its record),
    the second resumes from those records; `seconds` is the second's."""
    runs = []
    for name in ("resume-first", "resume"):
        rc, out, wall, rss = timed(
            [bins["rsembed"], "run", "--input", s.images, "--output", s.out, "--model", s.a.model,
             "--task-files", "1", "--json"],
            s.logs, name, s.a.finalize_timeout)
        if rc is None:
            return {"timed_out": True, "seconds": wall, "peak_rss": rss}
        must(rc, out, s.logs, name)
        j = last_json(out) or {}
        if j.get("tasks_resumed") != s.n:
            raise SystemExit(f"the embedded run resumed {j.get('tasks_resumed')} of {s.n} tasks: {j}")
        runs.append((wall, rss, j))
    (first_wall, first_rss, _), (wall, rss, j) = runs
    return {"seconds": wall, "peak_rss": rss, "tasks_resumed": j.get("tasks_resumed"),
            "chips_embedded": j.get("chips_embedded"),
            "first_seconds": first_wall, "first_peak_rss": first_rss}


def run_size(a, bins, n):
    s = Size(a, n)
    mode = "generated records" if s.generated else "real tasks"
    log(f"{n} tasks ({mode}) in {s.dir}")
    nats = Nats(a.nats_server, s.store, os.path.join(s.logs, "nats-server.log"))
    try:
        def stage(name, fn, *args):
            if name in s.stages:
                log(f"  {name}: done before")
                return
            log(f"  {name}")
            s.save(name, fn(*args))
            log(f"  {name}: {json.dumps(s.stages[name])[:300]}")

        stage("inputs", stage_inputs, s)
        stage("submit", stage_submit, s, bins, nats)
        if not s.generated and s.stages["submit"]["tasks"] != n:
            raise SystemExit(f"{n} images made {s.stages['submit']['tasks']} tasks, not one each")
        stage("work", stage_work, s, bins, nats)
        if s.generated:
            stage("records", stage_records, s, bins, nats)
        stage("jetstream", stage_jetstream, s, nats)
        stage("status", stage_status, s, bins, nats)
        stage("finalize", stage_finalize, s, bins, nats)
        stage("sizes", stage_sizes, s)
        if not s.generated and n <= a.resume_max:
            stage("resume", stage_resume, s, bins)
    finally:
        nats.stop()
    result = {"tasks": n, "mode": mode, **s.stages}
    if not s.generated and n > a.resume_max:
        result["resume"] = {"skipped": f"above --resume-max {a.resume_max}"}
    if s.generated:
        result["resume"] = {"skipped": "generated records have no input to resume from"}
    return s, result


def git_commit():
    try:
        return subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True).stdout.strip()
    except OSError:
        return None


def mib(b):
    return "" if b is None else f"{b / 2**20:.0f} MiB" if b >= 2**20 else f"{b / 2**10:.0f} KiB"


def size_str(b):
    if b is None:
        return "–"
    if b >= 1e6:
        return f"{b / 1e6:.1f} MB"
    if b >= 2**10:
        return f"{b / 1e3:.1f} kB"
    return f"{b} B"


def secs(x):
    return "–" if x is None else f"{x:.2f} s" if x < 10 else f"{x:.1f} s"


def table(results):
    rows = ["| tasks | how | `status` wall, median (min–max) of polls | `status` peak RSS | "
            "`finalize` wall | `finalize` peak RSS | `manifest.json` | `files.parquet` | "
            "`failures.parquet` | JetStream bytes/task | `run` resume wall | `run` resume peak RSS |",
            "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for n in sorted(results["sizes"], key=int):
        r = results["sizes"][n]
        st, fi, sz, js, re = (r.get(k, {}) for k in ("status", "finalize", "sizes", "jetstream",
                                                      "resume"))
        status = (f"{secs(st.get('wall_median'))} ({secs(st.get('wall_min'))}–"
                  f"{secs(st.get('wall_max'))}), {len(st.get('polls', []))} polls") if st else "–"
        resume = ("– (" + re["skipped"] + ")" if "skipped" in re else
                  "timed out" if re.get("timed_out") else secs(re.get("seconds")) +
                  (f" (first {secs(re['first_seconds'])})" if "first_seconds" in re else ""))
        rows.append(
            f"| {int(n):,} | {'generated' if r['mode'].startswith('generated') else 'real'} | "
            f"{status} | {mib(st.get('peak_rss_max'))} | "
            f"{'timed out' if fi.get('timed_out') else secs(fi.get('seconds'))} | "
            f"{mib(fi.get('peak_rss'))} | {size_str(sz.get('manifest_json'))} | "
            f"{size_str(sz.get('files_parquet'))} | {size_str(sz.get('failures_parquet'))} | "
            f"{js.get('bytes_per_task', 0):.0f} | {resume} | {mib(re.get('peak_rss'))} |")
    rows += ["", "| tasks | `submit` wall | workers × tasks in flight | tasks/s through the workers | "
             "chip files on disk | STAC files | nats-server memory |",
             "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for n in sorted(results["sizes"], key=int):
        r = results["sizes"][n]
        su, wo, sz, js, rec = (r.get(k, {}) for k in ("submit", "work", "sizes", "jetstream",
                                                       "records"))
        through = f"{wo.get('tasks_per_s', 0):.0f}"
        if rec:
            through = f"– (one task; records loaded at {rec.get('records_per_s', 0):.0f}/s)"
        rows.append(f"| {int(n):,} | {secs(su.get('seconds'))} | {wo.get('workers')} × "
                    f"{wo.get('tasks_in_flight')} | {through} | {size_str(wo.get('chip_disk_bytes'))} | "
                    f"{sz.get('stac_files', '–')} | {mib(js.get('nats_server_mem'))} |")
    return "\n".join(rows)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="10000,100000", help="task counts, comma-separated")
    ap.add_argument("--json", default="bench-scale.json", help="results file (merged by size)")
    ap.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "rsembed-scale"),
                    help="work folder; a size's folder is reused (finished stages skipped)")
    ap.add_argument("--keep", action="store_true", help="keep a size's folder once it is done")
    ap.add_argument("--workers", type=int, default=2, help="scale-worker processes")
    ap.add_argument("--tasks-in-flight", type=int, default=4, help="per worker")
    ap.add_argument("--polls", type=int, default=11, help="status polls per size")
    ap.add_argument("--generate-above", type=int, default=1_000_000,
                    help="sizes above this load generated done records instead of running tasks")
    ap.add_argument("--placeholders", choices=["sparse", "none"], default="sparse",
                    help="generated tasks' chip files: sparse files (an inode each), or none "
                    "for a finalize that does not list chips/")
    ap.add_argument("--resume-max", type=int, default=1_000_000,
                    help="largest size whose embedded-run resume is timed")
    ap.add_argument("--timeout", type=float, default=1800, help="per status poll and submit")
    ap.add_argument("--finalize-timeout", type=float, default=4 * 3600, help="finalize, resume")
    ap.add_argument("--work-timeout", type=float, default=12 * 3600, help="workers, records")
    ap.add_argument("--model", default=os.path.join(ROOT, "fixtures/models/tiny-siglip"))
    ap.add_argument("--target-dir",
                    default=os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target")))
    ap.add_argument("--nats-server", default=os.environ.get("NATS_SERVER") or shutil.which("nats-server")
                    or os.path.join(ROOT, ".cache/venv/bin/nats-server"))
    a = ap.parse_args()
    a.work = os.path.abspath(a.work)
    a.model = os.path.abspath(a.model)
    sizes = [int(x) for x in a.sizes.split(",")]
    if any(n <= a.resume_max and n <= a.generate_above for n in sizes) \
            and not os.environ.get("ORT_DYLIB_PATH"):
        raise SystemExit("set ORT_DYLIB_PATH to libonnxruntime (the embedded run loads the model)")
    bins = {b: os.path.join(a.target_dir, "release", b)
            for b in ("rsembed", "scale-worker", "scale-records")}
    for b in bins.values():
        if not os.access(b, os.X_OK):
            raise SystemExit(f"{b} missing: cargo build --release -p rsembed-coordinator "
                             "-p rsembed-worker -p rsembed-bench-scale --bins")
    results = {"sizes": {}}
    if os.path.exists(a.json):
        with open(a.json) as f:
            results = json.load(f)
    done = []
    for n in sizes:
        s, r = run_size(a, bins, n)
        r["when"] = time.strftime("%Y-%m-%d %H:%M:%S")
        r["commit"] = git_commit()
        r["command"] = " ".join([os.path.relpath(sys.argv[0], ROOT)] + sys.argv[1:])
        r["machine"] = {"cores": os.cpu_count(), "platform": platform.platform()}
        results["sizes"][str(n)] = r
        tmp = a.json + ".tmp"
        with open(tmp, "w") as f:
            json.dump(results, f, indent=1)
        os.replace(tmp, a.json)
        done.append(s.dir)
    print(table(results), flush=True)
    # Last, so that no measurement shares the disk with it: on this machine's
    # ext4 (mounted with `discard`) a million files take the best part of an hour.
    for d in [] if a.keep else done:
        log(f"removing {d}")
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
