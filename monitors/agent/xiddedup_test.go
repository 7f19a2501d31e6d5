package agent

import (
	"context"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus/testutil"
	clocktesting "k8s.io/utils/clock/testing"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/monitors"
)

const (
	gpuA = "GPU-aaaaaaaa-0000-4000-8000-000000000000"
	gpuB = "GPU-bbbbbbbb-1111-4000-8000-111111111111"
)

var t0 = time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC)

func occurrence(src gpuhealthv1alpha1.Source, gpu, code string) monitors.Finding {
	return monitors.Finding{
		Source: src, Check: gpuhealthv1alpha1.CheckXID, Code: code,
		Component: gpuhealthv1alpha1.Component{Kind: gpuhealthv1alpha1.ComponentGPU, ID: gpu},
	}
}

// pushSource reports what the test sends it, acknowledging each once
// reported, until cancelled.
type pushSource struct {
	name string
	in   chan monitors.Finding
	ack  chan struct{}
}

func (p pushSource) Name() string { return p.name }

func (p pushSource) Run(ctx context.Context, report monitors.Reporter) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case f := <-p.in:
			report(f)
			p.ack <- struct{}{}
		}
	}
}

// tapped runs an nvml and a kmsg source through one dedup, each as the
// agent would, and returns a send function and what was published.
func tapped(t *testing.T) (*clocktesting.FakeClock, func(monitors.Finding), func() []gpuhealthv1alpha1.Source) {
	t.Helper()
	clk := clocktesting.NewFakeClock(t0)
	d := newXIDDedup(clk)
	published := make(chan monitors.Finding, 100)
	srcs := map[gpuhealthv1alpha1.Source]pushSource{
		gpuhealthv1alpha1.SourceNVML: {name: "nvml", in: make(chan monitors.Finding), ack: make(chan struct{})},
		gpuhealthv1alpha1.SourceKmsg: {name: "kmsg", in: make(chan monitors.Finding), ack: make(chan struct{})},
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	for _, s := range srcs {
		go func() { _ = xidTap{Source: s, d: d}.Run(ctx, func(f monitors.Finding) { published <- f }) }()
	}
	var got []gpuhealthv1alpha1.Source
	send := func(f monitors.Finding) { srcs[f.Source].in <- f; <-srcs[f.Source].ack }
	result := func() []gpuhealthv1alpha1.Source {
		for {
			select {
			case f := <-published:
				got = append(got, f.Source)
			case <-time.After(50 * time.Millisecond):
				return got
			}
		}
	}
	return clk, send, result
}

func TestXIDDedup(t *testing.T) {
	const nv, km = gpuhealthv1alpha1.SourceNVML, gpuhealthv1alpha1.SourceKmsg

	t.Run("the first copy is published, the other source's is dropped", func(t *testing.T) {
		g := NewWithT(t)
		clk, send, published := tapped(t)
		before := testutil.ToFloat64(xidDuplicates)
		send(occurrence(nv, gpuA, "79"))
		clk.Step(10 * time.Millisecond)
		send(occurrence(km, gpuA, "79"))
		clk.Step(time.Minute)
		send(occurrence(km, gpuA, "31")) // the kernel log first this time
		clk.Step(300 * time.Millisecond)
		send(occurrence(nv, gpuA, "31"))
		g.Expect(published()).To(Equal([]gpuhealthv1alpha1.Source{nv, km}))
		g.Expect(testutil.ToFloat64(xidDuplicates) - before).To(BeEquivalentTo(2))
	})

	t.Run("a copy only one source saw is published", func(t *testing.T) {
		g := NewWithT(t)
		clk, send, published := tapped(t)
		send(occurrence(km, gpuA, "79"))
		clk.Step(xidMatchWindow + time.Millisecond)
		send(occurrence(nv, gpuA, "79")) // too late to be the same XID
		g.Expect(published()).To(Equal([]gpuhealthv1alpha1.Source{km, nv}))
	})

	t.Run("each copy drops at most one twin; repeats of one source all count", func(t *testing.T) {
		g := NewWithT(t)
		_, send, published := tapped(t)
		send(occurrence(nv, gpuA, "13"))
		send(occurrence(nv, gpuA, "13"))
		send(occurrence(km, gpuA, "13"))
		send(occurrence(km, gpuA, "13"))
		send(occurrence(km, gpuA, "13"))
		g.Expect(published()).To(Equal([]gpuhealthv1alpha1.Source{nv, nv, km}), "three XIDs: NVML saw two, the kernel log three")
	})

	t.Run("another code or another GPU is another XID", func(t *testing.T) {
		g := NewWithT(t)
		_, send, published := tapped(t)
		send(occurrence(nv, gpuA, "79"))
		send(occurrence(km, gpuA, "48"))
		send(occurrence(km, gpuB, "79"))
		g.Expect(published()).To(Equal([]gpuhealthv1alpha1.Source{nv, km, km}))
	})

	t.Run("not paired: a GPU known only by its bus id, XID 154, resolutions, other checks", func(t *testing.T) {
		g := NewWithT(t)
		_, send, published := tapped(t)
		send(occurrence(nv, "0000:3b:00.0", "79"))
		send(occurrence(km, "0000:3b:00.0", "79"))
		send(occurrence(nv, gpuA, "154"))
		send(occurrence(km, gpuA, "154")) // its message says which recovery
		sxid := occurrence(km, "0000:05:00.0", "20034")
		sxid.Check, sxid.Component.Kind = gpuhealthv1alpha1.CheckSXID, gpuhealthv1alpha1.ComponentNVSwitch
		send(sxid)
		send(sxid)
		g.Expect(published()).To(HaveLen(6))
	})

	t.Run("a storm from one source keeps the memory bounded", func(t *testing.T) {
		g := NewWithT(t)
		d := newXIDDedup(clocktesting.NewFakeClock(t0))
		for range 3 * maxUnmatchedXIDs {
			g.Expect(d.duplicate("nvml", occurrence(nv, gpuA, "79"))).To(BeFalse())
		}
		g.Expect(d.seen[xidKey{gpuA, "79"}]).To(HaveLen(maxUnmatchedXIDs))
	})
}

func TestNVMLCopyOfALineJudgedXIDDefersToTheKernelLog(t *testing.T) {
	gpu := gpuhealthv1alpha1.Component{Kind: gpuhealthv1alpha1.ComponentGPU, ID: "GPU-1"}
	for _, code := range []string{"145", "149", "154"} {
		f := monitors.Finding{Source: gpuhealthv1alpha1.SourceNVML, Check: gpuhealthv1alpha1.CheckXID, Component: gpu, Code: code}
		deferToKernelLog(&f)
		if f.Severity != gpuhealthv1alpha1.SeverityInfo || f.Action != gpuhealthv1alpha1.ActionNone || f.Message == "" {
			t.Errorf("NVML's XID %s = %s/%s %q; want Info/None with a reason", code, f.Severity, f.Action, f.Message)
		}
	}
	for _, code := range []string{"79", "48", "45"} {
		f := monitors.Finding{Source: gpuhealthv1alpha1.SourceNVML, Check: gpuhealthv1alpha1.CheckXID, Component: gpu, Code: code}
		deferToKernelLog(&f)
		if f.Severity != "" || f.Action != "" {
			t.Errorf("NVML's XID %s = %s/%s; want it left to the catalog", code, f.Severity, f.Action)
		}
	}
}

// TestNVMLCopyDefersOnlyWhileTheKernelLogIsRead: with the kmsg source
// unable to read the kernel log (no privileges), NVML's copy of a
// line-judged XID is judged on its own, not silenced.
func TestNVMLCopyDefersOnlyWhileTheKernelLogIsRead(t *testing.T) {
	d := newXIDDedup(clocktesting.NewFakeClock(t0))
	src := pushSource{name: "nvml", in: make(chan monitors.Finding), ack: make(chan struct{})}
	published := make(chan monitors.Finding, 4)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go func() { _ = xidTap{Source: src, d: d}.Run(ctx, func(f monitors.Finding) { published <- f }) }()
	send := func() monitors.Finding {
		src.in <- occurrence(gpuhealthv1alpha1.SourceNVML, gpuA, "145")
		<-src.ack
		return <-published
	}
	if f := send(); f.Severity != "" {
		t.Errorf("without the kernel log NVML's XID 145 = %s; want it left to the catalog", f.Severity)
	}
	d.setKernelLog(true)
	if f := send(); f.Severity != gpuhealthv1alpha1.SeverityInfo {
		t.Errorf("while the kernel log is read NVML's XID 145 = %q; want Info", f.Severity)
	}
	d.setKernelLog(false)
	if f := send(); f.Severity != "" {
		t.Errorf("after the kernel log stopped NVML's XID 145 = %s; want it left to the catalog", f.Severity)
	}
}
