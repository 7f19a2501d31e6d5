// Package fakenvml builds a fake libnvidia-ml.so.1, driven by a scenario file,
// so that tests run the real go-nvml code path without a GPU.
package fakenvml
