package nvml

// OptionalSymbols are the NVML functions newer than the oldest supported
// driver that the source looks up in the loaded library before it calls
// them (lookupSymbols), falling back or going without where one is
// missing. Every other NVML function the agent calls must be in every
// supported driver: go-nvml binds symbols lazily, and calling a missing one
// aborts the process. `make nvml-real` (e2e/nvmlreal) checks that against
// NVIDIA's own library of the oldest branch, R535.
//
// lookupSymbols reads them by index: keep the order.
var OptionalSymbols = []string{
	"nvmlDeviceGetCurrentClocksEventReasons",
	"nvmlDeviceGetGpuMaxPcieLinkGeneration",
	"nvmlDeviceGetGpuFabricInfoV",
}
