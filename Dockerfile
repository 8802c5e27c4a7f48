# The sluice binary in a small image, for the Kubernetes example in deploy/kubernetes.
#   docker build -t sluice .
# Every connector (`--features full`), in the release profile's stripped binary.
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p sluice-cli --features full \
    && install -D target/release/sluice /out/sluice

FROM debian:bookworm-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /out/sluice /usr/local/bin/sluice
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/sluice"]
