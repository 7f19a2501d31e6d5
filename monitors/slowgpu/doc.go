// Package slowgpu judges a GPU that works but is slow or about to fail:
// clocks held down by something other than its workload, a PCIe link
// trained down, memory repair pending or failed, uncorrected ECC rising, a
// thin thermal margin, an NVLink slower than its peers. A source (nvml,
// dcgm) reads the signals each poll into a Reading; a Judge per GPU keeps
// their history over a window and turns it into findings. See
// docs/monitors.md, "Slow GPUs".
package slowgpu
