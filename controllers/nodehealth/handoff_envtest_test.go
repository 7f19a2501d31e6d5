package nodehealth

import (
	"context"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/remediation/handoff"
)

// machineCRD stands in for Cluster API's Machine CRD: the group, kind and
// a served version, any content.
func machineCRD() *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
		"metadata": map[string]any{"name": "machines.cluster.x-k8s.io"},
		"spec": map[string]any{
			"group": "cluster.x-k8s.io", "scope": "Namespaced",
			"names": map[string]any{"plural": "machines", "singular": "machine", "kind": "Machine"},
			"versions": []any{map[string]any{
				"name": "v1beta1", "served": true, "storage": true,
				"schema": map[string]any{"openAPIV3Schema": map[string]any{"type": "object", "x-kubernetes-preserve-unknown-fields": true}},
			}},
		},
	}}
}

// TestReplaceNodeHandedOffToClusterAPI: against a real apiserver, a
// finding whose action is ReplaceNode drains the node to Failed, and the
// next pass annotates its Machine once; the GPUHealthy condition's
// lastTransitionTime stays where it was when the node left service while
// its reason and message follow the phases; returned, the hand-off goes.
func TestReplaceNodeHandedOffToClusterAPI(t *testing.T) {
	h := newHarness(t)
	crd := machineCRD()
	h.g.Expect(client.IgnoreAlreadyExists(k8sClient.Create(h.ctx, crd))).To(Succeed())
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: h.label}}
	h.g.Expect(k8sClient.Create(h.ctx, ns)).To(Succeed())
	t.Cleanup(func() { _ = k8sClient.Delete(context.Background(), ns) })

	h.policy(func(s *gpuhealthv1alpha1.RemediationPolicySpec) {
		s.Remediation.HandOff = &gpuhealthv1alpha1.HandOffSpec{Type: gpuhealthv1alpha1.HandOffClusterAPI}
		s.Rules = []gpuhealthv1alpha1.Rule{{Name: "replace", Match: gpuhealthv1alpha1.RuleMatch{Codes: []string{"79"}},
			Verdict: gpuhealthv1alpha1.VerdictQuarantine, Action: gpuhealthv1alpha1.ActionReplaceNode}}
	})
	n := h.node("a", func(n *corev1.Node) {
		n.Annotations = map[string]string{handoff.MachineAnnotation: "md-0-x", handoff.ClusterNamespaceAnnotation: h.label}
	})
	m := h.machine("md-0-x", n.Name, n.UID)
	h.reconcile(n.Name)
	h.fault(n.Name, gpuhealthv1alpha1.CheckXID, "79")
	h.clock.Step(time.Second)
	h.reconcileOnce(n.Name) // the fence
	h.clock.Step(time.Second)
	h.reconcileOnce(n.Name) // Quarantined → Draining
	cond := func() corev1.NodeCondition {
		for _, c := range h.getNode(n.Name).Status.Conditions {
			if c.Type == gpuhealthv1alpha1.GPUHealthyNodeCondition {
				return c
			}
		}
		return corev1.NodeCondition{}
	}
	first := cond()
	h.g.Expect(first.Status).To(Equal(corev1.ConditionFalse))
	h.clock.Step(time.Minute)
	before := testutil.ToFloat64(handOffs.WithLabelValues(string(gpuhealthv1alpha1.HandOffClusterAPI), string(gpuhealthv1alpha1.HandOffDone)))
	h.reconcile(n.Name)
	nh := h.nodeHealth(n.Name)
	h.g.Expect(nh.Status.Phase).To(Equal(failed))
	hs := nh.Status.HandOff
	h.g.Expect(hs).NotTo(BeNil())
	h.g.Expect([]string{string(hs.State), hs.Reason, hs.Target}).To(Equal([]string{"HandedOff", "ReplaceNode", "Machine " + h.label + "/md-0-x"}))
	h.g.Expect(nh.Status.Outage.Action).To(Equal(gpuhealthv1alpha1.ActionReplaceNode))
	h.g.Expect(nh.Status.Outage.FailedAt).NotTo(BeNil())
	h.g.Expect(testutil.ToFloat64(handOffs.WithLabelValues(string(gpuhealthv1alpha1.HandOffClusterAPI), string(gpuhealthv1alpha1.HandOffDone)))).To(Equal(before + 1))

	got := m.DeepCopy()
	h.g.Expect(k8sClient.Get(h.ctx, client.ObjectKeyFromObject(m), got)).To(Succeed())
	h.g.Expect(got.GetAnnotations()).To(HaveKeyWithValue(handoff.RemediateMachineAnnotation, ""))
	h.g.Expect(got.GetAnnotations()).To(HaveKeyWithValue(handoff.RequestedAnnotation, "ReplaceNode"))

	now := cond()
	h.g.Expect(now.Reason+now.Message).NotTo(Equal(first.Reason+first.Message), "the condition follows the phases")
	h.g.Expect(now.LastTransitionTime).To(Equal(first.LastTransitionTime), "but its lastTransitionTime does not move")

	history := len(nh.Status.History)
	h.clock.Step(time.Minute)
	h.reconcile(n.Name)
	h.g.Expect(h.nodeHealth(n.Name).Status.History).To(HaveLen(history), "handed off once")

	nh = h.nodeHealth(n.Name)
	nh.Spec.Request = &gpuhealthv1alpha1.ManualRequest{Action: gpuhealthv1alpha1.RequestRelease, ID: "replaced", Reason: "new tray"}
	h.g.Expect(k8sClient.Update(h.ctx, nh)).To(Succeed())
	h.reconcile(n.Name)
	nh = h.nodeHealth(n.Name)
	h.g.Expect(nh.Status.Phase).To(Equal(healthy))
	h.g.Expect(nh.Status.HandOff).To(BeNil())
	h.g.Expect(nh.Status.Outage).To(BeNil())
}

