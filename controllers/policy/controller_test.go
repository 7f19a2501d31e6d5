package policy

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/internal/test/testenv"
	"github.com/gpuhealth/gpuhealth/remediation/job"
)

var (
	k8sClient client.Client
	env       *testenv.Env
)

func TestMain(m *testing.M) {
	os.Exit(testenv.Main(m, func(e *testenv.Env) error {
		k8sClient, env = e.Client, e
		return nil
	}))
}

// TestCountsByPhase: the policy's status counts only the nodes it selects,
// by the phase of their NodeHealth, and keeps the breaker's status alone.
func TestCountsByPhase(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	p := &gpuhealthv1alpha1.RemediationPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "counts"},
		Spec:       gpuhealthv1alpha1.RemediationPolicySpec{NodeSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"pool": "counts"}}},
	}
	g.Expect(k8sClient.Create(ctx, p)).To(Succeed())
	since := metav1.NewTime(time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC))
	p.Status.CircuitBreaker = &gpuhealthv1alpha1.CircuitBreakerStatus{State: gpuhealthv1alpha1.BreakerOpen, Since: &since}
	g.Expect(k8sClient.Status().Update(ctx, p)).To(Succeed())

	phases := map[string]gpuhealthv1alpha1.NodeHealthPhase{
		"counts-a": gpuhealthv1alpha1.PhaseHealthy, "counts-b": gpuhealthv1alpha1.PhaseHealthy,
		"counts-c": gpuhealthv1alpha1.PhaseDraining, "other-d": gpuhealthv1alpha1.PhaseFailed,
	}
	for name, phase := range phases {
		pool := "counts"
		if name == "other-d" {
			pool = "other"
		}
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"pool": pool}}}
		g.Expect(k8sClient.Create(ctx, n)).To(Succeed())
		nh := &gpuhealthv1alpha1.NodeHealth{ObjectMeta: metav1.ObjectMeta{Name: name}}
		g.Expect(k8sClient.Create(ctx, nh)).To(Succeed())
		nh.Status.Phase = phase
		g.Expect(k8sClient.Status().Update(ctx, nh)).To(Succeed())
	}
	r := &Reconciler{Client: k8sClient, Clock: clocktesting.NewFakeClock(since.Time), Recorder: events.NewFakeRecorder(10)}
	res, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: types.NamespacedName{Name: p.Name}})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(res.RequeueAfter).To(Equal(30*time.Minute), "looked at again when the cool-down ends")

	got := &gpuhealthv1alpha1.RemediationPolicy{}
	g.Expect(k8sClient.Get(ctx, types.NamespacedName{Name: p.Name}, got)).To(Succeed())
	g.Expect(got.Status.ManagedNodes).To(BeEquivalentTo(3))
	g.Expect(got.Status.Phases).To(Equal(map[gpuhealthv1alpha1.NodeHealthPhase]int32{"Healthy": 2, "Draining": 1}))
	g.Expect(got.Status.ObservedGeneration).To(Equal(got.Generation))
	g.Expect(got.Status.Conditions).To(ContainElement(HaveField("Reason", gpuhealthv1alpha1.ReasonValid)))
	g.Expect(got.Status.CircuitBreaker.State).To(Equal(gpuhealthv1alpha1.BreakerOpen), "the breaker's state is not ours to write")
	g.Expect(testutil.ToFloat64(breakerOpen.WithLabelValues(p.Name))).To(BeEquivalentTo(1), "the metric mirrors the open breaker")

	// The breaker closes (the nodehealth reconciler writes it): the metric follows.
	got.Status.CircuitBreaker.State = gpuhealthv1alpha1.BreakerClosed
	g.Expect(k8sClient.Status().Update(ctx, got)).To(Succeed())
	r.Clock = clocktesting.NewFakeClock(since.Add(time.Minute))
	_, err = r.Reconcile(ctx, ctrl.Request{NamespacedName: types.NamespacedName{Name: p.Name}})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(testutil.ToFloat64(breakerOpen.WithLabelValues(p.Name))).To(BeEquivalentTo(0))
}

