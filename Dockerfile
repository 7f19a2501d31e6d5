# Builds both gpuhealth binaries into one image.
#   docker build -t gpuhealth .
# The operator is static (CGO_ENABLED=0). The monitor, once it lands, uses
# cgo because go-nvml and go-dcgm dlopen libnvidia-ml / libdcgm at run time.
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY api/ api/
COPY cmd/ cmd/
COPY controllers/ controllers/
COPY remediation/ remediation/
RUN CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /out/gpuhealth-operator ./cmd/gpuhealth-operator

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/gpuhealth-operator /gpuhealth-operator
USER 65532:65532
ENTRYPOINT ["/gpuhealth-operator"]
