// Package dradriver turns the health taints NVIDIA's DRA driver for GPUs
// puts on its own devices into findings: with the driver's
// NVMLDeviceHealthCheck gate on, a GPU's XID becomes a taint
// gpu.nvidia.com/xid=<XID> (NoSchedule, or None for the XIDs the driver
// ignores) and a GPU the driver lost a taint gpu.nvidia.com/gpu-lost on
// every device of the node. The driver stops there: no NoExecute, no
// reset, no recertification, and a later XID can lower an earlier taint.
// As findings (source draDriver) they get gpuhealth's whole workflow.
//
// The source reads only this node's ResourceSlices of the driver (field
// selectors spec.nodeName and spec.driver): what the driver on this node
// published, which only that node's kubelet plugin may write.
package dradriver

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"time"

	resourcev1 "k8s.io/api/resource/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/monitors"
	"github.com/gpuhealth/gpuhealth/remediation/devicetaint"
	"github.com/gpuhealth/gpuhealth/remediation/job"
)

// Name is the source's name in the agent's configuration.
const Name = "draDriver"

// The driver's taint keys and its default name.
const (
	DefaultDriver = "gpu.nvidia.com"
	// XIDTaint's value is the decimal XID.
	XIDTaint = job.DriverXIDTaint
	// GPULostTaint has no value.
	GPULostTaint = job.DriverGPULostTaint
	// defaultInterval is how often the slices are read.
	defaultInterval = 30 * time.Second
)

// Source reads the node's slices of Driver every Interval.
type Source struct {
	// Driver is the DRA driver (default gpu.nvidia.com); NodeName this node.
	Driver, NodeName string
	// Interval between reads (default 30s).
	Interval time.Duration
	// Reader reads ResourceSlices, answering the field selectors
	// spec.nodeName and spec.driver (the apiserver does).
	Reader client.Reader
}

// Name is the source's name.
func (s *Source) Name() string { return Name }

// Run reports a finding when a taint appears on a GPU and a resolved one
// when it goes (the driver clears its taints only when its plugin
// restarts).
func (s *Source) Run(ctx context.Context, report monitors.Reporter) error {
	if s.Reader == nil || s.NodeName == "" {
		return monitors.Unavailable("the draDriver source needs the apiserver and the node's name")
	}
	driver := s.Driver
	if driver == "" {
		driver = DefaultDriver
	}
	interval := s.Interval
	if interval <= 0 {
		interval = defaultInterval
	}
	var prev map[monitors.Key]monitors.Finding
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		var list resourcev1.ResourceSliceList
		err := s.Reader.List(ctx, &list, client.MatchingFields{"spec.nodeName": s.NodeName, "spec.driver": driver})
		if err == nil {
			now := Findings(list.Items, driver, s.NodeName)
			for k, f := range now {
				if _, seen := prev[k]; !seen {
					f.Time = time.Now()
					report(f)
				}
			}
			for k, f := range prev {
				if _, still := now[k]; !still {
					f.Resolved, f.Time, f.Message = true, time.Now(), "the DRA driver's taint is gone"
					report(f)
				}
			}
			prev = now
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// Findings are the health taints on the node's GPUs in the newest
// generation of each of the driver's pools: an XID taint whose effect is
// not None, with an XID for a value, is a finding XID <n> on the GPU; a
// gpu-lost taint a finding GPULost. Devices without a uuid attribute and
// taints of other keys are skipped. Pure.
func Findings(slices []resourcev1.ResourceSlice, driver, node string) map[monitors.Key]monitors.Finding {
	out := map[monitors.Key]monitors.Finding{}
	for _, s := range devicetaint.Current(slices, driver, node) {
		for _, d := range s.Devices {
			uuid := devicetaint.DeviceUUID(d, driver)
			if uuid == "" {
				continue
			}
			for _, t := range d.Taints {
				if f, ok := finding(t, uuid, d.Name); ok {
					out[f.Key()] = f
				}
			}
		}
	}
	return out
}

// finding is the finding a taint of the driver's on the GPU uuid stands for.
func finding(t resourcev1.DeviceTaint, uuid, device string) (monitors.Finding, bool) {
	gpu := gpuhealthv1alpha1.Component{Kind: gpuhealthv1alpha1.ComponentGPU, ID: uuid}
	if !validComponentID(uuid) {
		return monitors.Finding{}, false
	}
	switch t.Key {
	case XIDTaint:
		if t.Effect == resourcev1.DeviceTaintEffectNone {
			return monitors.Finding{}, false // the driver's own "ignore"
		}
		n, err := strconv.Atoi(t.Value)
		if err != nil || n <= 0 || n > 9999 || strconv.Itoa(n) != t.Value {
			return monitors.Finding{}, false
		}
		return monitors.Finding{Source: gpuhealthv1alpha1.SourceDRADriver, Check: gpuhealthv1alpha1.CheckXID, Component: gpu, Code: t.Value,
			Message: fmt.Sprintf("the DRA driver tainted %s %s=%s:%s", device, t.Key, t.Value, t.Effect)}, true
	case GPULostTaint:
		return monitors.Finding{Source: gpuhealthv1alpha1.SourceDRADriver, Check: gpuhealthv1alpha1.CheckGPULost, Component: gpu, Code: "GPULost",
			Message: fmt.Sprintf("the DRA driver tainted %s %s:%s", device, t.Key, t.Effect)}, true
	}
	return monitors.Finding{}, false
}

// componentID is the NodeHealthEvent schema's component id.
var componentID = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$`)

// validComponentID says whether a uuid is one a finding's component id
// may be.
func validComponentID(s string) bool { return componentID.MatchString(s) }
