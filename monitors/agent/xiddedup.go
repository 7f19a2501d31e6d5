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
// NVML copy is the finding; the kernel log's copy of an XID on a GPU NVML
// watches waits up to xidMatchWindow for NVML's (either may come first) and
// is dropped when it arrives. A kernel log XID NVML did not deliver (NVML
// hung, or the XID predates the event set) is reported after that wait.
const (
	// xidMatchWindow is how far apart the two copies' times may be, and how
	// long a kernel log copy waits for NVML's.
	xidMatchWindow = 2 * time.Second
	// maxHeldXIDs bounds the kernel log copies waiting; beyond it they are
	// reported at once (a duplicate object is better than a lost finding).
	maxHeldXIDs = 4096
	// maxUnmatchedXIDs bounds the NVML copies kept per GPU and code.
	maxUnmatchedXIDs = 1024
)

var xidDuplicates = prometheus.NewCounter(prometheus.CounterOpts{
	Name: "gpuhealth_monitor_xid_duplicates_total",
	Help: "Kernel log XIDs not published because the nvml source reported the same XID.",
})

func init() {
	metrics.Registry.MustRegister(xidDuplicates)
}

type xidKey struct{ gpu, code string }

type heldXID struct {
	f     monitors.Finding
	until time.Time
}

// xidDedup pairs the nvml and kmsg copies of XIDs.
type xidDedup struct {
	clock       clock.WithTicker
	nvmlRunning atomic.Bool
	kmsgRunning atomic.Bool

	mu   sync.Mutex
	nvml map[xidKey][]time.Time // NVML XIDs no kernel log copy matched yet, oldest first
	held []heldXID              // kernel log XIDs waiting for NVML's copy, oldest first
}

func newXIDDedup(clk clock.WithTicker) *xidDedup {
	if clk == nil {
		clk = clock.RealClock{}
	}
	return &xidDedup{clock: clk, nvml: map[xidKey][]time.Time{}}
}

// isXID says whether f is an XID occurrence on a GPU named by its UUID
// that both sources describe alike. An XID whose meaning is in the
// driver's message (154: the recovery action) keeps its kernel log copy,
// the only one that can say it.
func isXID(f monitors.Finding) bool {
	if f.Check != gpuhealthv1alpha1.CheckXID || f.Resolved ||
		f.Component.Kind != gpuhealthv1alpha1.ComponentGPU || !strings.HasPrefix(f.Component.ID, "GPU-") {
		return false
	}
	code, err := strconv.Atoi(f.Code)
	return err == nil && !xid.ReadsMessage(code)
}

func keyOf(f monitors.Finding) xidKey { return xidKey{gpu: f.Component.ID, code: f.Code} }

// fromNVML records the nvml source's XIDs (while the kmsg source runs, so
// that there is something to match) and reports every finding.
func (d *xidDedup) fromNVML(report monitors.Reporter) monitors.Reporter {
	return func(f monitors.Finding) {
		if isXID(f) && d.kmsgRunning.Load() {
			d.mu.Lock()
			k := keyOf(f)
			times := d.nvml[k]
			// Too old to match any kernel log copy still to come.
			for len(times) > 0 && (f.Time.Sub(times[0]) > time.Minute || len(times) >= maxUnmatchedXIDs) {
				times = times[1:]
			}
			d.nvml[k] = append(times, f.Time)
			d.mu.Unlock()
		}
		report(f)
	}
}

// fromKmsg holds the kmsg source's XIDs on GPUs NVML watches until NVML's
// copy comes or the window passes, and reports everything else at once.
func (d *xidDedup) fromKmsg(report monitors.Reporter) monitors.Reporter {
	return func(f monitors.Finding) {
		if !isXID(f) || !d.nvmlRunning.Load() {
			report(f)
			return
		}
		d.mu.Lock()
		if d.matchLocked(f) {
			d.mu.Unlock()
			xidDuplicates.Inc()
			return
		}
		if len(d.held) >= maxHeldXIDs {
			d.mu.Unlock()
			report(f)
			return
		}
		d.held = append(d.held, heldXID{f: f, until: d.clock.Now().Add(xidMatchWindow)})
		d.mu.Unlock()
	}
}

// matchLocked consumes the NVML copy of f, if there is one.
func (d *xidDedup) matchLocked(f monitors.Finding) bool {
	k := keyOf(f)
	times := d.nvml[k]
	for i, t := range times {
		if diff := t.Sub(f.Time); diff <= xidMatchWindow && diff >= -xidMatchWindow {
			times = append(times[:i:i], times[i+1:]...)
			if len(times) == 0 {
				delete(d.nvml, k)
			} else {
				d.nvml[k] = times
			}
			return true
		}
	}
	return false
}

// release drops held XIDs NVML's copy has matched since and reports those
// whose wait is over, or all of them with flush.
func (d *xidDedup) release(report monitors.Reporter, flush bool) {
	now := d.clock.Now()
	var out []monitors.Finding
	d.mu.Lock()
	keep := d.held[:0]
	for _, h := range d.held {
		switch {
		case d.matchLocked(h.f):
			xidDuplicates.Inc()
		case flush || !now.Before(h.until):
			out = append(out, h.f)
		default:
			keep = append(keep, h)
		}
	}
	clear(d.held[len(keep):])
	d.held = keep
	d.mu.Unlock()
	for _, f := range out {
		report(f)
	}
}

// nvmlTap runs the nvml source through the dedup.
type nvmlTap struct {
	monitors.Source
	d *xidDedup
}

func (s nvmlTap) Run(ctx context.Context, report monitors.Reporter) error {
	s.d.nvmlRunning.Store(true)
	defer s.d.nvmlRunning.Store(false)
	return s.Source.Run(ctx, s.d.fromNVML(report))
}

// kmsgTap runs the kmsg source through the dedup, releasing held XIDs as
// their wait ends and all of them when the source stops: the kernel log
// cursor already covers them, so they are handed on, not dropped.
type kmsgTap struct {
	monitors.Source
	d *xidDedup
}

func (s kmsgTap) Run(ctx context.Context, report monitors.Reporter) error {
	s.d.kmsgRunning.Store(true)
	defer s.d.kmsgRunning.Store(false)
	loopCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := s.d.clock.NewTicker(xidMatchWindow / 4)
		defer t.Stop()
		for {
			select {
			case <-loopCtx.Done():
				return
			case <-t.C():
				s.d.release(report, false)
			}
		}
	}()
	err := s.Source.Run(ctx, s.d.fromKmsg(report))
	cancel()
	<-done
	s.d.release(report, true)
	return err
}