// TestBreakerOpenUntil: the metric says open only while the breaker really
// stops quarantines, though its status may still say Open.
func TestBreakerOpenUntil(t *testing.T) {
	since := metav1.NewTime(time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC))
	policy := func(mutate func(*gpuhealthv1alpha1.RemediationPolicy)) *gpuhealthv1alpha1.RemediationPolicy {
		p := &gpuhealthv1alpha1.RemediationPolicy{ObjectMeta: metav1.ObjectMeta{Name: "p"}}
		p.Status.CircuitBreaker = &gpuhealthv1alpha1.CircuitBreakerStatus{State: gpuhealthv1alpha1.BreakerOpen, Since: &since, LastReset: "r1"}
		if mutate != nil {
			mutate(p)
		}
		return p
	}
	for _, c := range []struct {
		name  string
		p     *gpuhealthv1alpha1.RemediationPolicy
		at    time.Duration
		open  bool
		until time.Duration
	}{
		{name: "open, in the default cool-down", p: policy(nil), at: 29 * time.Minute, open: true, until: 30 * time.Minute},
		{name: "open in status, cool-down over", p: policy(nil), at: 30 * time.Minute},
		{name: "the policy's own cool-down", p: policy(func(p *gpuhealthv1alpha1.RemediationPolicy) {
			p.Spec.CircuitBreaker.CoolDown = ptr.To(gpuhealthv1alpha1.Duration("2h"))
		}), at: time.Hour, open: true, until: 2 * time.Hour},
		{name: "disabled since", p: policy(func(p *gpuhealthv1alpha1.RemediationPolicy) { p.Spec.CircuitBreaker.Enabled = ptr.To(false) }), at: time.Minute},
		{name: "a new reset asked for", p: policy(func(p *gpuhealthv1alpha1.RemediationPolicy) {
			p.Annotations = map[string]string{gpuhealthv1alpha1.ResetCircuitBreakerAnnotation: "r2"}
		}), at: time.Minute},
		{name: "the reset already applied", p: policy(func(p *gpuhealthv1alpha1.RemediationPolicy) {
			p.Annotations = map[string]string{gpuhealthv1alpha1.ResetCircuitBreakerAnnotation: "r1"}
		}), at: time.Minute, open: true, until: 30 * time.Minute},
		{name: "closed", p: policy(func(p *gpuhealthv1alpha1.RemediationPolicy) {
			p.Status.CircuitBreaker.State = gpuhealthv1alpha1.BreakerClosed
		}), at: time.Minute},
		{name: "no status", p: &gpuhealthv1alpha1.RemediationPolicy{}, at: time.Minute},
	} {
		t.Run(c.name, func(t *testing.T) {
			g := NewWithT(t)
			open, until := breakerOpenUntil(c.p, since.Add(c.at))
			g.Expect(open).To(Equal(c.open))
			if c.open {
				g.Expect(until).To(Equal(since.Add(c.until)))
			}
		})
	}
}

// TestBreakerStateChangeIsWatched: the policy's own watch passes a change
// of the breaker's state (a status write, no generation change), so the
// metric follows it, and not the controller's own count writes.
func TestBreakerStateChangeIsWatched(t *testing.T) {
	g := NewWithT(t)
	closed := &gpuhealthv1alpha1.RemediationPolicy{ObjectMeta: metav1.ObjectMeta{Name: "p", Generation: 1}}
	closed.Status.CircuitBreaker = &gpuhealthv1alpha1.CircuitBreakerStatus{State: gpuhealthv1alpha1.BreakerClosed}
	open := closed.DeepCopy()
	open.Status.CircuitBreaker.State = gpuhealthv1alpha1.BreakerOpen
	counted := closed.DeepCopy()
	counted.Status.ManagedNodes = 7
	g.Expect(breakerChanged.Update(event.UpdateEvent{ObjectOld: closed, ObjectNew: open})).To(BeTrue())
	g.Expect(breakerChanged.Update(event.UpdateEvent{ObjectOld: &gpuhealthv1alpha1.RemediationPolicy{}, ObjectNew: open})).To(BeTrue(), "the first breaker status")
	g.Expect(breakerChanged.Update(event.UpdateEvent{ObjectOld: closed, ObjectNew: counted})).To(BeFalse())
	reset := open.DeepCopy()
	reset.Annotations = map[string]string{gpuhealthv1alpha1.ResetCircuitBreakerAnnotation: "now"}
	g.Expect(breakerChanged.Update(event.UpdateEvent{ObjectOld: open, ObjectNew: reset})).To(BeTrue(), "a reset request")
}

