# settle serve in a container (docs/operations.md, "Deploying"). Written and
# documented, not built by CI: no container registry is reachable from the
# build machines.
#
#   docker build -t settle .
#   docker run -p 7411:7411 -v settle-data:/var/lib/settle \
#     -v ./settle.toml:/etc/settle/settle.toml:ro settle
#
# The image listens on 0.0.0.0:7411, so settle refuses to start until the
# mounted configuration has [[tenants]] (authentication) and either
# tls_cert/tls_key (mount them too) or behind_proxy = true (a
# TLS-terminating proxy in front). `docker kill -s HUP` reloads it.

FROM rust:1-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p settle \
 && install -D -m 755 target/release/settle /out/settle

FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates curl \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --home-dir /var/lib/settle --shell /usr/sbin/nologin settle \
 && install -d -o settle -g settle -m 700 /var/lib/settle \
 && install -d -m 755 /etc/settle
COPY --from=build /out/settle /usr/bin/settle
COPY packaging/settle.toml /etc/settle/settle.toml
USER settle
WORKDIR /var/lib/settle
EXPOSE 7411
ENV SETTLE_LOG=info
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 \
  CMD curl -fsS http://127.0.0.1:7411/readyz >/dev/null \
   || curl -fsSk https://127.0.0.1:7411/readyz >/dev/null || exit 1
# SIGTERM (docker stop) lets settle finish the requests in flight.
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/bin/settle", "serve", "--config", "/etc/settle/settle.toml", "--listen", "0.0.0.0:7411"]
