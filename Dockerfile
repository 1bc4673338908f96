# attnserve image: build with the same script and Makefile CI uses, run as non-root on
# the runtime libraries only. tests/deploy/runtime_root_test.sh exercises the runtime
# stage in a debootstrap root; tests/deploy/check_dockerfile.sh lints this file.
#
#   docker build -t attnserve:0.1.0 .
#   docker run --rm -p 50051:50051 -p 8080:8080 attnserve:0.1.0

FROM debian:bookworm-slim AS build
WORKDIR /src
COPY deploy/install-deps.sh deploy/install-deps.sh
RUN deploy/install-deps.sh --build
COPY . .
RUN make build BUILD_DIR=/src/build

FROM debian:bookworm-slim
LABEL org.opencontainers.image.title="attnserve" \
      org.opencontainers.image.description="Multi-head attention inference over gRPC (oneDNN, dynamic batching, Prometheus metrics)" \
      org.opencontainers.image.version="0.1.0" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.base.name="debian:bookworm-slim"
COPY deploy/install-deps.sh /tmp/deploy/install-deps.sh
RUN /tmp/deploy/install-deps.sh --runtime \
    && rm -rf /var/lib/apt/lists/* /tmp/deploy \
    && useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin attnserve
COPY --from=build /src/build/server/attnserve /src/build/client/attnctl /src/build/client/attnbench /usr/local/bin/
USER 10001
EXPOSE 50051 8080
HEALTHCHECK --interval=10s --timeout=5s --retries=6 \
    CMD ["attnctl", "--target=127.0.0.1:50051", "--timeout=3s", "health"]
ENTRYPOINT ["attnserve"]
CMD ["--port=50051", "--metrics_port=8080"]
