package eventgc

import (
	"context"
	"os"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/controllers/index"
	"github.com/gpuhealth/gpuhealth/internal/test/testenv"
)

var testEnv *testenv.Env

func TestMain(m *testing.M) {
	os.Exit(testenv.Main(m, func(e *testenv.Env) error {
		testEnv = e
		return nil
	}))
}

var now = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

const day = 24 * time.Hour

func ago(d time.Duration) *metav1.Time {
	t := metav1.NewTime(now.Add(-d))
	return &t
}

// ev is an event of node named name in phase, with its status set by set.
func ev(node, name string, phase gpuhealthv1alpha1.EventPhase, set func(*gpuhealthv1alpha1.NodeHealthEventStatus)) gpuhealthv1alpha1.NodeHealthEvent {
	e := gpuhealthv1alpha1.NodeHealthEvent{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: gpuhealthv1alpha1.NodeHealthEventSpec{
			NodeName: node, Source: gpuhealthv1alpha1.SourceNVML, Check: gpuhealthv1alpha1.CheckXID,
			Component: gpuhealthv1alpha1.Component{Kind: gpuhealthv1alpha1.ComponentGPU, ID: "GPU-0"},
			Code:      "79", Severity: gpuhealthv1alpha1.SeverityFatal,
		},
		Status: gpuhealthv1alpha1.NodeHealthEventStatus{Count: 1, Phase: phase},
	}
	if set != nil {
		set(&e.Status)
	}
	return e
}

func names(ds []deletion) []string {
	out := make([]string, len(ds))
	for i, d := range ds {
		out[i] = d.event.Name + "/" + d.reason
	}
	return out
}

