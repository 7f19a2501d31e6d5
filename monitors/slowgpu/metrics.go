package slowgpu

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpuhealth/gpuhealth/monitors/metrics"
)

// The raw signals the slow-GPU checks judge, per GPU. Labels are bounded:
// the GPU's index and UUID, and for a few series a name from a fixed set
// (a clocks event reason, a row kind, an NVLink number).
var (
	gpuLabels = []string{"gpu", "uuid"}

	clocksEventSeconds = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "gpuhealth_monitor_gpu_clocks_event_seconds_total",
		Help: "Seconds a clocks event reason (hw_slowdown, hw_thermal_slowdown, hw_power_brake_slowdown, sw_thermal_slowdown, sw_power_cap) was active, as sampled at each poll.",
	}, append(gpuLabels, "reason"))
	smClock = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "gpuhealth_monitor_gpu_sm_clock_mhz",
		Help: "The GPU's current SM clock in MHz.",
	}, gpuLabels)
	smClockMax = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "gpuhealth_monitor_gpu_sm_clock_max_mhz",
		Help: "The GPU's maximum SM clock in MHz.",
	}, gpuLabels)
	violationSeconds = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "gpuhealth_monitor_gpu_violation_seconds",
		Help: "The driver's cumulative violation time in seconds by policy (power, thermal, reliability), since the driver loaded.",
	}, append(gpuLabels, "policy"))
	pcieGeneration = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "gpuhealth_monitor_gpu_pcie_link_generation",
		Help: "The GPU's current PCIe link generation.",
	}, gpuLabels)
	pcieGenerationMax = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "gpuhealth_monitor_gpu_pcie_link_generation_max",
		Help: "The highest PCIe link generation the GPU and its slot support.",
	}, gpuLabels)
	pcieWidth = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "gpuhealth_monitor_gpu_pcie_link_width",
		Help: "The GPU's current PCIe link width (lanes).",
	}, gpuLabels)
	pcieWidthMax = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "gpuhealth_monitor_gpu_pcie_link_width_max",
		Help: "The widest PCIe link the GPU and its slot support (lanes).",
	}, gpuLabels)
	pcieReplays = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "gpuhealth_monitor_gpu_pcie_replays",
		Help: "The GPU's PCIe replay counter as the driver reports it.",
	}, gpuLabels)
	utilization = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "gpuhealth_monitor_gpu_utilization_ratio",
		Help: "The share of the driver's last sample period in which a kernel ran on the GPU (0 to 1).",
	}, gpuLabels)
	remappedRows = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "gpuhealth_monitor_gpu_remapped_rows",
		Help: "Rows of GPU memory remapped, by the kind of error that caused it (correctable, uncorrectable).",
	}, append(gpuLabels, "kind"))
	remapPending = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "gpuhealth_monitor_gpu_row_remap_pending",
		Help: "1 when a row remap waits for a GPU reset to take effect.",
	}, gpuLabels)
	remapFailure = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "gpuhealth_monitor_gpu_row_remap_failure",
		Help: "1 when a row remap failed.",
	}, gpuLabels)
	temperature = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "gpuhealth_monitor_gpu_temperature_celsius",
		Help: "The GPU's temperature in degrees Celsius.",
	}, gpuLabels)
	slowdownTemperature = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "gpuhealth_monitor_gpu_slowdown_temperature_celsius",
		Help: "The temperature at which the GPU slows itself down, in degrees Celsius.",
	}, gpuLabels)
	nvlinkSpeed = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "gpuhealth_monitor_nvlink_speed_mbps",
		Help: "An active NVLink's speed in MB/s, by link number.",
	}, append(gpuLabels, "link"))
)

func init() {
	metrics.Registry.MustRegister(clocksEventSeconds, smClock, smClockMax, violationSeconds,
		pcieGeneration, pcieGenerationMax, pcieWidth, pcieWidthMax, pcieReplays, utilization,
		remappedRows, remapPending, remapFailure, temperature, slowdownTemperature, nvlinkSpeed)
}
