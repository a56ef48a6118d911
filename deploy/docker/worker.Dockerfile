# syntax=docker/dockerfile:1
# rsembed-worker on CUDA 13 + cuDNN 9 with ONNX Runtime 1.31.1 (onnxruntime-gpu).
# Build from the repository root (docs/deploy.md, "Images"):
#   docker build -f deploy/docker/worker.Dockerfile -t rsembed-worker:0.1.0 .
# Self-check on a GPU host:
#   docker run --rm --gpus all -v "$PWD/models/git-rsclip:/models/git-rsclip:ro" \
#     rsembed-worker:0.1.0 check --model /models/git-rsclip --device cuda

# --- 1. the worker binary (Rust >= 1.92, crates.io only) --------------------
FROM rust:1.95.0-bookworm AS build
WORKDIR /src
COPY . .
# The cache mounts keep the registry and target/ between builds; the binary is
# copied out of the cached target/ in the same step.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p rsembed-worker --bin rsembed-worker \
    && install -D -m 0755 target/release/rsembed-worker /out/rsembed-worker

# --- 2. ONNX Runtime's libraries from the PyPI wheel ------------------------
# The same wheel scripts/setup-ort.sh --gpu takes: libonnxruntime.so.1.31.1 and
# the CUDA provider libraries, which must sit beside it.
FROM python:3.12-slim-bookworm AS ort
RUN python -m pip download --no-cache-dir --disable-pip-version-check --no-deps \
        --only-binary=:all: --dest /tmp/wheel onnxruntime-gpu==1.31.1 \
    && python -c "import glob, zipfile; z = zipfile.ZipFile(glob.glob('/tmp/wheel/*.whl')[0]); [z.extract(n, '/tmp/x') for n in z.namelist() if n.startswith('onnxruntime/capi/lib') and '.so' in n]" \
    && mkdir -p /opt/onnxruntime/lib \
    && mv /tmp/x/onnxruntime/capi/lib* /opt/onnxruntime/lib/ \
    && ln -s libonnxruntime.so.1.31.1 /opt/onnxruntime/lib/libonnxruntime.so \
    && test -f /opt/onnxruntime/lib/libonnxruntime.so.1.31.1 \
    && test -f /opt/onnxruntime/lib/libonnxruntime_providers_cuda.so \
    && test -f /opt/onnxruntime/lib/libonnxruntime_providers_shared.so \
    && rm -rf /tmp/wheel /tmp/x

# --- 3. the runtime image ----------------------------------------------------
# CUDA 13 runtime with cuDNN 9 (NVIDIA's tag pattern since CUDA 12.4:
# <cuda>-cudnn-runtime-<os>). The base already carries ca-certificates, which
# object storage over HTTPS needs (rustls with the system roots).
FROM nvidia/cuda:13.0.2-cudnn-runtime-ubuntu24.04

LABEL org.opencontainers.image.title="rsembed-worker" \
      org.opencontainers.image.description="rsembed pull worker: Git-RSCLIP embeddings of remote-sensing images on ONNX Runtime 1.31.1 (CUDA 13, cuDNN 9)" \
      org.opencontainers.image.version="0.1.0" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://example.invalid/rsembed" \
      org.opencontainers.image.base.name="docker.io/nvidia/cuda:13.0.2-cudnn-runtime-ubuntu24.04"

# A fixed non-root user; its home takes CUDA's JIT cache (~/.nv).
RUN useradd --uid 10001 --user-group --create-home --shell /usr/sbin/nologin rsembed

COPY --from=ort /opt/onnxruntime/lib/ /opt/onnxruntime/lib/
COPY --from=build /out/rsembed-worker /usr/local/bin/rsembed-worker

# Every flag has an RSEMBED_* variable; these are the image's defaults. The model
# is mounted read-only at /models/<name>; another name: -e RSEMBED_MODEL=/models/<name>.
# The worker still needs RSEMBED_NATS (or --nats).
ENV ORT_DYLIB_PATH=/opt/onnxruntime/lib/libonnxruntime.so.1.31.1 \
    RSEMBED_MODEL=/models/git-rsclip \
    RSEMBED_DEVICE=cuda \
    RSEMBED_HTTP_ADDR=0.0.0.0:9090

USER 10001:10001
WORKDIR /home/rsembed
# /healthz, /readyz, /metrics
EXPOSE 9090
# Exec form: the worker is PID 1 and gets SIGTERM itself (graceful drain).
ENTRYPOINT ["rsembed-worker"]