// machine creates a stand-in Cluster API Machine in the namespace named
// after the test, whose status.nodeRef names node (and its UID when set),
// as Cluster API's Machine controller writes it.
func (h *harness) machine(name, node string, uid types.UID) *unstructured.Unstructured {
	h.t.Helper()
	m := &unstructured.Unstructured{}
	m.SetAPIVersion("cluster.x-k8s.io/v1beta1")
	m.SetKind("Machine")
	m.SetNamespace(h.label)
	m.SetName(name)
	nodeRef := map[string]any{"kind": "Node", "name": node}
	if uid != "" {
		nodeRef["uid"] = string(uid)
	}
	// The stand-in CRD has no status subresource: status is written with the object.
	m.Object["status"] = map[string]any{"nodeRef": nodeRef}
	h.g.Eventually(func() error { return k8sClient.Create(h.ctx, m) }).WithTimeout(20*time.Second).Should(Succeed(), "the CRD is established")
	return m
}

// TestClusterAPIHandOffNeedsTheMachinesNodeRef: a node whose annotations
// name a Machine that Cluster API says is another node's (status.nodeRef),
// or an earlier node's of the same name (its UID), or no node's, does not
// get that Machine replaced: the hand-off fails, saying why, and the
// Machine is not annotated.
func TestClusterAPIHandOffNeedsTheMachinesNodeRef(t *testing.T) {
	for _, tc := range []struct {
		name    string
		nodeRef func(n *corev1.Node) (string, types.UID)
		want    string
	}{
		{name: "another node's", nodeRef: func(*corev1.Node) (string, types.UID) { return "someone-else", "" }, want: "is node someone-else's (status.nodeRef)"},
		{name: "an earlier node's", nodeRef: func(n *corev1.Node) (string, types.UID) { return n.Name, "0000-old" }, want: "earlier node"},
		{name: "no node's", nodeRef: func(*corev1.Node) (string, types.UID) { return "", "" }, want: "has no status.nodeRef.name"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			h.g.Expect(client.IgnoreAlreadyExists(k8sClient.Create(h.ctx, machineCRD()))).To(Succeed())
			ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: h.label}}
			h.g.Expect(k8sClient.Create(h.ctx, ns)).To(Succeed())
			t.Cleanup(func() { _ = k8sClient.Delete(context.Background(), ns) })
			h.policy(func(s *gpuhealthv1alpha1.RemediationPolicySpec) {
				s.Remediation.HandOff = &gpuhealthv1alpha1.HandOffSpec{Type: gpuhealthv1alpha1.HandOffClusterAPI}
				s.Rules = []gpuhealthv1alpha1.Rule{{Name: "replace", Match: gpuhealthv1alpha1.RuleMatch{Codes: []string{"79"}},
					Verdict: gpuhealthv1alpha1.VerdictQuarantine, Action: gpuhealthv1alpha1.ActionReplaceNode}}
			})
			n := h.node("a", func(n *corev1.Node) {
				n.Annotations = map[string]string{handoff.MachineAnnotation: "victim", handoff.ClusterNamespaceAnnotation: h.label}
			})
			node, uid := tc.nodeRef(n)
			m := h.machine("victim", node, uid)
			if node == "" {
				m.Object["status"] = map[string]any{}
				h.g.Expect(k8sClient.Update(h.ctx, m)).To(Succeed())
			}
			h.reconcile(n.Name)
			h.fault(n.Name, gpuhealthv1alpha1.CheckXID, "79")
			h.clock.Step(time.Second)
			h.reconcile(n.Name)
			h.clock.Step(time.Minute)
			h.reconcile(n.Name)

			nh := h.nodeHealth(n.Name)
			h.g.Expect(nh.Status.Phase).To(Equal(failed))
			h.g.Expect(nh.Status.HandOff).NotTo(BeNil())
			h.g.Expect(nh.Status.HandOff.State).To(Equal(gpuhealthv1alpha1.HandOffFailed))
			h.g.Expect(nh.Status.HandOff.Message).To(ContainSubstring(tc.want))
			got := m.DeepCopy()
			h.g.Expect(k8sClient.Get(h.ctx, client.ObjectKeyFromObject(m), got)).To(Succeed())
			h.g.Expect(got.GetAnnotations()).NotTo(HaveKey(handoff.RemediateMachineAnnotation))
			h.g.Expect(got.GetAnnotations()).NotTo(HaveKey(handoff.RequestedAnnotation))
		})
	}
}

