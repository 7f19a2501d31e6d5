package monitor_test

import (
	"context"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/monitors/imex"
)

func TestAgentRBACRefusesWhatItDoesNotNeed(t *testing.T) {
	ctx := context.Background()
	cases := []struct {
		name string
		// do makes the request as the agent on node-a.
		do func(g *WithT, c client.Client) error
		// check, when set, asserts afterwards (as the admin) that nothing changed.
		check func(g *WithT)
	}{
		{
			name: "the agent may not delete an event about its own node",
			do: func(g *WithT, c client.Client) error {
				ev := newEvent(nodeA)
				g.Expect(c.Create(ctx, ev)).To(Succeed())
				t.Cleanup(func() { _ = admin.Delete(context.Background(), ev) })
				err := c.Delete(ctx, ev)
				g.Expect(admin.Get(ctx, client.ObjectKeyFromObject(ev), &gpuhealthv1alpha1.NodeHealthEvent{})).To(Succeed())
				return err
			},
		},
		{
			name: "the agent may not list Pods",
			do: func(_ *WithT, c client.Client) error {
				return c.List(ctx, &corev1.PodList{})
			},
		},
		{
			name: "the agent may not list Pods outside the DRA driver's namespace",
			do: func(_ *WithT, c client.Client) error {
				return c.List(ctx, &corev1.PodList{}, client.InNamespace(monitorNamespace))
			},
		},
		{
			name: "the agent may not patch its own Node",
			do: func(_ *WithT, c client.Client) error {
				n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeA}}
				return c.Patch(ctx, n, client.RawPatch(types.MergePatchType, []byte(`{"spec":{"unschedulable":true}}`)))
			},
			check: func(g *WithT) {
				n := &corev1.Node{}
				g.Expect(admin.Get(ctx, client.ObjectKey{Name: nodeA}, n)).To(Succeed())
				g.Expect(n.Spec.Unschedulable).To(BeFalse())
			},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			err := tc.do(g, monitorA.client)
			g.Expect(err).To(Satisfy(apierrors.IsForbidden), "want Forbidden, got %v", err)
			if tc.check != nil {
				tc.check(g)
			}
		})
	}
}

