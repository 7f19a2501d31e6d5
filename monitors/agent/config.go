package agent

import (
	"errors"
	"fmt"
	"path"
	"slices"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/monitors/pipeline"
	"github.com/gpuhealth/gpuhealth/monitors/slowgpu"
)

// Config is the agent's configuration file (YAML). Every field is optional;
// flags override the fields they name. See docs/monitors.md.
type Config struct {
	// NodeName is this node's name; normally --node-name from the downward API.
	NodeName string `json:"nodeName,omitempty"`
	// Sources lists the sources to run: nvml, dcgm, kmsg, imex, draDriver,
	// services, ib. Default: nvml, kmsg, imex, services and ib (DCGM is
	// opt-in: it needs a DCGM library or a reachable nv-hostengine).
	Sources []string `json:"sources,omitempty"`
	// NVML configures the nvml source.
	NVML NVMLConfig `json:"nvml,omitempty"`
	// DCGM configures the dcgm source.
	DCGM DCGMConfig `json:"dcgm,omitempty"`
	// Kmsg configures the kmsg source.
	Kmsg KmsgConfig `json:"kmsg,omitempty"`
	// IMEX configures the imex source.
	IMEX IMEXConfig `json:"imex,omitempty"`
	// DRADriver configures the draDriver source.
	DRADriver DRADriverConfig `json:"draDriver,omitempty"`
	// Services configures the services source.
	Services ServicesConfig `json:"services,omitempty"`
	// IB configures the ib source.
	IB IBConfig `json:"ib,omitempty"`
	// Inventory configures the NodeInventory report.
	Inventory InventoryConfig `json:"inventory,omitempty"`
	// Spool configures the on-disk spool.
	Spool SpoolConfig `json:"spool,omitempty"`
	// Publish configures writes to the apiserver.
	Publish PublishConfig `json:"publish,omitempty"`
	// Debounce rules hold findings back until they repeat.
	Debounce []DebounceConfig `json:"debounce,omitempty"`
	// MetricsAddr is the Prometheus metrics listen address (default :8080;
	// "0" turns it off).
	MetricsAddr string `json:"metricsAddr,omitempty"`
	// HealthAddr is the /healthz and /readyz listen address (default :8081).
	HealthAddr string `json:"healthAddr,omitempty"`
}

// NVMLConfig configures the nvml source.
type NVMLConfig struct {
	// LibraryPath is the path of libnvidia-ml.so.1 (default: the loader's
	// search path).
	LibraryPath string `json:"libraryPath,omitempty"`
	// PollInterval for NVLink counters and state and the fabric (default 10s).
	PollInterval metav1.Duration `json:"pollInterval,omitempty"`
	// Window over which NVLink error rates are judged (default 1m).
	Window metav1.Duration `json:"window,omitempty"`
	// Thresholds in errors per second by counter: CRC_FLIT, CRC_DATA,
	// REPLAY, RECOVERY; negative turns a counter off.
	Thresholds map[string]float64 `json:"thresholds,omitempty"`
	// FabricGrace is how long the fabric may be NOT_STARTED or IN_PROGRESS
	// after the agent starts (default 10m).
	FabricGrace metav1.Duration `json:"fabricGrace,omitempty"`
	// Performance configures the slow-GPU checks (clocks throttling, PCIe
	// link, memory repair, thermal margin, NVLink speed).
	Performance PerformanceConfig `json:"performance,omitempty"`
}

// PerformanceConfig configures the slow-GPU checks; see docs/monitors.md.
type PerformanceConfig struct {
	// Window the conditions are judged over (default 5m).
	Window metav1.Duration `json:"window,omitempty"`
	// Share of the window a condition must hold for, above 0 and at most
	// 1 (default 0.5).
	Share float64 `json:"share,omitempty"`
	// BusyUtilization is the GPU utilisation in percent from which a PCIe
	// link below its maximum counts (default 30).
	BusyUtilization uint32 `json:"busyUtilization,omitempty"`
	// PCIeReplayRate is the PCIe replay rate per second above which the
	// link is reported (default 8 a minute, DCGM's limit).
	PCIeReplayRate float64 `json:"pcieReplayRate,omitempty"`
	// ThermalMargin in °C below the slowdown temperature (default 5).
	ThermalMargin uint32 `json:"thermalMargin,omitempty"`
	// NVLinkSpeedRatio: a link slower than this share of its GPU's fastest
	// active link is degraded (default 0.95).
	NVLinkSpeedRatio float64 `json:"nvlinkSpeedRatio,omitempty"`
	// Disable lists checks to turn off: Throttled, PCIeDegraded, PCIe,
	// MemoryRepair, ECC, ThermalMargin, NVLinkDegraded.
	Disable []string `json:"disable,omitempty"`
}

