package pipeline

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	prom "github.com/prometheus/client_golang/prometheus/testutil"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/monitors"
	"github.com/gpuhealth/gpuhealth/monitors/spool"
)

// harness runs one pipeline for a test.
type harness struct {
	t      *testing.T
	node   string
	dir    string
	p      *Pipeline
	writes *atomic.Int64
	cancel context.CancelFunc
	done   chan struct{}
}

type harnessOption func(*Options)

func withWindow(d time.Duration) harnessOption { return func(o *Options) { o.Window = d } }
func withDebounce(r ...DebounceRule) harnessOption {
	return func(o *Options) { o.Debounce = r }
}

// start opens the spool in dir (replaying what it holds) and runs a pipeline
// for node with cfg (nil: the envtest apiserver).
func start(t *testing.T, node, dir string, cfg *rest.Config, opts ...harnessOption) *harness {
	t.Helper()
	if cfg == nil {
		cfg = restConfig
	}
	c, writes := countingClient(t, cfg)
	sp, replay, problems, err := spool.Open(dir, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(problems) > 0 {
		t.Fatal(problems)
	}
	o := Options{NodeName: node, Client: c, Spool: sp, Replay: replay, Window: 50 * time.Millisecond}
	for _, f := range opts {
		f(&o)
	}
	p, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	h := &harness{t: t, node: node, dir: dir, p: p, writes: writes, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(h.done)
		_ = p.Run(ctx)
	}()
	t.Cleanup(h.stop)
	return h
}

func (h *harness) stop() {
	h.cancel()
	<-h.done
}

func xidFinding(gpu, code string) monitors.Finding {
	return monitors.Finding{
		Source:    gpuhealthv1alpha1.SourceNVML,
		Check:     gpuhealthv1alpha1.CheckXID,
		Component: gpuhealthv1alpha1.Component{Kind: gpuhealthv1alpha1.ComponentGPU, ID: gpu},
		Code:      code,
	}
}

func linkFinding(gpu string, resolved bool) monitors.Finding {
	return monitors.Finding{
		Source:    gpuhealthv1alpha1.SourceNVML,
		Check:     gpuhealthv1alpha1.CheckNVLinkErrors,
		Component: gpuhealthv1alpha1.Component{Kind: gpuhealthv1alpha1.ComponentNVLink, ID: gpu + "/link-3"},
		Code:      "CRC_FLIT",
		Message:   "CRC flit errors over threshold",
		Resolved:  resolved,
	}
}

func (h *harness) name(f monitors.Finding) string {
	return gpuhealthv1alpha1.EventName(h.node, f.Source, f.Check, f.Component.ID, f.Code)
}

// event returns a function for Eventually that reads the event of f.
func (h *harness) event(f monitors.Finding) func(Gomega) *gpuhealthv1alpha1.NodeHealthEvent {
	return func(g Gomega) *gpuhealthv1alpha1.NodeHealthEvent {
		var e gpuhealthv1alpha1.NodeHealthEvent
		g.Expect(admin.Get(context.Background(), client.ObjectKey{Name: h.name(f)}, &e)).To(Succeed())
		return &e
	}
}

func count(n int64) OmegaMatcher {
	return WithTransform(func(e *gpuhealthv1alpha1.NodeHealthEvent) int64 { return e.Status.Count }, Equal(n))
}

func TestNewFindingBecomesAnEvent(t *testing.T) {
	g := NewWithT(t)
	h := start(t, "node-new", t.TempDir(), nil)
	f := xidFinding("GPU-0a1b", "79")
	f.Message = "GPU has fallen off the bus"
	h.p.Report(f)

	g.Eventually(h.event(f)).Should(count(1))
	e := h.event(f)(g)
	g.Expect(e.Spec).To(Equal(gpuhealthv1alpha1.NodeHealthEventSpec{
		NodeName: "node-new", Source: gpuhealthv1alpha1.SourceNVML, Check: gpuhealthv1alpha1.CheckXID,
		Component: gpuhealthv1alpha1.Component{Kind: gpuhealthv1alpha1.ComponentGPU, ID: "GPU-0a1b"},
		Code:      "79", Severity: gpuhealthv1alpha1.SeverityFatal, RecommendedAction: gpuhealthv1alpha1.ActionRebootNode,
		Message: "GPU has fallen off the bus",
	}))
	g.Expect(e.Status.FirstSeen).NotTo(BeNil())
	g.Expect(e.Status.LastSeen).NotTo(BeNil())
	g.Expect(e.Status.Resolved).To(BeFalse())
	g.Eventually(h.p.Pending).Should(BeZero())
	g.Expect(h.writes.Load()).To(Equal(int64(2)), "one create and one status patch")
	g.Expect(spoolFiles(t, h.dir)).To(BeZero(), "acknowledged findings leave the spool")
}

func TestStormOfIdenticalXIDsIsOneObjectWithBoundedWrites(t *testing.T) {
	g := NewWithT(t)
	const window = 500 * time.Millisecond
	h := start(t, "node-storm", t.TempDir(), nil, withWindow(window))
	f := xidFinding("GPU-storm", "13")
	began := time.Now()
	for i := range 10000 {
		h.p.Report(f)
		if i%1000 == 999 {
			time.Sleep(100 * time.Millisecond) // 10,000 XIDs over about a second
		}
	}
	elapsed := time.Since(began)
	g.Eventually(h.event(f), 10*time.Second).Should(count(10000))
	g.Eventually(h.p.Pending).Should(BeZero())
	var list gpuhealthv1alpha1.NodeHealthEventList
	g.Expect(admin.List(context.Background(), &list, client.MatchingFields{"spec.nodeName": "node-storm"})).To(Succeed())
	g.Expect(list.Items).To(HaveLen(1))
	// A create, a first status patch at once, then at most one patch per
	// window while the storm lasts, and one after it.
	bound := int64(2 + elapsed/window + 2)
	g.Expect(h.writes.Load()).To(BeNumerically("<=", bound), "writes for %s of storm with a %s window", elapsed, window)
	t.Logf("10,000 XIDs in %s: %d writes (bound %d)", elapsed.Round(time.Millisecond), h.writes.Load(), bound)
}

func TestResolutionAndReturn(t *testing.T) {
	g := NewWithT(t)
	h := start(t, "node-resolve", t.TempDir(), nil)
	h.p.Report(linkFinding("GPU-r", false))
	g.Eventually(h.event(linkFinding("GPU-r", false))).Should(count(1))

	h.p.Report(linkFinding("GPU-r", true))
	g.Eventually(func(g Gomega) {
		e := h.event(linkFinding("GPU-r", true))(g)
		g.Expect(e.Status.Resolved).To(BeTrue())
		g.Expect(e.Status.ResolvedAt).NotTo(BeNil())
		g.Expect(e.Status.Count).To(Equal(int64(1)), "a resolution is not an occurrence")
	}).Should(Succeed())

	h.p.Report(linkFinding("GPU-r", false))
	g.Eventually(func(g Gomega) {
		e := h.event(linkFinding("GPU-r", false))(g)
		g.Expect(e.Status.Resolved).To(BeFalse())
		g.Expect(e.Status.ResolvedAt).To(BeNil())
		g.Expect(e.Status.Count).To(Equal(int64(2)))
	}).Should(Succeed())
}

func TestResolvingAnUnknownEventCreatesNothing(t *testing.T) {
	g := NewWithT(t)
	h := start(t, "node-unknown", t.TempDir(), nil)
	f := linkFinding("GPU-u", true)
	h.p.Report(f)
	g.Eventually(h.p.Pending).Should(BeZero())
	err := admin.Get(context.Background(), client.ObjectKey{Name: h.name(f)}, &gpuhealthv1alpha1.NodeHealthEvent{})
	g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "got %v", err)
	g.Expect(spoolFiles(t, h.dir)).To(BeZero())
}

