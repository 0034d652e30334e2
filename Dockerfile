# hotkeyproxy as a container: a static binary on distroless, run as a
# non-root user. The build needs nothing but the Go module proxy.
#
#   docker build -t hotkeyproxy .
#   docker run -p 6380:6380 -p 9121:9121 hotkeyproxy --upstream redis:6379
#
# The image runs the proxy with the proxy.yaml baked in at
# /etc/hotkeyproxy/proxy.yaml (mount your own there to replace it), with
# clients on 0.0.0.0:6380 and /metrics, /healthz, /readyz on 0.0.0.0:9121.
# Arguments given to `docker run` are added after those flags, and a flag
# given twice takes its last value: `--upstream-mode cluster --upstream a,b`,
# or `--listen 0.0.0.0:7000` to move it. Other subcommands:
#   docker run --rm --entrypoint hotkeyproxy hotkeyproxy bench seckill --help

ARG GO_VERSION=1.26

FROM golang:${GO_VERSION} AS build
WORKDIR /src
# Modules first, so that a source change does not download them again.
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /out/hotkeyproxy . \
	&& /out/hotkeyproxy --check-config proxy.yaml

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/hotkeyproxy /usr/local/bin/hotkeyproxy
COPY proxy.yaml /etc/hotkeyproxy/proxy.yaml
# nonroot (65532) in distroless: no shell, no package manager.
USER 65532:65532
# Clients, metrics.
EXPOSE 6380 9121
# /readyz answers 200 once the upstream answers (standalone: PING; cluster:
# the slot map is loaded). Moving the metrics port means overriding this.
HEALTHCHECK --interval=10s --timeout=5s --start-period=10s --retries=3 \
	CMD ["/usr/local/bin/hotkeyproxy", "healthcheck", "--addr", "127.0.0.1:9121", "--timeout", "4s"]
ENTRYPOINT ["/usr/local/bin/hotkeyproxy", "--config", "/etc/hotkeyproxy/proxy.yaml", "--listen", "0.0.0.0:6380", "--metrics-listen", "0.0.0.0:9121"]
