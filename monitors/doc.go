// Package monitors holds what every part of the node agent (gpuhealth-monitor)
// shares: the Finding a source reports and the Source interface. The sources
// live in subpackages (nvml, dcgm, kmsg, imex); the pipeline that classifies,
// debounces, coalesces and publishes findings lives in monitors/pipeline.
package monitors
