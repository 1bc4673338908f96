# attnserve image: built with the same script and Makefile CI uses, run as non-root on
# the runtime libraries only. tests/deploy/docker_test.sh builds and runs it for real;
# tests/deploy/check_dockerfile.sh lints it with hadolint.
#
#   make image                                  # or: docker build --network host -t attnserve:0.1.0 .
#   docker run --rm --network host attnserve:0.1.0
#
# The package stages (runtime-deps, build-deps) depend only on deploy/install-deps.sh,
# so `make deps` builds them once and later builds reuse those layers with no network.
# They come first: Docker's classic builder runs every stage before its --target.

FROM debian:bookworm-slim AS runtime-deps
COPY deploy/install-deps.sh /tmp/deploy/install-deps.sh
# Documentation, man pages and apt's lists are not needed to run; dpkg is told to skip
# them for every package installed here.
RUN printf '%s\n' 'path-exclude=/usr/share/doc/*' 'path-include=/usr/share/doc/*/copyright' \
      'path-exclude=/usr/share/man/*' 'path-exclude=/usr/share/info/*' \
      'path-exclude=/usr/share/locale/*' 'path-exclude=/usr/share/lintian/*' \
      > /etc/dpkg/dpkg.cfg.d/01-attnserve-nodoc \
    && /tmp/deploy/install-deps.sh --runtime \
    && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /tmp/deploy \
    && useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin attnserve

FROM debian:bookworm-slim AS build-deps
WORKDIR /src
COPY deploy/install-deps.sh deploy/install-deps.sh
RUN deploy/install-deps.sh --build && rm -rf /var/lib/apt/lists/*

FROM build-deps AS build
COPY . .
RUN make build BUILD_DIR=/src/build CMAKE_ARGS=-DATTNSERVE_BUILD_TESTS=OFF \
    && strip --strip-unneeded build/server/attnserve build/client/attnctl build/client/attnbench

FROM runtime-deps
LABEL org.opencontainers.image.title="attnserve" \
      org.opencontainers.image.description="Multi-head attention inference over gRPC (oneDNN, dynamic batching, Prometheus metrics)" \
      org.opencontainers.image.version="0.1.0" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.base.name="debian:bookworm-slim"
COPY --from=build /src/build/server/attnserve /src/build/client/attnctl /src/build/client/attnbench /usr/local/bin/
USER 10001
EXPOSE 50051 8000 8080
# The start period covers start-up and warm-up; failures then count toward --retries.
# The check dials the port the server actually bound (--port_file, written after
# binding), so `docker run IMAGE --port=N` stays healthy for any N.
HEALTHCHECK --start-period=30s --interval=10s --timeout=5s --retries=3 \
    CMD ["sh", "-c", "exec attnctl --target=127.0.0.1:$(cat /tmp/attnserve.port) --timeout=3s health"]
ENTRYPOINT ["attnserve", "--port_file=/tmp/attnserve.port"]
CMD ["--port=50051", "--metrics_port=8080"]
