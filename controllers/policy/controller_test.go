package policy

import (
	"context"
	"os"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/hack/testenv"
)

var k8sClient client.Client

func TestMain(m *testing.M) {
	os.Exit(testenv.Main(m, func(e *testenv.Env) error {
		k8sClient = e.Client
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
	r := &Reconciler{Client: k8sClient, Clock: clocktesting.NewFakeClock(since.Time)}
	_, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: types.NamespacedName{Name: p.Name}})
	g.Expect(err).NotTo(HaveOccurred())

	got := &gpuhealthv1alpha1.RemediationPolicy{}
	g.Expect(k8sClient.Get(ctx, types.NamespacedName{Name: p.Name}, got)).To(Succeed())
	g.Expect(got.Status.ManagedNodes).To(BeEquivalentTo(3))
	g.Expect(got.Status.Phases).To(Equal(map[gpuhealthv1alpha1.NodeHealthPhase]int32{"Healthy": 2, "Draining": 1}))
	g.Expect(got.Status.ObservedGeneration).To(Equal(got.Generation))
	g.Expect(got.Status.Conditions).To(ContainElement(HaveField("Reason", ReasonValid)))
	g.Expect(got.Status.CircuitBreaker.State).To(Equal(gpuhealthv1alpha1.BreakerOpen), "the breaker's state is not ours to write")
}

func TestCountsAtMostOncePerInterval(t *testing.T) {
	g := NewWithT(t)
	r := &Reconciler{MinInterval: time.Hour}
	g.Expect(r.throttle("a")).To(BeZero(), "the first count goes ahead")
	g.Expect(r.throttle("a")).To(BeNumerically(">", 59*time.Minute), "the next waits out the interval")
	g.Expect(r.throttle("b")).To(BeZero(), "per policy")
	r.counted["a"] = time.Now().Add(-time.Hour)
	g.Expect(r.throttle("a")).To(BeZero(), "after the interval it goes ahead again")
}
