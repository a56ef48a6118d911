#!/usr/bin/env bash
# Installs what the tests need: Python packages into .cache/venv (the readers the
# dataset is documented for: duckdb, pyarrow, polars, geopandas with shapely and
# pyproj; moto's S3 server for the object-storage tests; nats-server for the
# distributed ones; see integration-tests/requirements.txt), the ONNX Runtime
# library into .cache/ort/ and Azurite (npm) into .cache/npm/. Safe to run again; it skips what
# is there, and reinstalls the venv when requirements.txt changes.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=.cache/venv
req=integration-tests/requirements.txt
stamp="$venv/.installed-$(sha256sum "$req" | cut -c1-16)"
if [[ ! -f "$stamp" ]]; then
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$req"
  touch "$stamp"
fi
scripts/setup-ort.sh >/dev/null
# Azurite, the Azure Blob Storage emulator the az:// tests run against (as moto
# serves S3). 3.35 is the last release that runs on Node 20.
azurite_version=3.35.0
if ! grep -qs "\"version\": \"$azurite_version\"" .cache/npm/node_modules/azurite/package.json; then
  if command -v npm >/dev/null 2>&1; then
    npm install --prefix .cache/npm --no-audit --no-fund --silent "azurite@$azurite_version" >/dev/null
  else
    echo "npm (Node.js 20 or later) is needed to install Azurite for the az:// tests" >&2
    exit 1
  fi
fi
# GDAL is the reference for rasters and footprints in the GeoTIFF tests.
if ! command -v gdaltransform >/dev/null 2>&1; then
  if command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq gdal-bin >/dev/null
  else
    echo "gdal-bin (gdaltransform) is needed by the tests; install it" >&2
    exit 1
  fi
fi
# Headless Chromium (Debian `chromium`) opens `search --html` pages in search_html.rs.
if ! command -v chromium >/dev/null 2>&1; then
  if command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null
  else
    echo "chromium is needed by the tests (search_html.rs); install it" >&2
    exit 1
  fi
fi
# promtool (Debian `prometheus`) lints the worker's /metrics in worker_http.rs.
if ! command -v promtool >/dev/null 2>&1; then
  if command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null
  else
    echo "promtool (package prometheus) is needed by the tests; install it" >&2
    exit 1
  fi
fi
