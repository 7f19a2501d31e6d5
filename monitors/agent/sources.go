package agent

import (
	"cmp"
	"context"
	"fmt"
	"slices"

	"github.com/go-logr/logr"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gpuhealth/gpuhealth/monitors"
	"github.com/gpuhealth/gpuhealth/monitors/dcgm"
	"github.com/gpuhealth/gpuhealth/monitors/dradriver"
	"github.com/gpuhealth/gpuhealth/monitors/ib"
	"github.com/gpuhealth/gpuhealth/monitors/imex"
	"github.com/gpuhealth/gpuhealth/monitors/kmsg"
	"github.com/gpuhealth/gpuhealth/monitors/nvml"
	"github.com/gpuhealth/gpuhealth/monitors/services"
)

// sourceDeps is what sources need beyond their configuration.
type sourceDeps struct {
	// stateDir holds source state (the kmsg cursor).
	stateDir string
	// nodeLabels reads this node's labels; nil unless needsNode.
	nodeLabels func(context.Context) (map[string]string, error)
	// restConfig reaches the apiserver; the imex source watches the
	// ComputeDomain daemon pods of this node with it. Nil in tests that
	// build sources without an apiserver: then no daemon pod is looked up.
	restConfig *rest.Config
	// sync and seal are the pipeline's Sync and Seal, which the kmsg
	// source calls around each cursor write.
	sync func(gen uint64) error
	seal func(gen uint64)
	log  logr.Logger
}

// needsNode reports whether a configured source reads the node's labels.
func needsNode(cfg Config) bool {
	return slices.Contains(cfg.SourcesOrDefault(), "imex")
}

// built are the sources the inventory report reads, when configured.
type built struct {
	nvml     *nvml.Source
	services *services.Source
	ib       *ib.Source
}

// scanPCI scans the PCI bus under the configured sysfs.
func scanPCI(cfg Config) func() (services.PCI, error) {
	root := cfg.Inventory.SysRoot
	if root == "" {
		root = services.DefaultSysRoot
	}
	return func() (services.PCI, error) { return services.ScanPCI(root) }
}

// buildSources makes the configured sources, in the configured order.
func buildSources(_ context.Context, cfg Config, deps sourceDeps) ([]monitors.Source, built, error) {
	var out []monitors.Source
	var nv *nvml.Source
	var b built
	names := cfg.SourcesOrDefault()
	pci := scanPCI(cfg)
	if slices.Contains(names, "nvml") {
		thresholds := map[nvml.Counter]float64{}
		for k, v := range cfg.NVML.Thresholds {
			thresholds[nvml.Counter(k)] = v
		}
		nv = &nvml.Source{
			LibraryPath:  cfg.NVML.LibraryPath,
			PollInterval: cfg.NVML.PollInterval.Duration,
			Window:       cfg.NVML.Window.Duration,
			Thresholds:   thresholds,
			FabricGrace:  cfg.NVML.FabricGrace.Duration,
			Performance:  cfg.NVML.Performance.Source(),
			PCIGPUs: func() ([]string, error) {
				p, err := pci()
				return p.GPUs, err
			},
			Log: deps.log.WithName("nvml"),
		}
		b.nvml = nv
	}
	if slices.Contains(names, "ib") {
		c := cfg.IB
		b.ib = &ib.Source{
			SysRoot: cmp.Or(c.SysRoot, cfg.Inventory.SysRoot), Interval: c.Interval.Duration,
			Devices: c.Devices, Exclude: c.Exclude,
			ExpectedRateGbps: c.ExpectedRateGbps, ExpectedRates: c.ExpectedRates, ExpectedDevices: c.ExpectedDevices,
			DownGrace: c.DownGrace.Duration, FlapWindow: c.FlapWindow.Duration, MaxFlaps: c.MaxFlaps,
			RateGrace: c.RateGrace.Duration, CounterWindow: c.CounterWindow.Duration, Thresholds: c.Thresholds,
		}
	}
	// With both, one XID arrives twice; see xidDedup.
	var dedup *xidDedup
	if nv != nil && slices.Contains(names, "kmsg") {
		dedup = newXIDDedup(nil)
	}
	for _, name := range names {
		switch name {
		case "nvml":
			if dedup != nil {
				out = append(out, xidTap{Source: nv, d: dedup})
				continue
			}
			out = append(out, nv)
		case "kmsg":
			k := &kmsg.Source{Path: cfg.Kmsg.Path, StateDir: deps.stateDir, Sync: deps.sync, Seal: deps.seal}
			if nv != nil {
				k.Resolver = nv.ResolvePCI
			}
			if b.ib != nil {
				// The ib source knows which adapters are the compute
				// fabric: an mlx5 line about another never quarantines.
				k.NICResolver = b.ib.Resolve
			}
			if dedup != nil {
				k.Reading = dedup.setKernelLog
				out = append(out, xidTap{Source: k, d: dedup})
				continue
			}
			out = append(out, k)
		case "dcgm":
			out = append(out, &dcgm.Source{
				Mode:         dcgm.Mode(cfg.DCGM.Mode),
				Address:      cfg.DCGM.Address,
				PollInterval: cfg.DCGM.PollInterval.Duration,
				Performance:  cfg.DCGM.Performance.Source(),
				Log:          deps.log.WithName("dcgm"),
			})
		case "imex":
			src := &imex.Source{
				Command:      cfg.IMEX.Command,
				NodeName:     cfg.NodeName,
				Port:         cfg.IMEX.Port,
				Address:      cfg.IMEX.Address,
				ConfigFile:   cfg.IMEX.ConfigFile,
				Interval:     cfg.IMEX.Interval.Duration,
				Timeout:      cfg.IMEX.Timeout.Duration,
				StartupGrace: cfg.IMEX.StartupGrace.Duration,
				NodeLabels:   deps.nodeLabels,
			}
			if deps.restConfig != nil && cfg.NodeName != "" {
				pods, err := imex.NewPodWatch(deps.restConfig, cfg.NodeName, cfg.IMEX.DriverNamespace)
				if err != nil {
					return nil, built{}, err
				}
				src.Pods = pods
			}
			out = append(out, src)
		case dradriver.Name:
			src := &dradriver.Source{Driver: cfg.DRADriver.Driver, NodeName: cfg.NodeName, Interval: cfg.DRADriver.Interval.Duration}
			if deps.restConfig != nil {
				c, err := client.New(deps.restConfig, client.Options{})
				if err != nil {
					return nil, built{}, fmt.Errorf("the draDriver source's apiserver client: %w", err)
				}
				src.Reader = c
			}
			out = append(out, src)
		case "ib":
			out = append(out, b.ib)
		case "services":
			b.services = &services.Source{
				ProcRoot: cfg.Services.ProcRoot, SysRoot: cfg.Inventory.SysRoot, Interval: cfg.Services.Interval.Duration,
				Window: cfg.Services.Window.Duration, MaxRestarts: cfg.Services.MaxRestarts, IMEXNodesConfig: cfg.Services.IMEXNodesConfig,
			}
			out = append(out, b.services)
		default:
			return nil, built{}, fmt.Errorf("source %q is not built into this agent", name)
		}
	}
	return out, b, nil
}