// Source returns the slow-GPU judges' view of the configuration.
func (p *PerformanceConfig) Source() slowgpu.Config {
	out := slowgpu.Config{
		Window: p.Window.Duration, Share: p.Share, BusyUtilization: p.BusyUtilization,
		PCIeReplayRate: p.PCIeReplayRate, ThermalMargin: p.ThermalMargin, NVLinkSpeedRatio: p.NVLinkSpeedRatio,
	}
	for _, c := range p.Disable {
		out.Off = append(out.Off, checkOf(c))
	}
	return out
}

func (p *PerformanceConfig) validate(at string) []error {
	var errs []error
	if p.Share < 0 || p.Share > 1 {
		errs = append(errs, fmt.Errorf("%s.share: %g is not within (0, 1]", at, p.Share))
	}
	if p.BusyUtilization > 100 {
		errs = append(errs, fmt.Errorf("%s.busyUtilization: %d is not a percentage", at, p.BusyUtilization))
	}
	if p.PCIeReplayRate < 0 || p.NVLinkSpeedRatio < 0 || p.NVLinkSpeedRatio > 1 {
		errs = append(errs, fmt.Errorf("%s: pcieReplayRate must not be negative and nvlinkSpeedRatio must be within (0, 1]", at))
	}
	known := make([]string, 0, len(slowgpu.Checks))
	for _, c := range slowgpu.Checks {
		known = append(known, string(c))
	}
	for _, c := range p.Disable {
		if !slices.Contains(known, c) {
			errs = append(errs, fmt.Errorf("%s.disable: unknown check %q (known: %s)", at, c, strings.Join(known, ", ")))
		}
	}
	return errs
}

// DCGMConfig configures the dcgm source.
type DCGMConfig struct {
	// Mode is embedded (load libdcgm in the agent) or standalone (connect to
	// nv-hostengine at Address). Default embedded.
	Mode string `json:"mode,omitempty"`
	// Address of nv-hostengine in standalone mode, host:port.
	Address string `json:"address,omitempty"`
	// PollInterval for fields and health checks (default 10s).
	PollInterval metav1.Duration `json:"pollInterval,omitempty"`
	// Performance configures the slow-GPU checks on DCGM's fields, as
	// nvml.performance does on NVML's.
	Performance PerformanceConfig `json:"performance,omitempty"`
}

// KmsgConfig configures the kmsg source.
type KmsgConfig struct {
	// Path of the kernel log device (default /dev/kmsg).
	Path string `json:"path,omitempty"`
}

// IMEXConfig configures the imex source.
type IMEXConfig struct {
	// Command is the nvidia-imex-ctl binary, a path or a name (default:
	// PATH, then the DaemonSet's driver-root mounts
	// /run/nvidia/driver/usr/bin and /host/usr/bin).
	Command string `json:"command,omitempty"`
	// DriverNamespace is the namespace of NVIDIA's DRA driver, where the
	// ComputeDomain daemon pods run (default nvidia-dra-driver-gpu). The
	// agent needs get, list and watch on pods there
	// (config/monitor/imex).
	DriverNamespace string `json:"driverNamespace,omitempty"`
	// Port is the IMEX daemon's command port (default 50005).
	Port int `json:"port,omitempty"`
	// Address targets a host-managed daemon's command service on nodes
	// without a ComputeDomain daemon pod (-q -i <address> <port>).
	Address string `json:"address,omitempty"`
	// ConfigFile is a host-managed daemon's config file as mounted into the
	// agent, used on nodes without a ComputeDomain daemon pod (-q -c and
	// -N -j -c). Set at most one of address and configFile.
	ConfigFile string `json:"configFile,omitempty"`
	// Interval between probes (default 30s).
	Interval metav1.Duration `json:"interval,omitempty"`
	// Timeout of one probe (default 10s).
	Timeout metav1.Duration `json:"timeout,omitempty"`
	// StartupGrace is how long a daemon pod that is not Ready is left alone
	// after it started (default 10m).
	StartupGrace metav1.Duration `json:"startupGrace,omitempty"`
}

