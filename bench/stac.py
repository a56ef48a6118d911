"""STAC inputs: planning from a STAC API, and end to end against a folder.

Usage, from the repository root (after scripts/setup-test-env.sh, whose venv has
rustac, numpy and GDAL's command line tools on the PATH):

    cargo build --release -p rsembed-coordinator -p rsembed-worker
    .cache/venv/bin/python bench/stac.py [--counts 10000,30000,100000] [--reps 3] [--scenes 6]

(1) Planning. N generated Sentinel-2-L2A-like items (STAC 1.1; assets B04, B03,
B02, SCL and visual, each with `file:size` and `proj:shape` 10980x10980 like
Earth Search's; `eo:cloud_cover` and a polygon) in one collection, loaded by
`rustac serve` from an .ndjson file. `rsembed plan --input <api> --collections s2
--json` reads every page (250 items a page, POST /search, `next` links) and
splits each scene into chip-block tasks by its proj:shape (1849 chips a scene).
Reported: wall time of the plan process, items/s = N / wall, and its peak RSS
(ru_maxrss from wait4). The server runs on the same two cores, so its time per
page is inside the wall time: the figure is what a user on this machine sees,
and a floor for rsembed's own rate.

(2) End to end. K scenes of 1024x1024 pixels (8-bit 3-band COGs, 16 chips
each) run by `rsembed run` with the tiny model, once from a folder of the COGs
and once from `rustac serve` whose items (one `visual` asset each) point at the
same files, alternating, each in a fresh output, --reps times after one warm-up
of each. The ratio is STAC / folder wall time, medians of the same run.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BIN = REPO / "target" / "release" / "rsembed"
MODEL = REPO / "fixtures" / "models" / "tiny-siglip"
VENV_BIN = Path(sys.executable).parent


def timed(cmd, env=None):
    """Wall seconds, peak RSS (MiB) and stdout of one child process."""
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    bufs = {}

    def drain(name, f):
        bufs[name] = f.read()

    ts = [threading.Thread(target=drain, args=(n, f)) for n, f in (("o", p.stdout), ("e", p.stderr))]
    for t in ts:
        t.start()
    # wait4 gives ru_maxrss of this child alone; communicate() would reap it first.
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    for t in ts:
        t.join()
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode != 0:
        sys.exit(f"{cmd} exited {p.returncode}:\n{bufs['e'].decode()[-3000:]}")
    return wall, ru.ru_maxrss / 1024, bufs["o"]


class Serve:
    def __init__(self, files):
        import socket

        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        self.port = s.getsockname()[1]
        s.close()
        self.log = tempfile.TemporaryFile()
        t0 = time.perf_counter()
        self.p = subprocess.Popen(
            [str(VENV_BIN / "rustac"), "serve", *map(str, files), "--addr", f"127.0.0.1:{self.port}"],
            stdout=self.log,
            stderr=self.log,
        )
        while True:
            try:
                urllib.request.urlopen(self.url(), timeout=5).read()
                break
            except Exception:
                if self.p.poll() is not None or time.perf_counter() - t0 > 600:
                    self.log.seek(0)
                    sys.exit(f"rustac serve did not start:\n{self.log.read().decode()[-2000:]}")
                time.sleep(0.2)
        self.load_s = time.perf_counter() - t0

    def url(self):
        return f"http://127.0.0.1:{self.port}/"

    def close(self):
        self.p.kill()
        self.p.wait()


def collection(cid):
    return {
        "type": "Collection",
        "stac_version": "1.1.0",
        "id": cid,
        "description": "bench",
        "license": "CC-BY-4.0",
        "links": [],
        "extent": {
            "spatial": {"bbox": [[-180.0, -90.0, 180.0, 90.0]]},
            "temporal": {"interval": [["2020-01-01T00:00:00Z", None]]},
        },
    }


def s2_item(i):
    lon = -120 + (i % 300) * 0.2
    lat = 30 + (i // 300 % 100) * 0.2
    day = 1 + i % 28
    base = f"https://sentinel-cogs.example/tiles/{i}"
    band = lambda key, cn: {  # noqa: E731
        "href": f"{base}/{key}.tif",
        "type": "image/tiff; application=geotiff; profile=cloud-optimized",
        "roles": ["data"],
        "file:size": 200_000_000,
        "proj:shape": [10980, 10980],
        "bands": [{"name": key, "eo:common_name": cn, "nodata": 0, "raster:scale": 0.0001, "raster:offset": -0.1}],
    }
    return {
        "type": "Feature",
        "stac_version": "1.1.0",
        "id": f"S2B_T{i:07d}_20240601_0_L2A",
        "collection": "s2",
        "geometry": {
            "type": "Polygon",
            "coordinates": [[[lon, lat], [lon + 0.15, lat], [lon + 0.15, lat + 0.15], [lon, lat + 0.15], [lon, lat]]],
        },
        "bbox": [lon, lat, lon + 0.15, lat + 0.15],
        "properties": {
            "datetime": f"2024-06-{day:02d}T10:00:00Z",
            "eo:cloud_cover": (i * 37) % 100,
            "proj:code": "EPSG:32610",
            "updated": "2024-07-01T00:00:00Z",
        },
        "links": [],
        "assets": {
            "B04": band("B04", "red"),
            "B03": band("B03", "green"),
            "B02": band("B02", "blue"),
            "SCL": {"href": f"{base}/SCL.tif", "roles": ["data"], "file:size": 20_000_000, "proj:shape": [5490, 5490]},
            "visual": {
                "href": f"{base}/TCI.tif",
                "roles": ["visual"],
                "file:size": 200_000_000,
                "proj:shape": [10980, 10980],
                "bands": [{"eo:common_name": c} for c in ("red", "green", "blue")],
            },
        },
    }


def cpu_seconds(pid):
    """User + system CPU seconds a process has used (/proc/PID/stat)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def planning(tmp, counts, reps):
    rows = []
    for n in counts:
        d = tmp / f"plan-{n}"
        d.mkdir()
        (d / "s2.json").write_text(json.dumps(collection("s2")))
        with open(d / "items.ndjson", "w") as f:
            for i in range(n):
                f.write(json.dumps(s2_item(i)) + "\n")
        server = Serve([d / "s2.json", d / "items.ndjson"])
        try:
            runs = []
            for _ in range(reps):
                c0 = cpu_seconds(server.p.pid)
                wall, rss, out = timed([str(BIN), "plan", "--input", server.url(), "--collections", "s2", "--json"])
                server_cpu = cpu_seconds(server.p.pid) - c0
                plan = json.loads(out)
                assert plan["inputs"] == n, plan
                runs.append((wall, rss, plan, server_cpu))
            wall = statistics.median(r[0] for r in runs)
            rss = max(r[1] for r in runs)
            server_cpu = statistics.median(r[3] for r in runs)
            plan = runs[0][2]
            rows.append((n, wall, n / wall, rss, plan["tasks"], plan["stac"]["pages"], server.load_s))
            print(f"plan {n:>7} items: {wall:.2f} s (min {min(r[0] for r in runs):.2f}, max "
                  f"{max(r[0] for r in runs):.2f}), {n / wall:,.0f} items/s, peak RSS {rss:.1f} MiB, "
                  f"{plan['tasks']} tasks, {plan['stac']['pages']} pages; rustac serve used {server_cpu:.1f} "
                  f"CPU s of it (loaded in {server.load_s:.1f} s)", flush=True)
        finally:
            server.close()
    return rows