// TestTemplateHandOff: against a real apiserver, a template that cannot be
// created (its namespace does not exist) is found out by a dry run and
// recorded as a failed hand-off, once; retried under a template that can,
// the object is created with the node's name and reason, owned by the
// NodeHealth, and its status is shown.
func TestTemplateHandOff(t *testing.T) {
	h := newHarness(t)
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: h.label}}
	h.g.Expect(k8sClient.Create(h.ctx, ns)).To(Succeed())
	t.Cleanup(func() { _ = k8sClient.Delete(context.Background(), ns) })
	template := func(namespace string) *runtime.RawExtension {
		return &runtime.RawExtension{Raw: []byte(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"repair-{{.NodeName}}","namespace":"` +
			namespace + `"},"data":{"node":"{{.NodeName}}","reason":"{{.Reason}}"}}`)}
	}
	p := h.policy(func(s *gpuhealthv1alpha1.RemediationPolicySpec) {
		s.Remediation.HandOff = &gpuhealthv1alpha1.HandOffSpec{Type: gpuhealthv1alpha1.HandOffTemplate, Template: template("no-such-namespace")}
		s.Rules = []gpuhealthv1alpha1.Rule{{Name: "replace", Match: gpuhealthv1alpha1.RuleMatch{Codes: []string{"79"}},
			Verdict: gpuhealthv1alpha1.VerdictQuarantine, Action: gpuhealthv1alpha1.ActionReplaceNode}}
	})
	n := h.node("a", nil)
	h.reconcile(n.Name)
	h.fault(n.Name, gpuhealthv1alpha1.CheckXID, "79")
	h.clock.Step(time.Second)
	h.reconcile(n.Name)
	nh := h.nodeHealth(n.Name)
	h.g.Expect(nh.Status.Phase).To(Equal(failed))
	h.g.Expect(nh.Status.HandOff).NotTo(BeNil())
	h.g.Expect(nh.Status.HandOff.State).To(Equal(gpuhealthv1alpha1.HandOffFailed))
	h.g.Expect(nh.Status.HandOff.Message).To(ContainSubstring("no-such-namespace"))
	history := len(nh.Status.History)
	h.reconcile(n.Name)
	h.g.Expect(h.nodeHealth(n.Name).Status.History).To(HaveLen(history), "recorded once")

	h.g.Expect(k8sClient.Get(h.ctx, client.ObjectKeyFromObject(p), p)).To(Succeed())
	p.Spec.Remediation.HandOff.Template = template(h.label)
	h.g.Expect(k8sClient.Update(h.ctx, p)).To(Succeed())
	nh = h.nodeHealth(n.Name)
	nh.Spec.Request = &gpuhealthv1alpha1.ManualRequest{Action: gpuhealthv1alpha1.RequestRecertify, ID: "again"}
	h.g.Expect(k8sClient.Update(h.ctx, nh)).To(Succeed())
	h.clock.Step(time.Minute)
	h.reconcile(n.Name)
	nh = h.nodeHealth(n.Name)
	h.g.Expect(nh.Status.Phase).To(Equal(failed))
	h.g.Expect(nh.Status.HandOff.State).To(Equal(gpuhealthv1alpha1.HandOffDone))
	h.g.Expect(nh.Status.HandOff.Target).To(Equal("ConfigMap " + h.label + "/repair-" + n.Name))
	cm := &corev1.ConfigMap{}
	h.g.Expect(k8sClient.Get(h.ctx, client.ObjectKey{Namespace: h.label, Name: "repair-" + n.Name}, cm)).To(Succeed())
	h.g.Expect(cm.Data).To(Equal(map[string]string{"node": n.Name, "reason": "ReplaceNode"}))
	h.g.Expect(cm.OwnerReferences).To(HaveLen(1))
	h.g.Expect(cm.OwnerReferences[0].Kind).To(Equal("NodeHealth"))
	h.g.Expect(cm.OwnerReferences[0].UID).To(Equal(nh.UID))
}