// DRADriverConfig configures the draDriver source, which reads the health
// taints NVIDIA's DRA driver puts on this node's GPUs (its
// NVMLDeviceHealthCheck gate) from the node's ResourceSlices. Opt-in (the
// nvml source sees the same XIDs first-hand): for nodes where the driver's
// health check runs and gpuhealth's NVML source does not.
type DRADriverConfig struct {
	// Driver is the DRA driver (default gpu.nvidia.com).
	Driver string `json:"driver,omitempty"`
	// Interval between reads of the node's slices (default 30s).
	Interval metav1.Duration `json:"interval,omitempty"`
}

// ServicesConfig configures the services source, which reads NVIDIA's host
// services' processes from the host's /proc.
type ServicesConfig struct {
	// ProcRoot is the host's /proc as mounted (default /host/proc).
	ProcRoot string `json:"procRoot,omitempty"`
	// Interval between reads (default 30s).
	Interval metav1.Duration `json:"interval,omitempty"`
	// Window over which restarts are counted (default 10m).
	Window metav1.Duration `json:"window,omitempty"`
	// MaxRestarts within Window from which a service is restarting over
	// and over (default 3).
	MaxRestarts int `json:"maxRestarts,omitempty"`
	// IMEXNodesConfig is the host IMEX daemon's nodes_config.cfg as
	// mounted (default /host/etc/nvidia-imex/nodes_config.cfg, the chart's
	// monitor.hostIMEXConfig): where it exists, the daemon should run.
	IMEXNodesConfig string `json:"imexNodesConfig,omitempty"`
}

// IBConfig configures the ib source, which reads the node's InfiniBand and
// RoCE ports from the kernel's RDMA sysfs tree. Defaults and their reasons:
// monitors/ib.
type IBConfig struct {
	// SysRoot is sysfs as mounted (default inventory.sysRoot, else /sys).
	SysRoot string `json:"sysRoot,omitempty"`
	// Interval between reads (default 1s).
	Interval metav1.Duration `json:"interval,omitempty"`
	// Devices are patterns (path.Match: mlx5_*, 0000:c1:00.*) of RDMA
	// device names or PCI addresses whose ports are the compute fabric
	// besides every InfiniBand port: name RoCE adapters here.
	Devices []string `json:"devices,omitempty"`
	// Exclude are patterns of devices never judged, even InfiniBand ones
	// (a management adapter in InfiniBand mode).
	Exclude []string `json:"exclude,omitempty"`
	// ExpectedRateGbps is every compute port's rate (400 for NDR); unset,
	// the fastest of the node's ports of the same adapter type.
	ExpectedRateGbps float64 `json:"expectedRateGbps,omitempty"`
	// ExpectedRates are compute ports' rates by adapter hca_type (MT4129:
	// ConnectX-7); they win over expectedRateGbps.
	ExpectedRates map[string]float64 `json:"expectedRates,omitempty"`
	// ExpectedDevices is how many adapters with a compute port the node
	// has; unset, not checked (the PCI bus is still compared).
	ExpectedDevices int `json:"expectedDevices,omitempty"`
	// DownGrace is how long a port is down before it is reported (10s).
	DownGrace metav1.Duration `json:"downGrace,omitempty"`
	// FlapWindow and MaxFlaps: MaxFlaps downs within FlapWindow is
	// flapping (10m, 2).
	FlapWindow metav1.Duration `json:"flapWindow,omitempty"`
	MaxFlaps   int             `json:"maxFlaps,omitempty"`
	// RateGrace is how long a port runs below its expected rate before it
	// is reported (30s).
	RateGrace metav1.Duration `json:"rateGrace,omitempty"`
	// CounterWindow is the window of the error counters' rates (5m).
	CounterWindow metav1.Duration `json:"counterWindow,omitempty"`
	// Thresholds replace the default per-second thresholds of error
	// counters by file name (symbol_error, link_error_recovery, …); 0
	// turns a counter's judgement off.
	Thresholds map[string]float64 `json:"thresholds,omitempty"`
}

