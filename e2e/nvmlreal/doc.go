// Package nvmlreal is the real-NVML tier (build tag nvmlreal, `make
// nvml-real`): NVIDIA's own libnvidia-ml.so.1 of driver branch 535, the
// oldest supported branch, fetched by hack/nvml535.sh and named by
// $GPUHEALTH_NVML_REAL_DIR. It checks that every NVML function the agent
// calls without looking it up first is in that library, that the fake
// library makes go-nvml call the same versioned entry points as the real
// one, and that the real gpuhealth-monitor, loading the real library on a
// machine without an NVIDIA kernel driver, reports the nvml source
// unavailable in NVML's own words, retries it and keeps running. The
// monitor's tests and the end-to-end suites use monitors/fakenvml instead.
package nvmlreal