// TestPlan: which events go, why, and when the next is due.
func TestPlan(t *testing.T) {
	resolvedOld := ev("n", "resolved-old", gpuhealthv1alpha1.EventResolved, func(s *gpuhealthv1alpha1.NodeHealthEventStatus) { s.Resolved, s.ResolvedAt = true, ago(8*day) })
	resolvedNew := ev("n", "resolved-new", gpuhealthv1alpha1.EventResolved, func(s *gpuhealthv1alpha1.NodeHealthEventStatus) { s.Resolved, s.ResolvedAt = true, ago(1*day) })
	resolvedNewer := ev("n", "resolved-newer", gpuhealthv1alpha1.EventResolved, func(s *gpuhealthv1alpha1.NodeHealthEventStatus) { s.Resolved, s.ResolvedAt = true, ago(2*time.Hour) })
	activeOld := ev("n", "active-old", gpuhealthv1alpha1.EventActive, func(s *gpuhealthv1alpha1.NodeHealthEventStatus) { s.LastSeen = ago(30 * day) })
	unjudged := ev("n", "unjudged", "", func(s *gpuhealthv1alpha1.NodeHealthEventStatus) { s.LastSeen = ago(30 * day) })
	supersededOld := ev("n", "superseded-old", gpuhealthv1alpha1.EventSuperseded, func(s *gpuhealthv1alpha1.NodeHealthEventStatus) {
		s.LastSeen, s.SupersededAt = ago(11*day), ago(10*day)
	})
	seenAgain := ev("n", "superseded-seen-again", gpuhealthv1alpha1.EventSuperseded, func(s *gpuhealthv1alpha1.NodeHealthEventStatus) {
		s.SupersededAt, s.LastSeen = ago(10*day), ago(9*day)
	})
	ignoredOld := ev("n", "ignored-old", gpuhealthv1alpha1.EventIgnored, func(s *gpuhealthv1alpha1.NodeHealthEventStatus) { s.LastSeen = ago(8 * day) })
	ignoredSeen := ev("n", "ignored-seen", gpuhealthv1alpha1.EventIgnored, func(s *gpuhealthv1alpha1.NodeHealthEventStatus) { s.LastSeen = ago(time.Minute) })
	// The monitor saw it again; the operator has not judged it again yet.
	judged := func(v gpuhealthv1alpha1.Verdict, seen time.Duration) func(*gpuhealthv1alpha1.NodeHealthEventStatus) {
		return func(s *gpuhealthv1alpha1.NodeHealthEventStatus) {
			s.LastSeen, s.Classification = ago(seen), &gpuhealthv1alpha1.Classification{Verdict: v, Rule: "default"}
		}
	}
	observedOld := ev("n", "observed-old", gpuhealthv1alpha1.EventActive, judged(gpuhealthv1alpha1.VerdictObserve, 20*day))
	observedMid := ev("n", "observed-mid", gpuhealthv1alpha1.EventActive, judged(gpuhealthv1alpha1.VerdictObserve, day))
	observedNew := ev("n", "observed-new", gpuhealthv1alpha1.EventActive, judged(gpuhealthv1alpha1.VerdictObserve, time.Minute))
	// Debouncing or counting, a Quarantine finding is never the cap's.
	quarantineOld := ev("n", "quarantine-old", gpuhealthv1alpha1.EventActive, judged(gpuhealthv1alpha1.VerdictQuarantine, 30*day))
	resolvedSeenAgain := ev("n", "resolved-seen-again", gpuhealthv1alpha1.EventResolved, func(s *gpuhealthv1alpha1.NodeHealthEventStatus) { s.LastSeen = ago(time.Minute) })

	for _, tc := range []struct {
		name     string
		r        Reconciler
		items    []gpuhealthv1alpha1.NodeHealthEvent
		nodeGone bool
		want     []string
		wantNext time.Duration // after now; 0 for none
		wantOver int
	}{{
		name:     "finished longer ago than the retention go; active, unjudged and seen-again stay",
		r:        Reconciler{Retention: 7 * day},
		items:    []gpuhealthv1alpha1.NodeHealthEvent{resolvedOld, resolvedNew, activeOld, unjudged, supersededOld, seenAgain, ignoredOld, ignoredSeen},
		want:     []string{"resolved-old/retention", "superseded-old/retention", "ignored-old/retention"},
		wantNext: 6 * day, // resolved-new's retention ends first
	}, {
		name:     "the next due time is the earliest kept finished event's",
		r:        Reconciler{Retention: 7 * day},
		items:    []gpuhealthv1alpha1.NodeHealthEvent{resolvedNew, resolvedNewer, activeOld},
		wantNext: 6 * day,
	}, {
		name:  "a resolved finding seen again is not finished, whatever its phase still says",
		r:     Reconciler{Retention: time.Second, MaxPerNode: 1},
		items: []gpuhealthv1alpha1.NodeHealthEvent{resolvedSeenAgain, activeOld},
		want:  nil, wantOver: 1,
	}, {
		name:     "the cap leaves an event finished less than its grace ago, and comes back for it",
		r:        Reconciler{MaxPerNode: 1},
		items:    []gpuhealthv1alpha1.NodeHealthEvent{activeOld, ignoredSeen},
		wantNext: capGrace - time.Minute,
	}, {
		name:  "no retention: finished events stay, nothing is due",
		items: []gpuhealthv1alpha1.NodeHealthEvent{resolvedOld, activeOld},
	}, {
		name:  "over the cap the oldest finished go first",
		r:     Reconciler{MaxPerNode: 3},
		items: []gpuhealthv1alpha1.NodeHealthEvent{resolvedNewer, activeOld, resolvedNew, ignoredSeen, resolvedOld},
		want:  []string{"resolved-old/cap", "resolved-new/cap"},
	}, {
		name:     "active events over the cap are kept and counted",
		r:        Reconciler{MaxPerNode: 1},
		items:    []gpuhealthv1alpha1.NodeHealthEvent{activeOld, unjudged, resolvedNew},
		want:     []string{"resolved-new/cap"},
		wantOver: 1,
	}, {
		name:  "unfinished alone over the cap: the least recently seen Observe findings go, Quarantine and unjudged stay",
		r:     Reconciler{MaxPerNode: 3},
		items: []gpuhealthv1alpha1.NodeHealthEvent{observedNew, quarantineOld, observedOld, unjudged, observedMid, activeOld},
		want:  []string{"observed-old/cap-observed", "observed-mid/cap-observed", "observed-new/cap-observed"},
	}, {
		name:  "Observe findings go only as far as the unfinished exceed the cap; finished ones are the cap's first",
		r:     Reconciler{MaxPerNode: 3},
		items: []gpuhealthv1alpha1.NodeHealthEvent{observedNew, observedOld, quarantineOld, unjudged, resolvedOld},
		want:  []string{"observed-old/cap-observed", "resolved-old/cap"},
	}, {
		name:     "when only Quarantine and unjudged findings are over the cap, they are kept and counted",
		r:        Reconciler{MaxPerNode: 1},
		items:    []gpuhealthv1alpha1.NodeHealthEvent{quarantineOld, unjudged, observedNew},
		want:     []string{"observed-new/cap-observed"},
		wantOver: 1,
	}, {
		name:  "retention and cap together count the retained only once",
		r:     Reconciler{Retention: 7 * day, MaxPerNode: 2},
		items: []gpuhealthv1alpha1.NodeHealthEvent{resolvedOld, resolvedNew, resolvedNewer, activeOld},
		want:  []string{"resolved-old/retention", "resolved-new/cap"},
		// resolved-newer is kept; its retention ends in 7 days less 2 hours.
		wantNext: 7*day - 2*time.Hour,
	}, {
		name:     "events of a node that is gone finished when last seen, active ones too",
		r:        Reconciler{Retention: 7 * day},
		items:    []gpuhealthv1alpha1.NodeHealthEvent{activeOld, ignoredSeen},
		nodeGone: true,
		want:     []string{"active-old/retention"},
		wantNext: 7*day - time.Minute,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			items := append([]gpuhealthv1alpha1.NodeHealthEvent(nil), tc.items...)
			p := tc.r.plan(items, tc.nodeGone, now)
			g.Expect(names(p.deletes)).To(ConsistOf(tc.want))
			if tc.wantNext == 0 {
				g.Expect(p.next.IsZero()).To(BeTrue(), "nothing is due, got %s", p.next)
			} else {
				g.Expect(p.next.Sub(now)).To(Equal(tc.wantNext))
			}
			g.Expect(p.overCap).To(Equal(tc.wantOver))
		})
	}
}

