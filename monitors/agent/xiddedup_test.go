package agent

import (
	"context"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus/testutil"
	clocktesting "k8s.io/utils/clock/testing"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/monitors"
)

const gpuA = "GPU-aaaaaaaa-0000-4000-8000-000000000000"

var t0 = time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC)

func occurrence(src gpuhealthv1alpha1.Source, gpu, code string, at time.Time) monitors.Finding {
	return monitors.Finding{
		Source: src, Check: gpuhealthv1alpha1.CheckXID, Code: code, Time: at,
		Component: gpuhealthv1alpha1.Component{Kind: gpuhealthv1alpha1.ComponentGPU, ID: gpu},
	}
}

// sink collects what the dedup hands on.
type sink struct {
	mu  sync.Mutex
	got []monitors.Finding
}

func (s *sink) report(f monitors.Finding) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.got = append(s.got, f)
}

func (s *sink) sources() []gpuhealthv1alpha1.Source {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []gpuhealthv1alpha1.Source
	for _, f := range s.got {
		out = append(out, f.Source)
	}
	return out
}

func newTestDedup() (*xidDedup, *clocktesting.FakeClock, *sink) {
	clk := clocktesting.NewFakeClock(t0)
	d := newXIDDedup(clk)
	d.nvmlRunning.Store(true)
	d.kmsgRunning.Store(true)
	return d, clk, &sink{}
}

func TestXIDDedup(t *testing.T) {
	const nv, km = gpuhealthv1alpha1.SourceNVML, gpuhealthv1alpha1.SourceKmsg

	t.Run("NVML first: the kernel log copy is dropped", func(t *testing.T) {
		g := NewWithT(t)
		d, _, s := newTestDedup()
		before := testutil.ToFloat64(xidDuplicates)
		d.fromNVML(s.report)(occurrence(nv, gpuA, "79", t0))
		d.fromKmsg(s.report)(occurrence(km, gpuA, "79", t0.Add(-10*time.Millisecond)))
		g.Expect(s.sources()).To(Equal([]gpuhealthv1alpha1.Source{nv}))
		g.Expect(testutil.ToFloat64(xidDuplicates) - before).To(BeEquivalentTo(1))
	})

	t.Run("kernel log first: it waits, and NVML's copy drops it", func(t *testing.T) {
		g := NewWithT(t)
		d, clk, s := newTestDedup()
		d.fromKmsg(s.report)(occurrence(km, gpuA, "79", t0))
		g.Expect(s.sources()).To(BeEmpty(), "held")
		clk.Step(300 * time.Millisecond)
		d.fromNVML(s.report)(occurrence(nv, gpuA, "79", clk.Now()))
		clk.Step(xidMatchWindow)
		d.release(s.report, false)
		g.Expect(s.sources()).To(Equal([]gpuhealthv1alpha1.Source{nv}))
	})

	t.Run("an XID only the kernel log saw is reported after the window", func(t *testing.T) {
		g := NewWithT(t)
		d, clk, s := newTestDedup()
		d.fromKmsg(s.report)(occurrence(km, gpuA, "79", t0))
		clk.Step(xidMatchWindow - time.Millisecond)
		d.release(s.report, false)
		g.Expect(s.sources()).To(BeEmpty(), "still waiting")
		clk.Step(time.Millisecond)
		d.release(s.report, false)
		g.Expect(s.sources()).To(Equal([]gpuhealthv1alpha1.Source{km}))
	})

	t.Run("each NVML copy drops one kernel log copy", func(t *testing.T) {
		g := NewWithT(t)
		d, clk, s := newTestDedup()
		d.fromNVML(s.report)(occurrence(nv, gpuA, "13", t0))
		d.fromKmsg(s.report)(occurrence(km, gpuA, "13", t0))
		d.fromKmsg(s.report)(occurrence(km, gpuA, "13", t0.Add(time.Millisecond)))
		clk.Step(xidMatchWindow)
		d.release(s.report, false)
		g.Expect(s.sources()).To(Equal([]gpuhealthv1alpha1.Source{nv, km}))
	})

	t.Run("another code, another GPU or times too far apart do not match", func(t *testing.T) {
		g := NewWithT(t)
		d, clk, s := newTestDedup()
		d.fromNVML(s.report)(occurrence(nv, gpuA, "79", t0))
		d.fromKmsg(s.report)(occurrence(km, gpuA, "48", t0))
		d.fromKmsg(s.report)(occurrence(km, "GPU-bbbbbbbb-1111-4000-8000-111111111111", "79", t0))
		d.fromKmsg(s.report)(occurrence(km, gpuA, "79", t0.Add(-xidMatchWindow-time.Millisecond)))
		clk.Step(xidMatchWindow)
		d.release(s.report, false)
		g.Expect(s.sources()).To(Equal([]gpuhealthv1alpha1.Source{nv, km, km, km}))
	})

	t.Run("reported at once: a GPU known only by its bus id, XID 154, NVML not running, not an XID", func(t *testing.T) {
		g := NewWithT(t)
		d, _, s := newTestDedup()
		d.fromKmsg(s.report)(occurrence(km, "0000:3b:00.0", "79", t0))
		d.fromNVML(s.report)(occurrence(nv, gpuA, "154", t0))
		d.fromKmsg(s.report)(occurrence(km, gpuA, "154", t0)) // its message says which recovery
		sxid := occurrence(km, "0000:05:00.0", "20034", t0)
		sxid.Check, sxid.Component.Kind = gpuhealthv1alpha1.CheckSXID, gpuhealthv1alpha1.ComponentNVSwitch
		d.fromKmsg(s.report)(sxid)
		d.nvmlRunning.Store(false)
		d.fromKmsg(s.report)(occurrence(km, gpuA, "79", t0))
		g.Expect(s.got).To(HaveLen(5))
	})

	t.Run("NVML XIDs are not kept while the kmsg source does not run", func(t *testing.T) {
		g := NewWithT(t)
		d, _, s := newTestDedup()
		d.kmsgRunning.Store(false)
		for i := range 10 {
			d.fromNVML(s.report)(occurrence(nv, gpuA, "79", t0.Add(time.Duration(i)*time.Millisecond)))
		}
		g.Expect(s.got).To(HaveLen(10))
		g.Expect(d.nvml).To(BeEmpty())
	})

	t.Run("a storm keeps the memory bounded", func(t *testing.T) {
		g := NewWithT(t)
		d, _, s := newTestDedup()
		for i := range 3 * maxUnmatchedXIDs {
			d.fromNVML(s.report)(occurrence(nv, gpuA, "79", t0.Add(time.Duration(i)*time.Microsecond)))
		}
		g.Expect(d.nvml[xidKey{gpuA, "79"}]).To(HaveLen(maxUnmatchedXIDs))
		for i := range maxHeldXIDs + 10 {
			d.fromKmsg(s.report)(occurrence(km, gpuA, "48", t0.Add(time.Duration(i)*time.Microsecond)))
		}
		g.Expect(d.held).To(HaveLen(maxHeldXIDs))
		g.Expect(s.got).To(HaveLen(3*maxUnmatchedXIDs+10), "beyond the bound, reported at once")
	})
}

