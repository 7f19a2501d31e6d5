package nodehealth

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"

	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus/testutil"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/remediation/breaker"
	"github.com/gpuhealth/gpuhealth/remediation/job"
)

// watchClient is a client of the test apiserver that interceptor can wrap.
func watchClient() client.WithWatch {
	c, err := client.NewWithWatch(testEnv.Config, client.Options{Scheme: testScheme})
	if err != nil {
		panic(err)
	}
	return c
}

// laggingCache plays an informer cache that has not yet seen the latest
// writes: while frozen, reads of one node's Node, NodeHealth and findings
// return the copies taken at freeze; writes go through to the apiserver.
type laggingCache struct {
	mu       sync.Mutex
	node     *corev1.Node
	nh       *gpuhealthv1alpha1.NodeHealth
	findings []gpuhealthv1alpha1.NodeHealthEvent
}

func (l *laggingCache) freeze(h *harness, node string) {
	h.t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	l.node, l.nh = h.getNode(node), h.nodeHealth(node)
	list := &gpuhealthv1alpha1.NodeHealthEventList{}
	h.g.Expect(k8sClient.List(h.ctx, list, client.MatchingFields{gpuhealthv1alpha1.EventNodeNameField: node})).To(Succeed())
	l.findings = list.Items
}

func (l *laggingCache) thaw() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.node, l.nh, l.findings = nil, nil, nil
}

func (l *laggingCache) client() client.Client {
	return interceptor.NewClient(watchClient(), interceptor.Funcs{
		Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			l.mu.Lock()
			defer l.mu.Unlock()
			switch o := obj.(type) {
			case *corev1.Node:
				if l.node != nil && l.node.Name == key.Name {
					l.node.DeepCopyInto(o)
					return nil
				}
			case *gpuhealthv1alpha1.NodeHealth:
				if l.nh != nil && l.nh.Name == key.Name {
					l.nh.DeepCopyInto(o)
					return nil
				}
			}
			return c.Get(ctx, key, obj, opts...)
		},
		List: func(ctx context.Context, c client.WithWatch, list client.ObjectList, opts ...client.ListOption) error {
			l.mu.Lock()
			defer l.mu.Unlock()
			if el, ok := list.(*gpuhealthv1alpha1.NodeHealthEventList); ok && l.nh != nil {
				lo := (&client.ListOptions{}).ApplyOptions(opts)
				if lo.FieldSelector != nil {
					if v, found := lo.FieldSelector.RequiresExactMatch(gpuhealthv1alpha1.EventNodeNameField); found && v == l.nh.Name {
						el.Items = nil
						for i := range l.findings {
							el.Items = append(el.Items, *l.findings[i].DeepCopy())
						}
						return nil
					}
				}
			}
			return c.List(ctx, list, opts...)
		},
	})
}

