package nvml

import (
	"context"
	"fmt"
	"strconv"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/monitors"
)

// Fabric finding codes.
const (
	FabricNotStarted      = "NOT_STARTED"
	FabricInProgress      = "IN_PROGRESS"
	FabricError           = "FABRIC_ERROR"
	FabricUnhealthy       = "UNHEALTHY"
	FabricLimitedCapacity = "LIMITED_CAPACITY"
	// LinkDown is the code of an NVLinkDown finding.
	LinkDown = "DOWN"
)

var fabricCodes = []string{FabricNotStarted, FabricInProgress, FabricError, FabricUnhealthy, FabricLimitedCapacity}

// poll reads NVLink counters and state and the fabric every PollInterval.
func (s *Source) poll(ctx context.Context, lib gonvml.Interface, report monitors.Reporter) error {
	interval := s.PollInterval
	if interval <= 0 {
		interval = DefaultPollInterval
	}
	tracker := &monitors.Tracker{Repeat: s.Repeat}
	// A slow-GPU condition that holds is reported again once a judging
	// window: each report is one more occurrence for a policy's debounce.
	perfTracker := &monitors.Tracker{Repeat: s.Performance.Repeat(s.Repeat)}
	started := s.clock().Now()
	ticker := s.clock().NewTicker(interval)
	defer ticker.Stop()
	inventoryEvery := s.InventoryInterval
	if inventoryEvery <= 0 {
		inventoryEvery = DefaultInventoryInterval
	}
	var inventoried time.Time
	for {
		now := s.clock().Now()
		if inventoried.IsZero() || now.Sub(inventoried) >= inventoryEvery {
			s.takeInventory(lib, now, tracker, inventoried.IsZero(), report)
			inventoried = now
		}
		for _, d := range s.devices {
			if s.isLost(d) {
				continue
			}
			if err := s.pollDevice(now, started, d, tracker, perfTracker, report); err != nil {
				s.markLost(d, report)
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C():
		}
	}
}

// takeInventory reads the inventory and compares NVML's GPUs with the PCI
// bus's. At the first read a bus that agrees resolves a GPUMissing finding
// an earlier run of the agent (before a reboot) left open.
func (s *Source) takeInventory(lib gonvml.Interface, now time.Time, tracker *monitors.Tracker, first bool, report monitors.Reporter) {
	s.mu.Lock()
	devices := s.devices
	s.mu.Unlock()
	var live []*device
	for _, d := range devices {
		if !s.isLost(d) {
			live = append(live, d)
		}
	}
	inv := readInventory(lib, live)
	s.mu.Lock()
	s.inventory = inv
	s.mu.Unlock()
	pci := s.pciGPUs()
	if pci == nil {
		return
	}
	// A GPU lost while running is the GPULost finding's, not this one's:
	// compare with every GPU NVML listed at the start.
	missing := missingFromNVML(pci, devices)
	f := gpuMissingFinding(missing, len(devices), len(pci), now)
	if len(missing) == 0 && first {
		report(f)
		return
	}
	tracker.Set(now, f, len(missing) > 0, report)
}

// pollDevice reads one GPU; it returns errLost when NVML says the GPU is lost.
func (s *Source) pollDevice(now, started time.Time, d *device, tracker, perfTracker *monitors.Tracker, report monitors.Reporter) error {
	window := s.Window
	if window <= 0 {
		window = DefaultWindow
	}
	var up []int
	for _, l := range d.links {
		linkID := d.uuid + "/link-" + strconv.Itoa(l)
		state, ret := d.handle.GetNvLinkState(l)
		if ret == gonvml.ERROR_GPU_IS_LOST {
			return errLost
		}
		if ret == gonvml.SUCCESS {
			if state == gonvml.FEATURE_ENABLED {
				up = append(up, l)
			}
			tracker.Set(now, monitors.Finding{
				Source:    gpuhealthv1alpha1.SourceNVML,
				Check:     gpuhealthv1alpha1.CheckNVLinkDown,
				Component: gpuhealthv1alpha1.Component{Kind: gpuhealthv1alpha1.ComponentNVLink, ID: linkID},
				Code:      LinkDown,
				Message:   fmt.Sprintf("NVLink %d of GPU %d (%s) is down", l, d.index, d.uuid),
			}, state == gonvml.FEATURE_DISABLED, report)
		}
		for _, c := range counterOrder {
			threshold, ok := s.Thresholds[c]
			if !ok {
				threshold = DefaultThresholds[c]
			}
			if threshold < 0 {
				continue
			}
			v, ret := d.handle.GetNvLinkErrorCounter(l, nvmlCounters[c])
			if ret == gonvml.ERROR_GPU_IS_LOST {
				return errLost
			}
			if ret != gonvml.SUCCESS {
				continue
			}
			key := strconv.Itoa(l) + "/" + string(c)
			r := d.rates[key]
			if r == nil {
				r = &monitors.Rate{}
				d.rates[key] = r
			}
			perSecond, known := r.Add(now, v, window)
			if !known {
				continue
			}
			tracker.Set(now, monitors.Finding{
				Source:    gpuhealthv1alpha1.SourceNVML,
				Check:     gpuhealthv1alpha1.CheckNVLinkErrors,
				Component: gpuhealthv1alpha1.Component{Kind: gpuhealthv1alpha1.ComponentNVLink, ID: linkID},
				Code:      string(c),
				Message: fmt.Sprintf("NVLink %d of GPU %d (%s): %s errors at %.1f/s over the last %s (threshold %g/s)",
					l, d.index, d.uuid, c, perSecond, window, threshold),
			}, perSecond > threshold, report)
		}
	}
	if d.fabric {
		if err := s.pollFabric(now, started, d, tracker, report); err != nil {
			return err
		}
	}
	return s.pollPerformance(now, d, up, perfTracker, report)
}

// fabricInfo reads the GPU's fabric state: through
// nvmlDeviceGetGpuFabricInfoV (state, status and health summary) where the
// driver has it, else through nvmlDeviceGetGpuFabricInfo (R535: state and
// status only, so no UNHEALTHY or LIMITED_CAPACITY finding there).
func (s *Source) fabricInfo(d *device) (gonvml.GpuFabricInfo_v3, gonvml.Return) {
	if s.symbols.gpuFabricInfoV {
		return d.handle.GetGpuFabricInfoV().V3()
	}
	old, ret := d.handle.GetGpuFabricInfo()
	return gonvml.GpuFabricInfo_v3{ClusterUuid: old.ClusterUuid, Status: old.Status, CliqueId: old.CliqueId, State: old.State}, ret
}

// pollFabric judges the GPU's fabric state and health summary.
func (s *Source) pollFabric(now, started time.Time, d *device, tracker *monitors.Tracker, report monitors.Reporter) error {
	info, ret := s.fabricInfo(d)
	switch {
	case ret == gonvml.ERROR_GPU_IS_LOST:
		return errLost
	case ret == gonvml.ERROR_NOT_SUPPORTED || ret == gonvml.ERROR_FUNCTION_NOT_FOUND:
		d.fabric = false
		return nil
	case ret != gonvml.SUCCESS:
		return nil //nolint:nilerr // a transient read failure; the next poll tries again
	}
	grace := s.FabricGrace
	if grace <= 0 {
		grace = DefaultFabricGrace
	}
	code, severity := "", gpuhealthv1alpha1.SeverityFatal
	switch info.State {
	case gonvml.GPU_FABRIC_STATE_NOT_SUPPORTED:
		d.fabric = false
		return nil
	case gonvml.GPU_FABRIC_STATE_NOT_STARTED, gonvml.GPU_FABRIC_STATE_IN_PROGRESS:
		code = FabricNotStarted
		if info.State == gonvml.GPU_FABRIC_STATE_IN_PROGRESS {
			code = FabricInProgress
		}
		if !d.fabricCompleted && now.Sub(started) < grace {
			code = "" // still training after boot
		}
	case gonvml.GPU_FABRIC_STATE_COMPLETED:
		d.fabricCompleted = true
		switch {
		case gonvml.Return(info.Status) != gonvml.SUCCESS:
			code = FabricError
		case info.HealthSummary == gonvml.GPU_FABRIC_HEALTH_SUMMARY_UNHEALTHY:
			code = FabricUnhealthy
		case info.HealthSummary == gonvml.GPU_FABRIC_HEALTH_SUMMARY_LIMITED_CAPACITY:
			code, severity = FabricLimitedCapacity, gpuhealthv1alpha1.SeverityDegraded
		}
	}
	for _, c := range fabricCodes {
		f := monitors.Finding{
			Source:    gpuhealthv1alpha1.SourceNVML,
			Check:     gpuhealthv1alpha1.CheckFabric,
			Component: gpuhealthv1alpha1.Component{Kind: gpuhealthv1alpha1.ComponentGPU, ID: d.uuid},
			Code:      c,
		}
		if c == code {
			f.Severity = severity
			f.Message = fmt.Sprintf("GPU %d (%s) fabric %s (state %d, status %d, clique %d, health summary %d)",
				d.index, d.uuid, c, info.State, info.Status, info.CliqueId, info.HealthSummary)
		}
		tracker.Set(now, f, c == code, report)
	}
	return nil
}