// InventoryConfig configures the NodeInventory the agent writes about its
// node: the NVIDIA stack (driver, VBIOS, modes), the PCI bus's GPUs and
// NVIDIA's services, which the operator compares across a pool.
type InventoryConfig struct {
	// Disabled turns the report off.
	Disabled bool `json:"disabled,omitempty"`
	// Interval is the longest time between two writes; a change is
	// written within a minute (default 10m).
	Interval metav1.Duration `json:"interval,omitempty"`
	// SysRoot is sysfs as mounted (default /sys); the PCI bus is read
	// under it.
	SysRoot string `json:"sysRoot,omitempty"`
	// DpkgStatus is the host's dpkg status file as mounted (default
	// /host/var/lib/dpkg/status); Fabric Manager's and IMEX's versions
	// come from it. Absent on hosts without dpkg: the versions are then
	// not reported.
	DpkgStatus string `json:"dpkgStatus,omitempty"`
}

// SpoolConfig configures the on-disk spool.
type SpoolConfig struct {
	// Dir is the spool directory, on a hostPath so it survives the pod
	// (default /var/lib/gpuhealth/spool).
	Dir string `json:"dir,omitempty"`
	// MaxRecords bounds the findings kept (default 2048).
	MaxRecords int `json:"maxRecords,omitempty"`
}

// PublishConfig configures writes to the apiserver.
type PublishConfig struct {
	// Window is the coalescing window: at most one write per event per
	// window (default 5s).
	Window metav1.Duration `json:"window,omitempty"`
	// QPS and Burst are the client-side rate limit (default 20 and 50).
	QPS   float32 `json:"qps,omitempty"`
	Burst int     `json:"burst,omitempty"`
}

// DebounceConfig is one debounce rule.
type DebounceConfig struct {
	// Check the rule applies to, for example IMEXDaemon.
	Check string `json:"check"`
	// Code narrows the rule to one code.
	Code string `json:"code,omitempty"`
	// Occurrences within Window release the finding.
	Occurrences int `json:"occurrences"`
	// Window the occurrences must fall within.
	Window metav1.Duration `json:"window"`
}

// Known source names.
var knownSources = []string{"nvml", "dcgm", "kmsg", "imex", "draDriver", "services", "ib"}

// DefaultSources are run when the configuration names none.
var DefaultSources = []string{"nvml", "kmsg", "imex", "services", "ib"}

// ParseConfig parses a configuration file strictly: an unknown field, a bad
// duration or an unknown source is an error that names it.
func ParseConfig(data []byte) (Config, error) {
	var c Config
	if err := yaml.UnmarshalStrict(data, &c); err != nil {
		return Config{}, fmt.Errorf("parsing monitor configuration: %w", err)
	}
	if err := c.Validate(); err != nil {
		return Config{}, err
	}
	return c, nil
}

// Validate checks values that parse but make no sense.
func (c *Config) Validate() error {
	var errs []error
	for _, s := range c.Sources {
		if !slices.Contains(knownSources, s) {
			errs = append(errs, fmt.Errorf("sources: unknown source %q (known: %s)", s, strings.Join(knownSources, ", ")))
		}
	}
	for k := range c.NVML.Thresholds {
		if !slices.Contains([]string{"CRC_FLIT", "CRC_DATA", "REPLAY", "RECOVERY"}, k) {
			errs = append(errs, fmt.Errorf("nvml.thresholds: unknown counter %q (known: CRC_FLIT, CRC_DATA, REPLAY, RECOVERY)", k))
		}
	}
	errs = append(errs, c.NVML.Performance.validate("nvml.performance")...)
	errs = append(errs, c.DCGM.Performance.validate("dcgm.performance")...)
	if m := c.DCGM.Mode; m != "" && m != "embedded" && m != "standalone" {
		errs = append(errs, fmt.Errorf("dcgm.mode: %q is neither embedded nor standalone", m))
	}
	if c.DCGM.Mode == "standalone" && c.DCGM.Address == "" {
		errs = append(errs, errors.New("dcgm.address: required in standalone mode"))
	}
	for name, d := range map[string]metav1.Duration{
		"nvml.pollInterval": c.NVML.PollInterval, "nvml.window": c.NVML.Window, "nvml.fabricGrace": c.NVML.FabricGrace,
		"dcgm.pollInterval": c.DCGM.PollInterval, "imex.interval": c.IMEX.Interval, "imex.timeout": c.IMEX.Timeout,
		"imex.startupGrace": c.IMEX.StartupGrace, "nvml.performance.window": c.NVML.Performance.Window, "draDriver.interval": c.DRADriver.Interval,
		"dcgm.performance.window": c.DCGM.Performance.Window,
		"publish.window":          c.Publish.Window,
		"services.interval":       c.Services.Interval, "services.window": c.Services.Window,
		"inventory.interval": c.Inventory.Interval,
		"ib.interval":        c.IB.Interval, "ib.downGrace": c.IB.DownGrace, "ib.flapWindow": c.IB.FlapWindow,
		"ib.rateGrace": c.IB.RateGrace, "ib.counterWindow": c.IB.CounterWindow,
	} {
		if d.Duration < 0 {
			errs = append(errs, fmt.Errorf("%s: must not be negative", name))
		}
	}
	if c.IMEX.Address != "" && c.IMEX.ConfigFile != "" {
		errs = append(errs, errors.New("imex: set at most one of address and configFile (nvidia-imex-ctl takes one of -i and -c)"))
	}
	if p := c.IMEX.Port; p < 0 || p > 65535 {
		errs = append(errs, fmt.Errorf("imex.port: %d is not a TCP port", p))
	}
	if c.Services.MaxRestarts < 0 {
		errs = append(errs, errors.New("services.maxRestarts must not be negative"))
	}
	errs = append(errs, c.IB.validate()...)
	if c.Spool.MaxRecords < 0 || c.Publish.Burst < 0 || c.Publish.QPS < 0 {
		errs = append(errs, errors.New("spool.maxRecords, publish.qps and publish.burst must not be negative"))
	}
	for i, d := range c.Debounce {
		if d.Check == "" || d.Occurrences < 1 || d.Window.Duration <= 0 {
			errs = append(errs, fmt.Errorf("debounce[%d]: needs a check, occurrences of at least 1 and a positive window", i))
		}
	}
	return errors.Join(errs...)
}

