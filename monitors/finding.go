package monitors

import (
	"context"
	"errors"
	"fmt"
	"time"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
)

// Finding is one observation a source made about this node: a fault that
// happened (an XID), a condition that holds (an NVLink error rate over its
// threshold, a fabric that is not up), or the end of such a condition
// (Resolved). The pipeline turns findings into NodeHealthEvents; the node
// name is the agent's, never the source's.
type Finding struct {
	// Source is the source that observed it.
	Source gpuhealthv1alpha1.Source
	// Check names what was checked, for example XID or NVLinkErrors.
	Check gpuhealthv1alpha1.Check
	// Component is the part of the node the finding is about. For a GPU the
	// ID is the GPU's UUID (the PCI bus id when the UUID is not known); for
	// an NVLink it is "<GPU UUID>/link-<n>".
	Component gpuhealthv1alpha1.Component
	// Code identifies the finding within its check: the XID number, the
	// counter name, the fabric state.
	Code string
	// Severity is how bad it is. Empty means "let the pipeline classify it"
	// (XIDs are classified from the catalog in api/xid).
	Severity gpuhealthv1alpha1.Severity
	// Action is the recommended action. Empty means "let the pipeline
	// classify it".
	Action gpuhealthv1alpha1.Action
	// Message is a human-readable description, for example the kernel log
	// line or "CRC flit errors 1200/s over 30s, threshold 100/s".
	Message string
	// Time is when the source observed it. Zero means "now" to the pipeline.
	Time time.Time
	// Resolved is true when the source saw the condition clear (rate back
	// under its threshold, fabric back to COMPLETED, IMEX READY again). A
	// resolved finding never creates a NodeHealthEvent; it only marks an
	// existing one resolved.
	Resolved bool
	// Count is how many occurrences this finding stands for; 0 means 1.
	Count int64
}

// Key identifies the NodeHealthEvent a finding coalesces into: one object per
// node, source, check, component and code.
type Key struct {
	Source      gpuhealthv1alpha1.Source
	Check       gpuhealthv1alpha1.Check
	ComponentID string
	Code        string
}

// Key returns the finding's coalescing key.
func (f *Finding) Key() Key {
	return Key{Source: f.Source, Check: f.Check, ComponentID: f.Component.ID, Code: f.Code}
}

// Occurrences returns Count, treating 0 as 1.
func (f *Finding) Occurrences() int64 {
	if f.Count <= 0 {
		return 1
	}
	return f.Count
}

// String is for logs: source/check/component/code, and whether it resolved.
func (f *Finding) String() string {
	s := fmt.Sprintf("%s/%s/%s/%s", f.Source, f.Check, f.Component.ID, f.Code)
	if f.Resolved {
		s += " (resolved)"
	}
	return s
}

// Reporter hands a finding to the pipeline. It does not block for long: the
// pipeline queues findings in memory and on disk.
type Reporter func(Finding)

// Source is one producer of findings: NVML, DCGM, the kernel log, IMEX.
type Source interface {
	// Name is the source's name as configured (nvml, dcgm, kmsg, imex).
	Name() string
	// Run observes until ctx is done, reporting findings as they happen, and
	// returns nil then. It returns an error wrapping ErrUnavailable when the
	// source cannot start on this node (no NVML library, no /dev/kmsg): the
	// agent logs it once and runs without that source. Any other error
	// means the source died; the agent's health check then fails so that
	// the kubelet restarts it.
	Run(ctx context.Context, report Reporter) error
}

// ErrUnavailable marks a source that cannot run on this node because
// something it needs is missing (a library, a device file, a binary).
var ErrUnavailable = errors.New("source unavailable on this node")

// Unavailable returns an error that wraps ErrUnavailable with the reason.
func Unavailable(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrUnavailable, fmt.Sprintf(format, args...))
}