// TestALaggingCacheDecidesOnce: the pass after a write reads a cache that
// does not show it yet. It must not decide again: one fence, one breaker
// count, one transition each, one Event each.
func TestALaggingCacheDecidesOnce(t *testing.T) {
	h := newHarness(t)
	lag := &laggingCache{}
	h.r.Client = lag.client()
	p := h.policy(func(s *gpuhealthv1alpha1.RemediationPolicySpec) {
		s.CircuitBreaker.Threshold = ptr.To(intstrFromInt(5))
		s.Budgets.MaxUnavailable = ptr.To(intstrFromInt(5))
	})
	n := h.node("a", nil)
	h.pod(n.Name, "trainer-0", nil)
	h.reconcile(n.Name)
	h.fault(n.Name, gpuhealthv1alpha1.CheckXID, "79")
	settings, err := breaker.SettingsFor(p.Spec.CircuitBreaker, 1)
	h.g.Expect(err).NotTo(HaveOccurred())
	inWindow := func() int { return h.r.Breaker.Peek(p.Name, settings, h.clock.Now()).InWindow }
	counted := func(from, to gpuhealthv1alpha1.NodeHealthPhase, reason string) float64 {
		return testutil.ToFloat64(transitions.WithLabelValues(string(from), string(to), reason))
	}
	quarantines, drains := counted(healthy, quarantined, gpuhealthv1alpha1.ReasonFault), counted(quarantined, draining, gpuhealthv1alpha1.ReasonDraining)
	req := ctrl.Request{NamespacedName: types.NamespacedName{Name: n.Name}}
	pass := func() ctrl.Result {
		t.Helper()
		res, err := h.r.Reconcile(h.ctx, req)
		h.g.Expect(err).NotTo(HaveOccurred())
		return res
	}

	// The fence, then a pass on the cache from before it.
	lag.freeze(h, n.Name)
	pass()
	fencedRV := h.getNode(n.Name).ResourceVersion
	h.g.Expect(inWindow()).To(Equal(1))
	res := pass()
	h.g.Expect(res.RequeueAfter).To(Equal(cacheRetry), "waits for the cache")
	h.g.Expect(h.getNode(n.Name).ResourceVersion).To(Equal(fencedRV), "no second fence")
	h.g.Expect(inWindow()).To(Equal(1), "no second breaker count")

	// The cache catches up: the write-up (Quarantined, and Draining as the
	// budget allows), then a pass on a cache whose NodeHealth is from before it.
	lag.thaw()
	stale := h.nodeHealth(n.Name)
	pass()
	h.g.Expect(h.phase(n.Name)).To(Equal(draining))
	h.g.Expect(h.events()).To(ConsistOf(
		HavePrefix("Warning "+gpuhealthv1alpha1.ReasonFault+" Healthy → Quarantined"),
		HavePrefix("Warning "+gpuhealthv1alpha1.ReasonDraining+" Quarantined → Draining")))
	lag.freeze(h, n.Name)
	lag.nh = stale
	res = pass()
	h.g.Expect(res.RequeueAfter).To(Equal(cacheRetry), "waits for the cache")
	lag.thaw()
	pass()

	h.g.Expect(counted(healthy, quarantined, gpuhealthv1alpha1.ReasonFault)-quarantines).To(BeEquivalentTo(1), "one quarantine")
	h.g.Expect(counted(quarantined, draining, gpuhealthv1alpha1.ReasonDraining)-drains).To(BeEquivalentTo(1), "one drain")
	h.g.Expect(inWindow()).To(Equal(1), "one breaker count")
	h.g.Expect(h.events()).To(BeEmpty(), "each transition published once")
	h.g.Expect(historyPhases(h.nodeHealth(n.Name))).To(Equal([]gpuhealthv1alpha1.NodeHealthPhase{healthy, quarantined, draining}))
}

// TestFenceConflictIsNotCounted: a fence that meets a conflict is not
// counted by the breaker; the retry counts it once.
func TestFenceConflictIsNotCounted(t *testing.T) {
	h := newHarness(t)
	conflicts := 1
	h.r.Client = interceptor.NewClient(watchClient(), interceptor.Funcs{
		Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
			if _, ok := obj.(*corev1.Node); ok && conflicts > 0 {
				conflicts--
				return apierrors.NewConflict(corev1.Resource("nodes"), obj.GetName(), nil)
			}
			return c.Patch(ctx, obj, patch, opts...)
		},
	})
	p := h.policy(nil)
	n := h.node("a", nil)
	h.reconcile(n.Name)
	h.fault(n.Name, gpuhealthv1alpha1.CheckXID, "79")
	settings, err := breaker.SettingsFor(p.Spec.CircuitBreaker, 1)
	h.g.Expect(err).NotTo(HaveOccurred())
	res := h.reconcileOnce(n.Name)
	h.g.Expect(res.RequeueAfter).To(Equal(conflictRetry))
	h.g.Expect(h.r.Breaker.Peek(p.Name, settings, h.clock.Now()).InWindow).To(Equal(0), "a fence that failed is no quarantine")
	h.reconcile(n.Name)
	h.g.Expect(h.getNode(n.Name).Spec.Unschedulable).To(BeTrue())
	h.g.Expect(h.r.Breaker.Peek(p.Name, settings, h.clock.Now()).InWindow).To(Equal(1))
}