// cachedClient starts a cache with the reconciler's index and returns a
// client that reads from it, as the manager's does.
func cachedClient(t *testing.T) client.Client {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	mgr, err := ctrl.NewManager(testEnv.Config, ctrl.Options{Scheme: testEnv.Scheme, Metrics: metricsserver.Options{BindAddress: "0"}})
	NewWithT(t).Expect(err).NotTo(HaveOccurred())
	NewWithT(t).Expect(index.Register(ctx, mgr.GetFieldIndexer())).To(Succeed())
	go func() { _ = mgr.Start(ctx) }()
	NewWithT(t).Expect(mgr.GetCache().WaitForCacheSync(ctx)).To(BeTrue())
	return mgr.GetClient()
}

// create writes e with its status, as a monitor and the operator would have.
func create(t *testing.T, e gpuhealthv1alpha1.NodeHealthEvent) *gpuhealthv1alpha1.NodeHealthEvent {
	t.Helper()
	g := NewWithT(t)
	obj := e.DeepCopy()
	g.Expect(testEnv.Client.Create(context.Background(), obj)).To(Succeed())
	obj.Status = e.Status
	g.Expect(testEnv.Client.Status().Update(context.Background(), obj)).To(Succeed())
	t.Cleanup(func() { _ = testEnv.Client.Delete(context.Background(), obj) })
	return obj
}

func exists(t *testing.T, name string) bool {
	t.Helper()
	err := testEnv.Client.Get(context.Background(), types.NamespacedName{Name: name}, &gpuhealthv1alpha1.NodeHealthEvent{})
	if apierrors.IsNotFound(err) {
		return false
	}
	NewWithT(t).Expect(err).NotTo(HaveOccurred())
	return true
}

func node(t *testing.T, name string) {
	t.Helper()
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
	NewWithT(t).Expect(testEnv.Client.Create(context.Background(), n)).To(Succeed())
	t.Cleanup(func() { _ = testEnv.Client.Delete(context.Background(), n) })
}

