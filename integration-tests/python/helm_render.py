"""Lint and render the rsembed chart offline with Helm v4 (helm-python-sdk:
Helm's Go SDK as a shared library; no helm binary, no cluster, no network).

    helm_render.py CHART [-f VALUES]... [--set-json JSON] [--stub-nats]
                   [--release NAME] [--namespace NS]

Prints one JSON object: the merged values, the schema check, the lint report
and every rendered manifest as parsed YAML (tests/helm_chart.rs reads it).
Exits 1 with the error on stderr when the values are refused or a template
fails, so tests can assert on the message.

`--stub-nats` lints and renders a copy of the chart with an empty `nats`
chart in charts/: the official NATS chart is a dependency we do not vendor,
and `helm lint` reports a missing dependency directory even when the
dependency is disabled. The stub renders nothing; our templates only compute
the in-chart NATS's service names.
"""

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

import helm_python as helm
import yaml


class StrictLoader(yaml.SafeLoader):
    """Refuses duplicate keys, as the API server's strict decoding does."""


def _mapping(loader, node, deep=False):
    seen = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark
            )
        seen.add(key)
    return yaml.SafeLoader.construct_mapping(loader, node, deep)


StrictLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping
)


def merge(base, over):
    """Helm's coalescing for values files: maps merge, everything else replaces."""
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(base.get(k), dict):
            merge(base[k], v)
        else:
            base[k] = v
    return base


def stub_nats(chart: Path, into: Path) -> Path:
    copy = into / chart.name
    shutil.copytree(chart, copy, ignore=shutil.ignore_patterns("charts"))
    dep = next(d for d in yaml.safe_load((chart / "Chart.yaml").read_text())["dependencies"] if d["name"] == "nats")
    stub = copy / "charts" / "nats"
    (stub / "templates").mkdir(parents=True)
    # The lowest version the dependency's range admits.
    version = dep["version"].split()[0].lstrip(">=~^")
    (stub / "Chart.yaml").write_text(
        f"apiVersion: v2\nname: nats\nversion: {version}\n"
        "description: empty stand-in for the official NATS chart (tests only)\n"
    )
    (stub / "values.yaml").write_text("{}\n")
    return copy


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("chart", type=Path)
    ap.add_argument("-f", "--values", action="append", default=[], type=Path)
    ap.add_argument("--set-json", default="{}")
    ap.add_argument("--stub-nats", action="store_true")
    ap.add_argument("--release", default="demo")
    ap.add_argument("--namespace", default="rsembed")
    args = ap.parse_args()

    values = {}
    for f in args.values:
        merge(values, yaml.load(f.read_text(), Loader=StrictLoader) or {})
    merge(values, json.loads(args.set_json) or {})

    with tempfile.TemporaryDirectory() as tmp:
        chart = stub_nats(args.chart, Path(tmp)) if args.stub_nats else args.chart
        try:
            lint = helm.lint(
                str(chart), values, strict=True, namespace=args.namespace,
                kube_version="v1.33.0",
            )
            with helm.Chart.load(str(chart)) as c:
                merged = c.merge_values(values)
                c.validate_schema(values)
                rendered = c.render(
                    values, name=args.release, namespace=args.namespace, is_install=True
                )
        except helm.HelmError as e:
            print(f"helm: {e}", file=sys.stderr)
            return 1

    manifests, notes = [], None
    for path, text in sorted(rendered.items()):
        if path.endswith("NOTES.txt"):
            notes = text
            continue
        try:
            docs = list(yaml.load_all(text, Loader=StrictLoader))
        except yaml.YAMLError as e:
            print(f"{path}: rendered YAML does not parse: {e}", file=sys.stderr)
            return 1
        manifests += [{"template": path, "doc": d} for d in docs if d is not None]
    json.dump(
        {"values": merged, "lint": lint, "manifests": manifests, "notes": notes},
        sys.stdout,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