func TestCountsAtMostOncePerInterval(t *testing.T) {
	g := NewWithT(t)
	clk := clocktesting.NewFakeClock(time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC))
	r := &Reconciler{MinInterval: time.Hour, Clock: clk}
	g.Expect(r.throttle("a")).To(BeZero(), "the first count goes ahead")
	clk.Step(time.Minute)
	g.Expect(r.throttle("a")).To(Equal(59*time.Minute), "the next waits out the interval")
	g.Expect(r.throttle("b")).To(BeZero(), "per policy")
	clk.Step(59 * time.Minute)
	g.Expect(r.throttle("a")).To(BeZero(), "after the interval it goes ahead again")
}

// TestBudgetCountsAndEvents: the policy's status and metrics count its
// maxUnavailable budget, and nodes starting and stopping to wait for it are
// one Event each way, not one per node or per count.
func TestBudgetCountsAndEvents(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	p := &gpuhealthv1alpha1.RemediationPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "budget"},
		Spec:       gpuhealthv1alpha1.RemediationPolicySpec{NodeSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"pool": "budget"}}},
	}
	g.Expect(k8sClient.Create(ctx, p)).To(Succeed())
	setNode := func(name string, phase gpuhealthv1alpha1.NodeHealthPhase, blocking gpuhealthv1alpha1.BudgetName) {
		nh := &gpuhealthv1alpha1.NodeHealth{}
		if err := k8sClient.Get(ctx, types.NamespacedName{Name: name}, nh); err != nil {
			g.Expect(k8sClient.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"pool": "budget"}}})).To(Succeed())
			nh = &gpuhealthv1alpha1.NodeHealth{ObjectMeta: metav1.ObjectMeta{Name: name}}
			g.Expect(k8sClient.Create(ctx, nh)).To(Succeed())
		}
		nh.Status.Phase, nh.Status.BlockingBudget = phase, blocking
		g.Expect(k8sClient.Status().Update(ctx, nh)).To(Succeed())
	}
	setNode("budget-a", gpuhealthv1alpha1.PhaseDraining, "")
	setNode("budget-b", gpuhealthv1alpha1.PhaseQuarantined, gpuhealthv1alpha1.BudgetMaxUnavailable)
	setNode("budget-c", gpuhealthv1alpha1.PhaseQuarantined, gpuhealthv1alpha1.BudgetMaxUnavailable)

	clk := clocktesting.NewFakeClock(time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC))
	rec := events.NewFakeRecorder(10)
	r := &Reconciler{Client: k8sClient, Clock: clk, Recorder: rec}
	count := func() *gpuhealthv1alpha1.BudgetStatus {
		clk.Step(time.Minute) // past the count interval
		_, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: types.NamespacedName{Name: p.Name}})
		g.Expect(err).NotTo(HaveOccurred())
		got := &gpuhealthv1alpha1.RemediationPolicy{}
		g.Expect(k8sClient.Get(ctx, types.NamespacedName{Name: p.Name}, got)).To(Succeed())
		return got.Status.Budget
	}

	g.Expect(count()).To(Equal(&gpuhealthv1alpha1.BudgetStatus{Limit: 1, Unavailable: 1, Waiting: 2}), "10% of 3 nodes rounds up to 1")
	g.Expect(testutil.ToFloat64(budgetWaiting.WithLabelValues(p.Name))).To(BeEquivalentTo(2))
	g.Expect(testutil.ToFloat64(budgetUnavailable.WithLabelValues(p.Name))).To(BeEquivalentTo(1))
	g.Expect(testutil.ToFloat64(budgetLimit.WithLabelValues(p.Name))).To(BeEquivalentTo(1))
	g.Expect(rec.Events).To(Receive(HavePrefix("Warning BudgetExhausted 2 quarantined nodes wait")))

	// budget-a returns and budget-b starts draining: one still waits, no new Event.
	setNode("budget-a", gpuhealthv1alpha1.PhaseHealthy, "")
	setNode("budget-b", gpuhealthv1alpha1.PhaseDraining, "")
	g.Expect(count()).To(Equal(&gpuhealthv1alpha1.BudgetStatus{Limit: 1, Unavailable: 1, Waiting: 1}))
	g.Expect(rec.Events).NotTo(Receive())

	// None waits any more.
	setNode("budget-c", gpuhealthv1alpha1.PhaseDraining, "")
	g.Expect(count()).To(Equal(&gpuhealthv1alpha1.BudgetStatus{Limit: 1, Unavailable: 2}))
	g.Expect(rec.Events).To(Receive(HavePrefix("Normal BudgetAvailable")))

	// A deleted policy takes its metrics along.
	series := testutil.CollectAndCount(budgetWaiting)
	g.Expect(k8sClient.Delete(ctx, p)).To(Succeed())
	clk.Step(time.Minute)
	_, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: types.NamespacedName{Name: p.Name}})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(testutil.CollectAndCount(budgetWaiting)).To(Equal(series - 1))
	g.Expect(r.counted).NotTo(HaveKey(p.Name), "nor is its count time kept")
}