// TestReconcileDeletesWhatIsDue: against the apiserver, a reconcile
// deletes the events its plan names, keeps the rest, and comes back when
// the next retention ends.
func TestReconcileDeletesWhatIsDue(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	node(t, "gc-a")
	create(t, ev("gc-a", "gc-a-resolved-old", gpuhealthv1alpha1.EventResolved, func(s *gpuhealthv1alpha1.NodeHealthEventStatus) {
		s.Resolved, s.ResolvedAt = true, ago(8*day)
	}))
	create(t, ev("gc-a", "gc-a-resolved-new", gpuhealthv1alpha1.EventResolved, func(s *gpuhealthv1alpha1.NodeHealthEventStatus) {
		s.Resolved, s.ResolvedAt = true, ago(1*day)
	}))
	create(t, ev("gc-a", "gc-a-active-old", gpuhealthv1alpha1.EventActive, func(s *gpuhealthv1alpha1.NodeHealthEventStatus) {
		s.FirstSeen, s.LastSeen = ago(31*day), ago(30*day)
	}))
	// A node that left the cluster: its findings go once last seen longer ago than the retention.
	create(t, ev("gc-gone", "gc-gone-active-old", gpuhealthv1alpha1.EventActive, func(s *gpuhealthv1alpha1.NodeHealthEventStatus) {
		s.FirstSeen, s.LastSeen = ago(9*day), ago(8*day)
	}))
	create(t, ev("gc-gone", "gc-gone-active-new", gpuhealthv1alpha1.EventActive, func(s *gpuhealthv1alpha1.NodeHealthEventStatus) {
		s.FirstSeen, s.LastSeen = ago(2*day), ago(1*day)
	}))

	c := cachedClient(t)
	g.Eventually(func() int {
		l := &gpuhealthv1alpha1.NodeHealthEventList{}
		g.Expect(c.List(ctx, l)).To(Succeed())
		return len(l.Items)
	}).Should(BeNumerically(">=", 5))
	r := &Reconciler{Client: c, Clock: clocktesting.NewFakeClock(now), Retention: 7 * day}
	before := testutil.ToFloat64(deleted.WithLabelValues(ReasonRetention))

	res, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: types.NamespacedName{Name: "gc-a"}})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(exists(t, "gc-a-resolved-old")).To(BeFalse(), "resolved 8 days ago, retention 7")
	g.Expect(exists(t, "gc-a-resolved-new")).To(BeTrue())
	g.Expect(exists(t, "gc-a-active-old")).To(BeTrue(), "an active finding is never deleted")
	g.Expect(res.RequeueAfter).To(Equal(6*day), "back when gc-a-resolved-new's retention ends")

	res, err = r.Reconcile(ctx, ctrl.Request{NamespacedName: types.NamespacedName{Name: "gc-gone"}})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(exists(t, "gc-gone-active-old")).To(BeFalse())
	g.Expect(exists(t, "gc-gone-active-new")).To(BeTrue())
	g.Expect(res.RequeueAfter).To(Equal(6 * day))
	g.Expect(testutil.ToFloat64(deleted.WithLabelValues(ReasonRetention)) - before).To(BeEquivalentTo(2))

	// The cap: one event per node. gc-a keeps its active finding and drops the resolved one.
	r.MaxPerNode = 1
	g.Eventually(func() error {
		return c.Get(ctx, types.NamespacedName{Name: "gc-a-resolved-old"}, &gpuhealthv1alpha1.NodeHealthEvent{})
	}).Should(Satisfy(apierrors.IsNotFound), "the cache sees the first deletion")
	_, err = r.Reconcile(ctx, ctrl.Request{NamespacedName: types.NamespacedName{Name: "gc-a"}})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(exists(t, "gc-a-resolved-new")).To(BeFalse(), "over the cap")
	g.Expect(exists(t, "gc-a-active-old")).To(BeTrue())
}

// staleReader serves a list read earlier, as a lagging cache would.
type staleReader struct {
	client.Client
	list gpuhealthv1alpha1.NodeHealthEventList
}

func (s staleReader) List(_ context.Context, l client.ObjectList, _ ...client.ListOption) error {
	s.list.DeepCopyInto(l.(*gpuhealthv1alpha1.NodeHealthEventList))
	return nil
}

