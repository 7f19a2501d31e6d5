package nodehealth

import (
	"context"
	"errors"
	"testing"

	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/remediation/drain"
	"github.com/gpuhealth/gpuhealth/remediation/job"
)

// TestObserveWritesNothing drives a node through a whole cycle — first
// sight without a NodeHealth, a finding under a breaker with a reset
// token, the fence, draining with a pod still there, recertifying with a
// finished suite Job — and before every pass runs observe alone with a
// client that fails the test on any write (create, update, patch, delete,
// a status write, an eviction) and a recorder that fails it on any Event.
func TestObserveWritesNothing(t *testing.T) {
	h := newHarness(t)
	p := h.policy(func(s *gpuhealthv1alpha1.RemediationPolicySpec) {
		s.Recertification.Job = jobTemplate()
	})
	p.Annotations = map[string]string{gpuhealthv1alpha1.ResetCircuitBreakerAnnotation: "reset-1"}
	h.g.Expect(k8sClient.Update(h.ctx, p)).To(Succeed())
	n := h.node("a", nil)
	h.pod(n.Name, "trainer-0", nil)

	observeOnly := func(want gpuhealthv1alpha1.NodeHealthPhase) *observation {
		t.Helper()
		client, recorder, drainer := h.r.Client, h.r.Recorder, h.r.Drainer
		h.r.Client = readOnly(t)
		h.r.Recorder = noEvents{t}
		h.r.Drainer = drain.New(readOnly(t), readOnly(t), h.clock, jobNamespace)
		defer func() { h.r.Client, h.r.Recorder, h.r.Drainer = client, recorder, drainer }()
		o, err := h.r.observe(h.ctx, n.Name)
		h.g.Expect(err).NotTo(HaveOccurred())
		h.g.Expect(o).NotTo(BeNil())
		h.g.Expect(o.nh.Status.Phase).To(Equal(want))
		return o
	}

	o := observeOnly("")
	h.g.Expect(o.nhMissing).To(BeTrue(), "observe does not create the NodeHealth")
	h.reconcile(n.Name)
	h.g.Expect(h.phase(n.Name)).To(Equal(healthy), "the pass after observe created it")

	h.fault(n.Name, gpuhealthv1alpha1.CheckXID, "79")
	o = observeOnly(healthy)
	h.g.Expect(o.breaker).NotTo(BeNil(), "a new quarantine peeks at the breaker")
	h.g.Expect(o.breaker.reset).To(Equal("reset-1"), "the reset is seen, and left to the pass")
	h.g.Expect(h.r.Breaker.LastReset(p.Name)).To(BeEmpty(), "observe did not reset the breaker")
	h.reconcile(n.Name)
	h.g.Expect(h.events()).To(ContainElement(HavePrefix("Normal "+gpuhealthv1alpha1.ReasonCircuitBreakerOpen)), "the pass announces the reset")
	h.g.Expect(h.phase(n.Name)).To(Equal(draining))

	o = observeOnly(draining)
	h.g.Expect(o.drains).To(BeTrue())
	h.g.Expect(o.drain).To(BeNil(), "the drain pass is not observe's")
	h.g.Expect(h.playKubelet(n.Name)).To(Equal(1), "the pass, not observe, evicted the pod")
	h.reconcile(n.Name)
	h.g.Expect(h.phase(n.Name)).To(Equal(recertifying))

	recert := h.jobName(job.Recertification, n.Name, 1)
	h.g.Expect(h.jobExists(recert)).To(BeTrue())
	h.finishJob(recert, true)
	observeOnly(recertifying)
	h.reconcile(n.Name)
}

// readOnly is the test's apiserver client with every write failing the
// test.
func readOnly(t *testing.T) client.WithWatch {
	t.Helper()
	fail := func(what string, obj client.Object) error {
		t.Errorf("observe wrote: %s %T %s", what, obj, obj.GetName())
		return errors.New("observe may not write")
	}
	return interceptor.NewClient(k8sClient, interceptor.Funcs{
		Create: func(_ context.Context, _ client.WithWatch, obj client.Object, _ ...client.CreateOption) error {
			return fail("create", obj)
		},
		Update: func(_ context.Context, _ client.WithWatch, obj client.Object, _ ...client.UpdateOption) error {
			return fail("update", obj)
		},
		Patch: func(_ context.Context, _ client.WithWatch, obj client.Object, _ client.Patch, _ ...client.PatchOption) error {
			return fail("patch", obj)
		},
		Delete: func(_ context.Context, _ client.WithWatch, obj client.Object, _ ...client.DeleteOption) error {
			return fail("delete", obj)
		},
		DeleteAllOf: func(_ context.Context, _ client.WithWatch, obj client.Object, _ ...client.DeleteAllOfOption) error {
			return fail("delete all of", obj)
		},
		SubResourceCreate: func(_ context.Context, _ client.Client, sub string, obj, _ client.Object, _ ...client.SubResourceCreateOption) error {
			return fail("create "+sub+" of", obj)
		},
		SubResourceUpdate: func(_ context.Context, _ client.Client, sub string, obj client.Object, _ ...client.SubResourceUpdateOption) error {
			return fail("update "+sub+" of", obj)
		},
		SubResourcePatch: func(_ context.Context, _ client.Client, sub string, obj client.Object, _ client.Patch, _ ...client.SubResourcePatchOption) error {
			return fail("patch "+sub+" of", obj)
		},
	})
}

// noEvents is a recorder that fails the test on any Event.
type noEvents struct{ t *testing.T }

func (r noEvents) Eventf(regarding, _ runtime.Object, eventtype, reason, _, note string, _ ...any) {
	r.t.Errorf("observe published an Event: %s %s on %T: %s", eventtype, reason, regarding, note)
}