// TestRecountsWhenANodeStartsWaiting: a node that starts or stops waiting
// for a budget without changing phase still changes the counts.
func TestRecountsWhenANodeStartsWaiting(t *testing.T) {
	g := NewWithT(t)
	old := &gpuhealthv1alpha1.NodeHealth{Status: gpuhealthv1alpha1.NodeHealthStatus{Phase: gpuhealthv1alpha1.PhaseQuarantined}}
	waiting := old.DeepCopy()
	waiting.Status.BlockingBudget = gpuhealthv1alpha1.BudgetMaxUnavailable
	g.Expect(phaseChanged.Update(event.UpdateEvent{ObjectOld: old, ObjectNew: waiting})).To(BeTrue())
	g.Expect(phaseChanged.Update(event.UpdateEvent{ObjectOld: waiting, ObjectNew: old})).To(BeTrue())
	other := waiting.DeepCopy()
	other.Status.Message = "a new message"
	g.Expect(phaseChanged.Update(event.UpdateEvent{ObjectOld: waiting, ObjectNew: other})).To(BeFalse())
}

// TestJobRulesBreachedIsNotReady: a policy whose Job templates break the
// install's rules is Ready=False with every breach named; fixing it makes
// it Ready again.
func TestJobRulesBreachedIsNotReady(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	rules := job.Rules{
		ServiceAccount: job.DefaultServiceAccount, Reserved: []string{"gpuhealth-operator"},
		PrivilegedKinds: []job.Kind{job.ResetGPU, job.RebootNode}, ImagePrefixes: []string{"nvcr.io/nvidia/"},
	}
	p := &gpuhealthv1alpha1.RemediationPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "breaches"},
		Spec: gpuhealthv1alpha1.RemediationPolicySpec{
			NodeSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"pool": "breaches"}},
			Recertification: gpuhealthv1alpha1.RecertificationSpec{Steps: []gpuhealthv1alpha1.SuiteStep{{
				Name: "dcgm", Job: gpuhealthv1alpha1.JobTemplate{Image: "nvcr.io/nvidia/cloud-native/dcgm:4.2.3-1-ubuntu22.04", Privileged: true, ServiceAccountName: "gpuhealth-operator"},
			}}},
		},
	}
	g.Expect(k8sClient.Create(ctx, p)).To(Succeed())
	t.Cleanup(func() { _ = k8sClient.Delete(context.Background(), p) })
	g.Expect(k8sClient.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "breaches-a", Labels: map[string]string{"pool": "breaches"}}})).To(Succeed())

	clk := clocktesting.NewFakeClock(time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC))
	r := &Reconciler{Client: k8sClient, Clock: clk, Recorder: events.NewFakeRecorder(10), JobRules: rules}
	ready := func() metav1.Condition { return readyAfterSync(g, r, clk, p.Name) }
	c := ready()
	g.Expect(c.Status).To(Equal(metav1.ConditionFalse))
	g.Expect(c.Reason).To(Equal(gpuhealthv1alpha1.ReasonJobRulesBreached))
	g.Expect(c.Message).To(And(
		HavePrefix("2 breaches of the install's Job rules; gpuhealth does not act on this policy's 1 nodes until they are fixed: "),
		ContainSubstring(`spec.recertification.steps[dcgm].job: serviceAccountName "gpuhealth-operator" is gpuhealth's own identity`),
		ContainSubstring("spec.recertification.steps[dcgm].job: privileged is allowed only for steps reset, reboot, not recert"),
	))

	// Fixed: Ready again.
	g.Expect(k8sClient.Get(ctx, types.NamespacedName{Name: p.Name}, p)).To(Succeed())
	p.Spec.Recertification.Steps[0].Job.Privileged, p.Spec.Recertification.Steps[0].Job.ServiceAccountName = false, ""
	g.Expect(k8sClient.Update(ctx, p)).To(Succeed())
	c = ready()
	g.Expect(c.Status).To(Equal(metav1.ConditionTrue))
	g.Expect(c.Reason).To(Equal(gpuhealthv1alpha1.ReasonValid))
}

