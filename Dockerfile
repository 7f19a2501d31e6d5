# Builds both gpuhealth binaries into one image.
#   docker build -t gpuhealth .
# The operator is static (CGO_ENABLED=0). The monitor uses cgo: go-nvml and
# go-dcgm dlopen libnvidia-ml.so.1 / libdcgm.so.4 at run time (the NVIDIA
# container runtime mounts them), so the image has glibc (distroless/base).
# The operator's Deployment runs as the image's nonroot user; the monitor's
# DaemonSet runs as root (config/monitor/daemonset.yaml) to read /dev/kmsg
# and own its hostPath spool.
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY api/ api/
COPY cmd/ cmd/
COPY controllers/ controllers/
COPY remediation/ remediation/
COPY monitors/ monitors/
RUN CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /out/gpuhealth-operator ./cmd/gpuhealth-operator
RUN CGO_ENABLED=1 CGO_CFLAGS="-Wno-deprecated-declarations" go build -trimpath -ldflags="-s -w" -o /out/gpuhealth-monitor ./cmd/gpuhealth-monitor

FROM gcr.io/distroless/base-debian12:nonroot
COPY --from=build /out/gpuhealth-operator /gpuhealth-operator
COPY --from=build /out/gpuhealth-monitor /gpuhealth-monitor
USER 65532:65532
ENTRYPOINT ["/gpuhealth-operator"]