// validate checks the ib source's patterns and numbers.
func (c *IBConfig) validate() []error {
	var errs []error
	for field, patterns := range map[string][]string{"ib.devices": c.Devices, "ib.exclude": c.Exclude} {
		for _, p := range patterns {
			if _, err := path.Match(p, ""); err != nil || p == "" {
				errs = append(errs, fmt.Errorf("%s: %q is not a pattern (path.Match syntax: mlx5_*, 0000:c1:00.?)", field, p))
			}
		}
	}
	if c.ExpectedRateGbps < 0 || c.ExpectedDevices < 0 || c.MaxFlaps < 0 {
		errs = append(errs, errors.New("ib.expectedRateGbps, ib.expectedDevices and ib.maxFlaps must not be negative"))
	}
	for k, v := range c.ExpectedRates {
		if v <= 0 {
			errs = append(errs, fmt.Errorf("ib.expectedRates[%s]: must be positive", k))
		}
	}
	for k := range c.Thresholds {
		if k == "" || strings.ContainsAny(k, "/.") {
			errs = append(errs, fmt.Errorf("ib.thresholds: %q is not a counter file name", k))
		}
	}
	return errs
}

// SourcesOrDefault returns the configured sources or DefaultSources.
func (c *Config) SourcesOrDefault() []string {
	if len(c.Sources) == 0 {
		return DefaultSources
	}
	return c.Sources
}

// DebounceRules converts the debounce configuration for the pipeline.
func (c *Config) DebounceRules() []pipeline.DebounceRule {
	out := make([]pipeline.DebounceRule, 0, len(c.Debounce))
	for _, d := range c.Debounce {
		out = append(out, pipeline.DebounceRule{Check: checkOf(d.Check), Code: d.Code, Occurrences: d.Occurrences, Window: d.Window.Duration})
	}
	return out
}

func checkOf(s string) gpuhealthv1alpha1.Check { return gpuhealthv1alpha1.Check(s) }

// Override sets every field that is set in o.
func (c *Config) Override(o *Config) {
	if o.NodeName != "" {
		c.NodeName = o.NodeName
	}
	if len(o.Sources) > 0 {
		c.Sources = o.Sources
	}
	if o.Spool.Dir != "" {
		c.Spool.Dir = o.Spool.Dir
	}
	if o.NVML.LibraryPath != "" {
		c.NVML.LibraryPath = o.NVML.LibraryPath
	}
	if o.Kmsg.Path != "" {
		c.Kmsg.Path = o.Kmsg.Path
	}
	if o.MetricsAddr != "" {
		c.MetricsAddr = o.MetricsAddr
	}
	if o.HealthAddr != "" {
		c.HealthAddr = o.HealthAddr
	}
}