// A drain namespaceSelector with an operator the schema cannot check
// ("Equals") would fail every drain of the policy's nodes: the policy says
// so, Ready=False with InvalidSelector naming the entry, until it is fixed.
func TestUnparsableDrainSelectorIsNotReady(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	p := &gpuhealthv1alpha1.RemediationPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "bad-namespace-selector"},
		Spec: gpuhealthv1alpha1.RemediationPolicySpec{
			NodeSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"pool": "bad-namespace-selector"}},
			Drain: gpuhealthv1alpha1.DrainSpec{Namespaces: []gpuhealthv1alpha1.NamespaceDrain{
				{Namespace: "batch", Mode: gpuhealthv1alpha1.DrainWaitForCompletion},
				{Mode: gpuhealthv1alpha1.DrainEvict, NamespaceSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
					{Key: "team", Operator: "Equals", Values: []string{"ml"}},
				}}},
			}},
		},
	}
	g.Expect(k8sClient.Create(ctx, p)).To(Succeed(), "the schema admits it")
	t.Cleanup(func() { _ = k8sClient.Delete(context.Background(), p) })

	clk := clocktesting.NewFakeClock(time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC))
	r := &Reconciler{Client: k8sClient, Clock: clk, Recorder: events.NewFakeRecorder(10)}
	ready := func() metav1.Condition { return readyAfterSync(g, r, clk, p.Name) }
	c := ready()
	g.Expect(c.Status).To(Equal(metav1.ConditionFalse))
	g.Expect(c.Reason).To(Equal(gpuhealthv1alpha1.ReasonInvalidSelector))
	g.Expect(c.Message).To(And(HavePrefix("drain.namespaces[1].namespaceSelector does not parse: "), ContainSubstring(`"Equals" is not a valid label selector operator`)))

	g.Expect(k8sClient.Get(ctx, types.NamespacedName{Name: p.Name}, p)).To(Succeed())
	p.Spec.Drain.Namespaces[1].NamespaceSelector.MatchExpressions[0].Operator = metav1.LabelSelectorOpIn
	g.Expect(k8sClient.Update(ctx, p)).To(Succeed())
	c = ready()
	g.Expect(c.Status).To(Equal(metav1.ConditionTrue))
}

// readyAfterSync runs the policy controller once for the policy, steps the
// clock past MinInterval, and returns the policy's Ready condition.
func readyAfterSync(g Gomega, r *Reconciler, clk *clocktesting.FakeClock, name string) metav1.Condition {
	ctx := context.Background()
	_, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: types.NamespacedName{Name: name}})
	g.Expect(err).NotTo(HaveOccurred())
	clk.Step(time.Minute) // past MinInterval
	got := &gpuhealthv1alpha1.RemediationPolicy{}
	g.Expect(k8sClient.Get(ctx, types.NamespacedName{Name: name}, got)).To(Succeed())
	c := meta.FindStatusCondition(got.Status.Conditions, gpuhealthv1alpha1.PolicyReadyCondition)
	g.Expect(c).NotTo(BeNil())
	return *c
}