func TestTheOperatorsStatusFieldsAreKept(t *testing.T) {
	g := NewWithT(t)
	h := start(t, "node-fields", t.TempDir(), nil)
	f := xidFinding("GPU-f", "48")
	h.p.Report(f)
	g.Eventually(h.event(f)).Should(count(1))

	e := h.event(f)(g)
	e.Status.Phase = gpuhealthv1alpha1.EventActive
	e.Status.Classification = &gpuhealthv1alpha1.Classification{Verdict: gpuhealthv1alpha1.VerdictQuarantine, Rule: "catalog"}
	g.Expect(admin.Status().Update(context.Background(), e)).To(Succeed())

	h.p.Report(f)
	g.Eventually(func(g Gomega) {
		e := h.event(f)(g)
		g.Expect(e.Status.Count).To(Equal(int64(2)))
		g.Expect(e.Status.Phase).To(Equal(gpuhealthv1alpha1.EventActive))
		g.Expect(e.Status.Classification).NotTo(BeNil())
	}).Should(Succeed())
}

func TestDebounceHoldsUntilTheFindingRepeats(t *testing.T) {
	g := NewWithT(t)
	h := start(t, "node-debounce", t.TempDir(), nil, withDebounce(DebounceRule{
		Check: gpuhealthv1alpha1.CheckNVLinkErrors, Occurrences: 3, Window: time.Minute,
	}))
	f := linkFinding("GPU-d", false)
	h.p.Report(f)
	h.p.Report(f)
	g.Consistently(func() bool {
		err := admin.Get(context.Background(), client.ObjectKey{Name: h.name(f)}, &gpuhealthv1alpha1.NodeHealthEvent{})
		return apierrors.IsNotFound(err)
	}, 300*time.Millisecond).Should(BeTrue(), "two occurrences of three are held back")
	h.p.Report(f)
	g.Eventually(h.event(f)).Should(count(3))
}