// TestStatusConflictPublishesNothing: a status write that meets a conflict
// publishes no Event and counts no transition; the retry does, once.
func TestStatusConflictPublishesNothing(t *testing.T) {
	h := newHarness(t)
	conflicts := 1
	h.r.Client = interceptor.NewClient(watchClient(), interceptor.Funcs{
		SubResourcePatch: func(ctx context.Context, c client.Client, sub string, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
			if nh, ok := obj.(*gpuhealthv1alpha1.NodeHealth); ok && nh.Status.Phase != healthy && conflicts > 0 {
				conflicts--
				return apierrors.NewConflict(gpuhealthv1alpha1.GroupVersion.WithResource("nodehealths").GroupResource(), obj.GetName(), nil)
			}
			return c.SubResource(sub).Patch(ctx, obj, patch, opts...)
		},
	})
	h.policy(nil)
	n := h.node("a", nil)
	h.reconcile(n.Name)
	h.fault(n.Name, gpuhealthv1alpha1.CheckXID, "79")
	h.reconcileOnce(n.Name) // the fence
	res := h.reconcileOnce(n.Name)
	h.g.Expect(res.RequeueAfter).To(Equal(conflictRetry))
	h.g.Expect(h.events()).To(BeEmpty(), "nothing published for a write that did not happen")
	h.reconcile(n.Name)
	h.g.Expect(h.events()).To(ContainElement(HavePrefix("Warning " + gpuhealthv1alpha1.ReasonFault)))
	h.g.Expect(historyPhases(h.nodeHealth(n.Name))).To(Equal([]gpuhealthv1alpha1.NodeHealthPhase{healthy, quarantined, draining, recertifying}), "each once")
}

// TestJobAlreadyExistsIsNotAnError: a cache that does not show the Job an
// earlier pass created makes the pass create it again; AlreadyExists is
// no error and no second Job.
func TestJobAlreadyExistsIsNotAnError(t *testing.T) {
	h := newHarness(t)
	var hidden atomic.Bool
	var exists atomic.Int32
	h.r.Client = interceptor.NewClient(watchClient(), interceptor.Funcs{
		Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			if _, ok := obj.(*batchv1.Job); ok && hidden.Load() {
				return apierrors.NewNotFound(batchv1.Resource("jobs"), key.Name)
			}
			return c.Get(ctx, key, obj, opts...)
		},
		List: func(ctx context.Context, c client.WithWatch, list client.ObjectList, opts ...client.ListOption) error {
			if _, ok := list.(*batchv1.JobList); ok && hidden.Load() {
				return nil
			}
			return c.List(ctx, list, opts...)
		},
		Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			err := c.Create(ctx, obj, opts...)
			if apierrors.IsAlreadyExists(err) {
				exists.Add(1)
			}
			return err
		},
	})
	h.policy(func(s *gpuhealthv1alpha1.RemediationPolicySpec) { s.Recertification.Job = jobTemplate() })
	n := h.node("a", nil)
	h.reconcile(n.Name)
	h.fault(n.Name, gpuhealthv1alpha1.CheckXID, "79")
	h.reconcile(n.Name)
	h.g.Expect(h.phase(n.Name)).To(Equal(recertifying))
	name := h.jobName(job.Recertification, n.Name, 1)
	h.g.Expect(h.jobExists(name)).To(BeTrue())
	hidden.Store(true)
	h.reconcile(n.Name)
	h.g.Expect(exists.Load()).To(BeNumerically(">=", 1), "the create met AlreadyExists")
	list := &batchv1.JobList{}
	h.g.Expect(k8sClient.List(h.ctx, list, client.InNamespace(jobNamespace), client.MatchingLabels{job.NodeLabel: n.Name})).To(Succeed())
	h.g.Expect(list.Items).To(HaveLen(1))
	h.g.Expect(h.phase(n.Name)).To(Equal(recertifying))
}