// kmsgFake reports one XID and runs until cancelled.
type kmsgFake struct{ f monitors.Finding }

func (kmsgFake) Name() string { return "kmsg" }

func (k kmsgFake) Run(ctx context.Context, report monitors.Reporter) error {
	report(k.f)
	<-ctx.Done()
	return nil
}

// TestKmsgTapReleasesAndFlushes: the tap's own loop reports a held XID when
// its wait ends, and one still held when the source stops is handed on.
func TestKmsgTapReleasesAndFlushes(t *testing.T) {
	g := NewWithT(t)
	d, clk, s := newTestDedup()
	d.nvmlRunning.Store(true)
	tap := kmsgTap{Source: kmsgFake{f: occurrence(gpuhealthv1alpha1.SourceKmsg, gpuA, "79", t0)}, d: d}

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- tap.Run(ctx, s.report) }()
	g.Eventually(func() int { d.mu.Lock(); defer d.mu.Unlock(); return len(d.held) }).Should(Equal(1))
	g.Eventually(clk.HasWaiters).Should(BeTrue())
	clk.Step(xidMatchWindow)
	g.Eventually(s.sources).Should(HaveLen(1), "released by the tap's ticker")

	tap2 := kmsgTap{Source: kmsgFake{f: occurrence(gpuhealthv1alpha1.SourceKmsg, gpuA, "48", clk.Now())}, d: d}
	cancel()
	g.Expect(<-done).To(Succeed())
	ctx2, cancel2 := context.WithCancel(context.Background())
	go func() { done <- tap2.Run(ctx2, s.report) }()
	g.Eventually(func() int { d.mu.Lock(); defer d.mu.Unlock(); return len(d.held) }).Should(Equal(1))
	cancel2()
	g.Expect(<-done).To(Succeed())
	g.Expect(s.sources()).To(HaveLen(2), "flushed when the source stops")
	g.Expect(d.kmsgRunning.Load()).To(BeFalse())
}
