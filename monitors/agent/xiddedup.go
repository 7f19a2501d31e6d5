package agent

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/utils/clock"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/api/xid"
	"github.com/gpuhealth/gpuhealth/monitors"
	"github.com/gpuhealth/gpuhealth/monitors/metrics"
)

// When both the nvml and the kmsg source run, one XID reaches the agent
// twice: through NVML's event set and as the driver's kernel log line.
// Published as they come, that is two NodeHealthEvents for one fault. The
// first copy to arrive is published; the other source's copy of the same
// XID (same GPU and code) arriving within xidMatchWindow of it is dropped.
// Nothing waits: each published copy goes to the pipeline (and its spool)
// at once, so a crash loses nothing and the kernel log still covers an XID
// NVML missed. Copies are matched by when they arrive here, not by the
// times they carry: the kernel's log clock drifts from the wall clock over
// days of uptime.
const (
	// xidMatchWindow is how far apart the two copies may arrive.
	xidMatchWindow = 2 * time.Second
	// maxUnmatchedXIDs bounds the copies remembered per GPU and code.
	maxUnmatchedXIDs = 1024
)

var xidDuplicates = prometheus.NewCounter(prometheus.CounterOpts{
	Name: "gpuhealth_monitor_xid_duplicates_total",
	Help: "XIDs not published because the other source (nvml or kmsg) had reported the same XID moments before.",
})

func init() {
	metrics.Registry.MustRegister(xidDuplicates)
}

type xidKey struct{ gpu, code string }

// arrival is a published copy waiting for its twin.
type arrival struct {
	at     time.Time
	source string
}

// xidDedup pairs the nvml and kmsg copies of XIDs.
type xidDedup struct {
	clock clock.PassiveClock

	mu   sync.Mutex
	seen map[xidKey][]arrival // published copies not matched yet, oldest first

	// kernelLog is true while the kmsg source reads the kernel log: only
	// then does NVML's copy of a line-judged XID defer to it.
	kernelLog atomic.Bool
}

// setKernelLog is the kmsg source's Reading callback.
func (d *xidDedup) setKernelLog(reading bool) { d.kernelLog.Store(reading) }

func newXIDDedup(clk clock.PassiveClock) *xidDedup {
	if clk == nil {
		clk = clock.RealClock{}
	}
	return &xidDedup{clock: clk, seen: map[xidKey][]arrival{}}
}

// isXID says whether f is an XID occurrence on a GPU named by its UUID
// that both sources describe alike. An XID whose meaning is in the
// driver's message (144–150: the NVLink5 registers; 154: the recovery
// action) keeps both copies: only the kernel log's can say it, and NVML's
// copy is marked Info (deferToKernelLog).
func isXID(f monitors.Finding) bool {
	if f.Check != gpuhealthv1alpha1.CheckXID || f.Resolved ||
		f.Component.Kind != gpuhealthv1alpha1.ComponentGPU || !strings.HasPrefix(f.Component.ID, "GPU-") {
		return false
	}
	code, err := strconv.Atoi(f.Code)
	return err == nil && !xid.ReadsMessage(code)
}

// duplicate says whether f, arriving now from source, is the twin of a
// copy the other source published; if not, it remembers f's arrival.
func (d *xidDedup) duplicate(source string, f monitors.Finding) bool {
	now := d.clock.Now()
	k := xidKey{gpu: f.Component.ID, code: f.Code}
	d.mu.Lock()
	defer d.mu.Unlock()
	list := d.seen[k]
	// Forget arrivals too old to have a twin still coming.
	for len(list) > 0 && (now.Sub(list[0].at) > xidMatchWindow || len(list) >= maxUnmatchedXIDs) {
		list = list[1:]
	}
	for i, a := range list {
		if a.source != source {
			d.seen[k] = append(list[:i:i], list[i+1:]...)
			return true
		}
	}
	d.seen[k] = append(list, arrival{at: now, source: source})
	return false
}

// xidTap runs a source (nvml or kmsg) through the dedup.
type xidTap struct {
	monitors.Source
	d *xidDedup
}

func (s xidTap) Run(ctx context.Context, report monitors.Reporter) error {
	name := s.Name()
	return s.Source.Run(ctx, func(f monitors.Finding) {
		if isXID(f) && s.d.duplicate(name, f) {
			xidDuplicates.Inc()
			return
		}
		if name == string(gpuhealthv1alpha1.SourceNVML) && s.d.kernelLog.Load() {
			deferToKernelLog(&f)
		}
		report(f)
	})
}

// deferToKernelLog marks NVML's copy of an XID judged from the driver's line
// (the NVLink5 registers of 144–150, XID 154's recovery action) as Info:
// NVML's event carries only the number, and while the kmsg source reads the
// kernel log its copy, which carries the line, decides. When the kernel log
// cannot be read (the kmsg source is not configured, or unavailable without
// privileges) NVML's copy is judged on its own (api/xid says what an XID
// without its line means).
func deferToKernelLog(f *monitors.Finding) {
	if f.Check != gpuhealthv1alpha1.CheckXID || f.Resolved || f.Severity != "" {
		return
	}
	code, err := strconv.Atoi(f.Code)
	if err != nil || !xid.ReadsMessage(code) {
		return
	}
	f.Severity, f.Action = gpuhealthv1alpha1.SeverityInfo, gpuhealthv1alpha1.ActionNone
	f.Message = strings.TrimSpace(f.Message + " (NVML's copy: the kernel log's copy of this XID carries the driver's line and decides)")
}