func TestInvalidFindingsAreDroppedAndCounted(t *testing.T) {
	g := NewWithT(t)
	h := start(t, "node-invalid", t.TempDir(), nil)
	before := prom.ToFloat64(droppedTotal.WithLabelValues("", "Invalid"))
	h.p.Report(xidFinding("GPU-i", "not-a-number"))
	h.p.Report(monitors.Finding{Source: gpuhealthv1alpha1.SourceNVML, Check: gpuhealthv1alpha1.CheckXID,
		Component: gpuhealthv1alpha1.Component{Kind: gpuhealthv1alpha1.ComponentGPU}, Code: "79"})
	g.Expect(prom.ToFloat64(droppedTotal.WithLabelValues("", "Invalid")) - before).To(Equal(2.0))
	g.Expect(h.p.Pending()).To(BeZero())
}

// TestOutageRestartLosesNothingAndCountsNothingTwice plays an apiserver
// outage: the first agent cannot reach the apiserver, its findings wait in
// the spool, it stops; the second agent (same spool) publishes them once the
// apiserver is reachable; a third start publishes nothing again.
func TestOutageRestartLosesNothingAndCountsNothingTwice(t *testing.T) {
	g := NewWithT(t)
	dir := t.TempDir()
	down := rest.CopyConfig(restConfig)
	down.Host = "https://127.0.0.1:1" // nothing listens: connection refused
	fatal, link := xidFinding("GPU-o", "79"), linkFinding("GPU-o", false)

	first := start(t, "node-outage", dir, down)
	for range 5 {
		first.p.Report(fatal)
	}
	first.p.Report(link)
	g.Eventually(func() int { return spoolFiles(t, dir) }).Should(Equal(2))
	g.Consistently(first.p.Pending, 300*time.Millisecond).Should(Equal(2), "nothing reaches a dead apiserver")
	first.stop()

	second := start(t, "node-outage", dir, nil)
	g.Eventually(second.event(fatal)).Should(count(5))
	g.Eventually(second.event(link)).Should(count(1))
	g.Eventually(func() int { return spoolFiles(t, dir) }).Should(BeZero())
	second.stop()

	third := start(t, "node-outage", dir, nil)
	third.p.Report(fatal)
	g.Eventually(third.event(fatal)).Should(count(6), "a new occurrence after a restart adds to the count on the server")
	g.Consistently(third.event(link), 200*time.Millisecond).Should(count(1))
}

// TestReplayAfterACrashBetweenWriteAndCleanupIsIdempotent plays a crash
// after the apiserver accepted a write but before the spool record was
// removed: the record knows the count it was building on, so replaying it
// writes the same absolute count again.
func TestReplayAfterACrashBetweenWriteAndCleanupIsIdempotent(t *testing.T) {
	g := NewWithT(t)
	dir := t.TempDir()
	f := xidFinding("GPU-c", "79")
	h := start(t, "node-crash", dir, nil)
	for range 7 {
		h.p.Report(f)
	}
	g.Eventually(h.event(f)).Should(count(7))
	h.stop()

	sp, _, _, err := spool.Open(dir, 0)
	g.Expect(err).NotTo(HaveOccurred())
	now := time.Now()
	rec := spool.Record{
		Spec: h.event(f)(g).Spec, Base: 5, Pending: 2, FirstSeen: now, LastSeen: now,
	}
	_, err = sp.Put(&rec)
	g.Expect(err).NotTo(HaveOccurred())

	again := start(t, "node-crash", dir, nil)
	g.Eventually(func() int { return spoolFiles(t, dir) }).Should(BeZero())
	g.Expect(again.event(f)(g).Status.Count).To(Equal(int64(7)))
}

func TestSpooledRecordsForAnotherNodeAreDropped(t *testing.T) {
	g := NewWithT(t)
	dir := t.TempDir()
	sp, _, _, err := spool.Open(dir, 0)
	g.Expect(err).NotTo(HaveOccurred())
	rec := spool.Record{Spec: gpuhealthv1alpha1.NodeHealthEventSpec{
		NodeName: "someone-else", Source: gpuhealthv1alpha1.SourceNVML, Check: gpuhealthv1alpha1.CheckXID,
		Component: gpuhealthv1alpha1.Component{Kind: gpuhealthv1alpha1.ComponentGPU, ID: "GPU-x"}, Code: "79",
		Severity: gpuhealthv1alpha1.SeverityFatal,
	}, Base: -1, Pending: 1, FirstSeen: time.Now(), LastSeen: time.Now()}
	_, err = sp.Put(&rec)
	g.Expect(err).NotTo(HaveOccurred())
	h := start(t, "node-moved", dir, nil)
	g.Expect(spoolFiles(t, dir)).To(BeZero())
	g.Expect(h.p.Pending()).To(BeZero())

}
