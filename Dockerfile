# The modelmux image: the `modelmux` binary (package modelmux-cli) on Debian bookworm slim,
# running as an unprivileged user.
#
#   docker build -t REGISTRY/modelmux:TAG .
#   docker run --rm -p 8000:8000 -e MODELMUX_ADMIN_TOKEN="$(openssl rand -hex 32)" REGISTRY/modelmux:TAG
#
# The default command serves the built-in demo (eight ONNX classifiers compiled into the
# binary) on 0.0.0.0:8000; listening beyond loopback requires the admin token. For Kubernetes,
# see deploy/k8s/README.md. Needs BuildKit (the default builder since Docker 23) for the cache
# mounts.

FROM rust:1-bookworm AS build
# Nothing but the Rust toolchain: the etcd client's gRPC code is checked in (crates/etcd).
WORKDIR /src
COPY . .
# No debug info in the image's binary (the release profile keeps line tables, for backtraces).
ENV CARGO_PROFILE_RELEASE_DEBUG=0
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/usr/local/cargo/git \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p modelmux-cli \
 && install -D -m 0755 target/release/modelmux /out/modelmux

FROM debian:bookworm-slim
LABEL org.opencontainers.image.title="modelmux" \
      org.opencontainers.image.description="Serve many models of the same shape from one pool of replicas." \
      org.opencontainers.image.licenses="Apache-2.0"
# CA certificates for HTTPS model repositories (S3 and other web servers). The user's ids
# (10001) are the ones deploy/k8s runs the pods as.
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 modelmux \
 && useradd --system --uid 10001 --gid modelmux --home-dir /nonexistent --no-create-home \
      --shell /usr/sbin/nologin modelmux \
 && install -d -o modelmux -g modelmux -m 0750 /var/cache/modelmux
COPY --from=build /out/modelmux /usr/local/bin/modelmux
USER 10001:10001
EXPOSE 8000
ENTRYPOINT ["modelmux"]
CMD ["serve", "--host", "0.0.0.0"]
