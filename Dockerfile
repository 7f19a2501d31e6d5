# Builds gpuhealth's two images, one per target:
#   podman build --target operator -t gpuhealth-operator .
#   podman build --target monitor  -t gpuhealth-monitor .
# (`make image` builds both, with local stand-ins for the base images where
# no registry is reachable: hack/image.sh.)
#
# The operator is static (CGO_ENABLED=0) on a static base with a nonroot
# user. The monitor uses cgo: go-nvml and go-dcgm dlopen libnvidia-ml.so.1 /
# libdcgm.so.4 at run time (the NVIDIA container runtime mounts them), so its
# base has glibc. The operator's Deployment runs as the image's nonroot user;
# the monitor's DaemonSet runs as root (the chart's monitor template says
# why).
ARG BUILDER_IMAGE=golang:1.26
ARG OPERATOR_BASE_IMAGE=gcr.io/distroless/static-debian12:nonroot
ARG MONITOR_BASE_IMAGE=gcr.io/distroless/base-debian12

FROM ${BUILDER_IMAGE} AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY api/ api/
COPY cmd/ cmd/
COPY controllers/ controllers/
COPY remediation/ remediation/
COPY monitors/ monitors/
COPY internal/ internal/
RUN CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /out/gpuhealth-operator ./cmd/gpuhealth-operator
RUN CGO_ENABLED=1 CGO_CFLAGS="-O2 -Wno-deprecated-declarations" go build -trimpath -ldflags="-s -w" -o /out/gpuhealth-monitor ./cmd/gpuhealth-monitor

FROM ${OPERATOR_BASE_IMAGE} AS operator
COPY --from=build /out/gpuhealth-operator /gpuhealth-operator
USER 65532:65532
ENTRYPOINT ["/gpuhealth-operator"]

FROM ${MONITOR_BASE_IMAGE} AS monitor
COPY --from=build /out/gpuhealth-monitor /gpuhealth-monitor
ENTRYPOINT ["/gpuhealth-monitor"]