// TestChangedMeanwhileIsNotDeleted: an event that changed after it was read
// (a monitor reported it again) is not deleted; the node is looked at again.
func TestChangedMeanwhileIsNotDeleted(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	node(t, "gc-b")
	e := create(t, ev("gc-b", "gc-b-resolved", gpuhealthv1alpha1.EventResolved, func(s *gpuhealthv1alpha1.NodeHealthEventStatus) {
		s.Resolved, s.ResolvedAt = true, ago(8*day)
	}))
	stale := staleReader{Client: testEnv.Client}
	stale.list.Items = []gpuhealthv1alpha1.NodeHealthEvent{*e.DeepCopy()}

	// The monitor sees it again.
	e.Status.Resolved, e.Status.ResolvedAt, e.Status.Count, e.Status.LastSeen = false, nil, 2, ago(0)
	g.Expect(testEnv.Client.Status().Update(ctx, e)).To(Succeed())

	r := &Reconciler{Client: stale, Clock: clocktesting.NewFakeClock(now), Retention: 7 * day}
	res, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: types.NamespacedName{Name: "gc-b"}})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(res.RequeueAfter).To(Equal(conflictRecheck), "looked at again soon")
	g.Expect(exists(t, "gc-b-resolved")).To(BeTrue(), "the delete's preconditions refuse a changed event")
}

// TestControllerCollectsOnPhaseChange: the running controller deletes an
// event when the operator's judgement finishes it and its retention is
// over, and leaves an active one of the same node.
func TestControllerCollectsOnPhaseChange(t *testing.T) {
	g := NewWithT(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	node(t, "gc-c")
	active := create(t, ev("gc-c", "gc-c-active", gpuhealthv1alpha1.EventActive, nil))
	fixed := create(t, ev("gc-c", "gc-c-fixed", gpuhealthv1alpha1.EventActive, nil))

	mgr, err := ctrl.NewManager(testEnv.Config, ctrl.Options{Scheme: testEnv.Scheme, Metrics: metricsserver.Options{BindAddress: "0"}})
	g.Expect(err).NotTo(HaveOccurred())
	r := &Reconciler{Client: mgr.GetClient(), Clock: clocktesting.NewFakeClock(now), Retention: time.Hour}
	g.Expect(index.Register(ctx, mgr.GetFieldIndexer())).To(Succeed())
	g.Expect(r.SetupWithManager(ctx, mgr)).To(Succeed())
	go func() { _ = mgr.Start(ctx) }()

	// The operator judges gc-c-fixed Resolved: the monitor said it cleared two hours ago.
	fixed.Status.Phase, fixed.Status.Resolved, fixed.Status.ResolvedAt = gpuhealthv1alpha1.EventResolved, true, ago(2*time.Hour)
	g.Expect(testEnv.Client.Status().Update(ctx, fixed)).To(Succeed())
	g.Eventually(func() bool { return exists(t, fixed.Name) }).WithTimeout(10 * time.Second).Should(BeFalse())
	g.Expect(exists(t, active.Name)).To(BeTrue())
}

// TestWatchesWhenAFindingFinishesAgain: the controller looks again when an
// event's finish changes, also without a phase change, and not on a
// monitor's count update of an active finding.
func TestWatchesWhenAFindingFinishesAgain(t *testing.T) {
	g := NewWithT(t)
	closed := ev("n", "e", gpuhealthv1alpha1.EventSuperseded, func(s *gpuhealthv1alpha1.NodeHealthEventStatus) {
		s.LastSeen, s.SupersededAt = ago(2*day), ago(day)
	})
	closedAgain := closed.DeepCopy()
	closedAgain.Status.LastSeen, closedAgain.Status.SupersededAt = ago(time.Hour), ago(time.Minute)
	g.Expect(createdOrPhaseChanged.Update(event.UpdateEvent{ObjectOld: &closed, ObjectNew: closedAgain})).To(BeTrue(), "closed again at a new time")

	active := ev("n", "a", gpuhealthv1alpha1.EventActive, nil)
	counted := active.DeepCopy()
	counted.Status.Count, counted.Status.LastSeen = 2, ago(0)
	g.Expect(createdOrPhaseChanged.Update(event.UpdateEvent{ObjectOld: &active, ObjectNew: counted})).To(BeFalse(), "a count update of an active finding")
}