// TestCountsFromTheCacheInPlace: with the manager's cache the counts read
// the cached Nodes and NodeHealths in place. They equal a count through a
// List, and allocate a small fraction of it: a List copies every object
// into its Items, which at 5,000 nodes was 6.8 MB a count, once a second in
// a storm.
func TestCountsFromTheCacheInPlace(t *testing.T) {
	g := NewWithT(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const nodes = 300
	p := &gpuhealthv1alpha1.RemediationPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "inplace"},
		Spec:       gpuhealthv1alpha1.RemediationPolicySpec{NodeSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"pool": "inplace"}}},
	}
	g.Expect(k8sClient.Create(ctx, p)).To(Succeed())
	phases := []gpuhealthv1alpha1.NodeHealthPhase{gpuhealthv1alpha1.PhaseHealthy, gpuhealthv1alpha1.PhaseQuarantined, gpuhealthv1alpha1.PhaseDraining}
	for i := range nodes {
		name := fmt.Sprintf("inplace-%03d", i)
		g.Expect(k8sClient.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"pool": "inplace"}}})).To(Succeed())
		nh := &gpuhealthv1alpha1.NodeHealth{ObjectMeta: metav1.ObjectMeta{Name: name}}
		g.Expect(k8sClient.Create(ctx, nh)).To(Succeed())
		nh.Status.Phase = phases[i%len(phases)]
		g.Expect(k8sClient.Status().Update(ctx, nh)).To(Succeed())
	}
	c, err := cache.New(env.Config, cache.Options{Scheme: env.Scheme})
	g.Expect(err).NotTo(HaveOccurred())
	go func() { _ = c.Start(ctx) }()
	for _, o := range []client.Object{&corev1.Node{}, &gpuhealthv1alpha1.NodeHealth{}} {
		_, err := c.GetInformer(ctx, o)
		g.Expect(err).NotTo(HaveOccurred())
	}
	g.Expect(c.WaitForCacheSync(ctx)).To(BeTrue())
	cached := &Reconciler{Client: k8sClient, Cache: c}
	g.Eventually(func(g Gomega) {
		got, err := cached.count(ctx, p, labels.SelectorFromSet(labels.Set{"pool": "inplace"}))
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(got.phases).To(Equal(map[gpuhealthv1alpha1.NodeHealthPhase]int32{
			gpuhealthv1alpha1.PhaseHealthy: nodes / 3, gpuhealthv1alpha1.PhaseQuarantined: nodes / 3, gpuhealthv1alpha1.PhaseDraining: nodes / 3,
		}))
		g.Expect(got.managed).To(HaveLen(nodes))
	}).Should(Succeed(), "the cache has caught up")

	// A List through the same cache, as a manager's client reads.
	cacheClient, err := client.New(env.Config, client.Options{Scheme: env.Scheme, Cache: &client.CacheOptions{Reader: c}})
	g.Expect(err).NotTo(HaveOccurred())
	listed := &Reconciler{Client: cacheClient}
	sel := labels.SelectorFromSet(labels.Set{"pool": "inplace"})
	want, err := listed.count(ctx, p, sel)
	g.Expect(err).NotTo(HaveOccurred())
	got, err := cached.count(ctx, p, sel)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(got).To(Equal(want), "the same counts either way")

	bytesPerCount := func(r *Reconciler) uint64 {
		const rounds = 20
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		for range rounds {
			if _, err := r.count(ctx, p, sel); err != nil {
				t.Fatal(err)
			}
		}
		runtime.ReadMemStats(&after)
		return (after.TotalAlloc - before.TotalAlloc) / rounds
	}
	inPlace, copied := bytesPerCount(cached), bytesPerCount(listed)
	t.Logf("bytes a count allocates over %d nodes: in place %d, through a List %d", nodes, inPlace, copied)
	g.Expect(inPlace*4).To(BeNumerically("<", copied), "in place allocates a fraction of a List's copies")
}
