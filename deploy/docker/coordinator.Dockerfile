# syntax=docker/dockerfile:1
# rsembed, the coordinator and CLI (plan, submit, status, finalize, search, ...).
# Build from the repository root (docs/deploy.md, "Images"):
#   docker build -f deploy/docker/coordinator.Dockerfile -t rsembed:0.1.0 .
#   docker run --rm rsembed:0.1.0 status --nats nats://nats:4222 --output s3://bucket/out/

# --- 1. the binary (Rust >= 1.92, crates.io only) ----------------------------
FROM rust:1.95.0-bookworm AS build
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p rsembed-coordinator --bin rsembed \
    && install -D -m 0755 target/release/rsembed /out/rsembed

# --- 2. the runtime image ----------------------------------------------------
# Distroless: glibc, libgcc and ca-certificates (object storage over HTTPS), no
# shell and no package manager. Built on bookworm like the builder, so the glibc
# matches. No ONNX Runtime: the commands that run the model (run, text, search
# with a text, classify) need --ort-lib or ORT_DYLIB_PATH pointing at a mounted
# libonnxruntime.so; the worker image has the GPU build.
FROM gcr.io/distroless/cc-debian12:nonroot

LABEL org.opencontainers.image.title="rsembed" \
      org.opencontainers.image.description="rsembed coordinator and CLI: plan, submit, status and finalize embedding jobs on NATS JetStream, search the results" \
      org.opencontainers.image.version="0.1.0" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://example.invalid/rsembed" \
      org.opencontainers.image.base.name="gcr.io/distroless/cc-debian12:nonroot"

COPY --from=build /out/rsembed /usr/local/bin/rsembed

# distroless' nonroot user, by number so that runAsNonRoot can check it.
USER 65532:65532
ENTRYPOINT ["rsembed"]
CMD ["--help"]