func TestAgentRBACGrantsExactlyWhatItNeeds(t *testing.T) {
	type attrs = authorizationv1.ResourceAttributes
	group := gpuhealthv1alpha1.GroupVersion.Group
	cases := []struct {
		name    string
		attrs   attrs
		allowed bool
	}{
		{name: "create events", attrs: attrs{Group: group, Resource: "nodehealthevents", Verb: "create"}, allowed: true},
		{name: "get events", attrs: attrs{Group: group, Resource: "nodehealthevents", Verb: "get"}, allowed: true},
		{name: "patch event status", attrs: attrs{Group: group, Resource: "nodehealthevents", Subresource: "status", Verb: "patch"}, allowed: true},
		{name: "no listing of other nodes' events", attrs: attrs{Group: group, Resource: "nodehealthevents", Verb: "list"}},
		{name: "no watching of other nodes' events", attrs: attrs{Group: group, Resource: "nodehealthevents", Verb: "watch"}},
		{name: "no event updates", attrs: attrs{Group: group, Resource: "nodehealthevents", Verb: "update"}},
		{name: "no event patches", attrs: attrs{Group: group, Resource: "nodehealthevents", Verb: "patch"}},
		{name: "no event status updates", attrs: attrs{Group: group, Resource: "nodehealthevents", Subresource: "status", Verb: "update"}},
		{name: "get nodes", attrs: attrs{Resource: "nodes", Verb: "get"}, allowed: true},
		{name: "list nodes", attrs: attrs{Resource: "nodes", Verb: "list"}, allowed: true},
		{name: "watch nodes", attrs: attrs{Resource: "nodes", Verb: "watch"}, allowed: true},
		{name: "no delete of events", attrs: attrs{Group: group, Resource: "nodehealthevents", Verb: "delete"}},
		{name: "no deletecollection of events", attrs: attrs{Group: group, Resource: "nodehealthevents", Verb: "deletecollection"}},
		{name: "no NodeHealth reads", attrs: attrs{Group: group, Resource: "nodehealths", Verb: "get"}},
		{name: "no NodeHealth status writes", attrs: attrs{Group: group, Resource: "nodehealths", Subresource: "status", Verb: "update"}},
		{name: "no RemediationPolicy reads", attrs: attrs{Group: group, Resource: "remediationpolicies", Verb: "list"}},
		{name: "no Node patches", attrs: attrs{Resource: "nodes", Verb: "patch"}},
		{name: "no Node updates", attrs: attrs{Resource: "nodes", Verb: "update"}},
		{name: "no Node status patches", attrs: attrs{Resource: "nodes", Subresource: "status", Verb: "patch"}},
		{name: "no Pod reads", attrs: attrs{Resource: "pods", Verb: "list"}},
		{name: "get daemon pods in the DRA driver's namespace", attrs: attrs{Resource: "pods", Verb: "get", Namespace: driverNamespace}, allowed: true},
		{name: "list daemon pods in the DRA driver's namespace", attrs: attrs{Resource: "pods", Verb: "list", Namespace: driverNamespace}, allowed: true},
		{name: "watch daemon pods in the DRA driver's namespace", attrs: attrs{Resource: "pods", Verb: "watch", Namespace: driverNamespace}, allowed: true},
		{name: "no Pod reads in other namespaces", attrs: attrs{Resource: "pods", Verb: "list", Namespace: "default"}},
		{name: "no Pod reads in its own namespace", attrs: attrs{Resource: "pods", Verb: "get", Namespace: monitorNamespace}},
		{name: "no Pod writes in the DRA driver's namespace", attrs: attrs{Resource: "pods", Verb: "patch", Namespace: driverNamespace}},
		{name: "no Pod deletes in the DRA driver's namespace", attrs: attrs{Resource: "pods", Verb: "delete", Namespace: driverNamespace}},
		{name: "no exec into the daemon pods", attrs: attrs{Resource: "pods", Subresource: "exec", Verb: "create", Namespace: driverNamespace}},
		{name: "no daemon pod logs", attrs: attrs{Resource: "pods", Subresource: "log", Verb: "get", Namespace: driverNamespace}},
		{name: "no ComputeDomain reads", attrs: attrs{Group: "resource.nvidia.com", Resource: "computedomains", Verb: "list"}},
		{name: "no Secret reads in the DRA driver's namespace", attrs: attrs{Resource: "secrets", Verb: "get", Namespace: driverNamespace}},
		{name: "no evictions", attrs: attrs{Resource: "pods", Subresource: "eviction", Verb: "create", Namespace: "default"}},
		{name: "no Secret reads", attrs: attrs{Resource: "secrets", Verb: "get", Namespace: monitorNamespace}},
		{name: "no tokens for other service accounts", attrs: attrs{Resource: "serviceaccounts", Subresource: "token", Verb: "create", Namespace: monitorNamespace}},
		{name: "no Kubernetes Events", attrs: attrs{Group: "events.k8s.io", Resource: "events", Verb: "create", Namespace: monitorNamespace}},
		{name: "no core Events", attrs: attrs{Resource: "events", Verb: "create", Namespace: monitorNamespace}},
		{name: "no Leases", attrs: attrs{Group: "coordination.k8s.io", Resource: "leases", Verb: "create", Namespace: monitorNamespace}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			review, err := monitorA.clientset.AuthorizationV1().SelfSubjectAccessReviews().Create(context.Background(),
				&authorizationv1.SelfSubjectAccessReview{Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &tc.attrs}},
				metav1.CreateOptions{})
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(review.Status.Allowed).To(Equal(tc.allowed), "reason: %q", review.Status.Reason)
		})
	}
}

// With config/monitor/imex applied, the agent's imex source finds its node's
// ComputeDomain daemon pod through the apiserver, with the agent's own
// pod-bound token: the watch it runs needs exactly the Role's grant.
func TestAgentWatchesItsNodesDaemonPods(t *testing.T) {
	g := NewWithT(t)
	ctx := t.Context()
	mkPod := func(name, node, uid string) {
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: driverNamespace, Labels: map[string]string{imex.ComputeDomainLabel: uid}},
			Spec:       corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "compute-domain-daemon", Image: "daemon"}}},
		}
		g.Expect(admin.Create(ctx, p)).To(Succeed())
		t.Cleanup(func() { _ = admin.Delete(context.Background(), p, client.GracePeriodSeconds(0)) })
	}
	mkPod("computedomain-daemon-a", nodeA, "domain-1")
	mkPod("computedomain-daemon-b", nodeB, "domain-1")

	w, err := imex.NewPodWatch(monitorA.config, nodeA, driverNamespace)
	g.Expect(err).NotTo(HaveOccurred())
	w.Start(ctx)
	g.Eventually(func(g Gomega) []string {
		pods, err := w.DaemonPods(ctx)
		g.Expect(err).NotTo(HaveOccurred())
		var names []string
		for _, p := range pods {
			names = append(names, p.Name)
		}
		return names
	}, 10*time.Second).Should(Equal([]string{"computedomain-daemon-a"}), "only its own node's daemon pod")
}
