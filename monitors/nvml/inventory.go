package nvml

import (
	"fmt"
	"sort"
	"strings"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/monitors"
)

// DefaultInventoryInterval is how often the driver's and each GPU's
// versions and modes are read again: they change only with a driver
// upgrade, a firmware flash or an administrator's nvidia-smi, so a few
// minutes late is soon enough, and the reads cost nothing between.
const DefaultInventoryInterval = 5 * time.Minute

// Inventory is the NVIDIA stack as NVML shows it.
type Inventory struct {
	Driver gpuhealthv1alpha1.DriverInventory
	GPUs   []gpuhealthv1alpha1.GPUInventory
}

// Inventory returns the last inventory read, and false before the source
// has read one (NVML unavailable, or not started yet).
func (s *Source) Inventory() (Inventory, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.inventory == nil {
		return Inventory{}, false
	}
	inv := *s.inventory
	inv.GPUs = append([]gpuhealthv1alpha1.GPUInventory(nil), inv.GPUs...)
	return inv, true
}

// readInventory reads the driver's and every GPU's versions and modes. A
// value a GPU does not support (MIG on an A10, ECC on a consumer card) is
// left empty; only a lost GPU is an error, and it is left out.
func readInventory(lib gonvml.Interface, devices []*device) *Inventory {
	inv := &Inventory{}
	if v, ret := lib.SystemGetDriverVersion(); ret == gonvml.SUCCESS {
		inv.Driver.Version = v
	}
	if v, ret := lib.SystemGetCudaDriverVersion(); ret == gonvml.SUCCESS && v > 0 {
		inv.Driver.CUDAVersion = fmt.Sprintf("%d.%d", v/1000, v%1000/10)
	}
	if v, ret := lib.SystemGetNVMLVersion(); ret == gonvml.SUCCESS {
		inv.Driver.NVMLVersion = v
	}
	for _, d := range devices {
		h := d.handle
		g := gpuhealthv1alpha1.GPUInventory{Index: int32(d.index), UUID: d.uuid, PCIBusID: d.pciBus}
		if v, ret := h.GetName(); ret == gonvml.SUCCESS {
			g.Product = v
		}
		if v, ret := h.GetVbiosVersion(); ret == gonvml.SUCCESS {
			g.VBIOS = v
		}
		if v, ret := h.GetInforomImageVersion(); ret == gonvml.SUCCESS {
			g.InfoROM = v
		}
		if cur, _, ret := h.GetEccMode(); ret == gonvml.SUCCESS {
			g.ECC = enabled(cur == gonvml.FEATURE_ENABLED)
		}
		if v, ret := h.GetPersistenceMode(); ret == gonvml.SUCCESS {
			g.Persistence = enabled(v == gonvml.FEATURE_ENABLED)
		}
		if cur, _, ret := h.GetMigMode(); ret == gonvml.SUCCESS {
			g.MIG = enabled(cur == gonvml.DEVICE_MIG_ENABLE)
		}
		if mw, ret := h.GetPowerManagementLimit(); ret == gonvml.SUCCESS {
			g.PowerLimitWatts = int32(mw / 1000)
		}
		inv.GPUs = append(inv.GPUs, g)
	}
	return inv
}

func enabled(on bool) string {
	if on {
		return "Enabled"
	}
	return "Disabled"
}

// GPUMissingPCI is the code of the finding that NVML lists fewer GPUs than
// the PCI bus has.
const GPUMissingPCI = "PCI"

// missingFromNVML returns the PCI addresses of the bus's GPUs that NVML does
// not list, sorted.
func missingFromNVML(pciGPUs []string, devices []*device) []string {
	seen := map[string]bool{}
	for _, d := range devices {
		seen[d.pciBus] = true
	}
	var out []string
	for _, b := range pciGPUs {
		if !seen[NormalizeBusID(b)] {
			out = append(out, NormalizeBusID(b))
		}
	}
	sort.Strings(out)
	return out
}

// gpuMissingFinding is the node's GPUMissing (PCI) finding: NVML lists
// fewer GPUs than the PCI bus has. A GPU that fell off NVML's list at boot
// (a failed init, an InfoROM or power fault) is invisible to every check
// NVML drives; only the bus still shows it. Fatal, and a reboot first: a
// GPU that is still missing after one recurs and the node's attempts run
// out (docs/operations.md). Resolved when none is missing.
func gpuMissingFinding(missing []string, nvmlCount, pciCount int, now time.Time) monitors.Finding {
	f := monitors.Finding{
		Source: gpuhealthv1alpha1.SourceNVML, Check: gpuhealthv1alpha1.CheckGPUMissing,
		Component: gpuhealthv1alpha1.Component{Kind: gpuhealthv1alpha1.ComponentNode},
		Code:      GPUMissingPCI, Severity: gpuhealthv1alpha1.SeverityFatal, Action: gpuhealthv1alpha1.ActionRebootNode,
		Time: now, Resolved: len(missing) == 0,
	}
	if len(missing) == 0 {
		f.Message = fmt.Sprintf("NVML lists every GPU the PCI bus has (%d)", nvmlCount)
		return f
	}
	f.Message = fmt.Sprintf("NVML lists %d GPUs, the PCI bus has %d NVIDIA GPUs; not in NVML: %s", nvmlCount, pciCount, strings.Join(missing, ", "))
	return f
}