def make_cog(path, seed, size):
    code = f"""
import numpy as np, subprocess, sys
rng = np.random.default_rng({seed})
v = rng.integers(1, 256, size=(3, {size}, {size}), dtype=np.uint8)
raw = sys.argv[1] + '.raw'
v.tofile(raw)
open(raw + '.hdr', 'w').write('ENVI\\nsamples = {size}\\nlines = {size}\\nbands = 3\\nheader offset = 0\\nfile type = ENVI Standard\\ndata type = 1\\ninterleave = bsq\\nbyte order = 0\\n')
subprocess.run(['gdal_translate', '-q', '-of', 'COG', '-co', 'COMPRESS=DEFLATE', '-a_srs', 'EPSG:32633',
                '-a_ullr', str(500000 + {seed} * 20000), '5000000', str(500000 + {seed} * 20000 + 10 * {size}),
                str(5000000 - 10 * {size}), raw, sys.argv[1]], check=True)
"""
    subprocess.run([sys.executable, "-c", code, str(path)], check=True)
    for ext in (".raw", ".raw.hdr"):
        Path(str(path) + ext).unlink()


def end_to_end(tmp, scenes, reps):
    folder = tmp / "e2e-folder"
    folder.mkdir()
    items = []
    for k in range(scenes):
        p = folder / f"scene{k}.tif"
        make_cog(p, k + 1, 1024)
        lon, lat = 15 + k * 0.3, 45.0
        items.append({
            "type": "Feature", "stac_version": "1.1.0", "id": f"scene{k}", "collection": "s2",
            "geometry": {"type": "Polygon", "coordinates": [[[lon, lat], [lon + .1, lat], [lon + .1, lat + .1],
                                                             [lon, lat + .1], [lon, lat]]]},
            "bbox": [lon, lat, lon + .1, lat + .1],
            "properties": {"datetime": "2024-06-15T10:00:00Z", "eo:cloud_cover": 3},
            "links": [],
            "assets": {"visual": {"href": f"file://{p}", "roles": ["visual"], "file:size": p.stat().st_size,
                                  "proj:shape": [1024, 1024]}},
        })
    (tmp / "e2e.json").write_text(json.dumps({"type": "FeatureCollection", "features": items}))
    (tmp / "e2e-s2.json").write_text(json.dumps(collection("s2")))
    server = Serve([tmp / "e2e-s2.json", tmp / "e2e.json"])
    env = dict(os.environ, RSEMBED_LOG="warn")
    sides = {"folder": str(folder), "stac": server.url()}
    times = {k: [] for k in sides}
    try:
        for rep in range(reps + 1):
            order = list(sides) if rep % 2 == 0 else list(reversed(sides))
            for side in order:
                out = tmp / f"e2e-out-{side}"
                shutil.rmtree(out, ignore_errors=True)
                wall, _, res = timed([str(BIN), "run", "--input", sides[side], "--output", str(out),
                                      "--model", str(MODEL), "--batch-size", "16", "--json"], env=env)
                summary = json.loads(res)
                assert summary["chips"] == scenes * 16, summary
                if rep > 0:
                    times[side].append(wall)
    finally:
        server.close()
    f, s = statistics.median(times["folder"]), statistics.median(times["stac"])
    print(f"end to end, {scenes} scenes x 16 chips: folder {f:.2f} s, STAC {s:.2f} s "
          f"(min {min(times['stac']):.2f}, max {max(times['stac']):.2f}), STAC / folder {s / f:.3f}", flush=True)
    return f, s


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--counts", default="10000,30000,100000")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--scenes", type=int, default=6)
    ap.add_argument("--skip-plan", action="store_true")
    ap.add_argument("--skip-e2e", action="store_true")
    a = ap.parse_args()
    if not BIN.is_file():
        sys.exit(f"{BIN} missing: cargo build --release -p rsembed-coordinator")
    os.environ["ORT_DYLIB_PATH"] = os.environ.get(
        "ORT_DYLIB_PATH", str(REPO / ".cache" / "ort" / "libonnxruntime.so.1.31.1"))
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        if not a.skip_plan:
            planning(tmp, [int(c) for c in a.counts.split(",")], a.reps)
        if not a.skip_e2e:
            end_to_end(tmp, a.scenes, a.reps)


if __name__ == "__main__":
    main()
