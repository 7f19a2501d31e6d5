package nodehealth

import (
	"context"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus/testutil"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
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
	h.handOffAs(machineRules)
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
			h.handOffAs(machineRules)
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

// repairGroup is the API group of the stand-in repair request kinds.
const repairGroup = "repair.gpuhealth.test"

var (
	repairRequests = schema.GroupResource{Group: repairGroup, Resource: "repairrequests"}
	repairTickets  = schema.GroupResource{Group: repairGroup, Resource: "repairtickets"}
	// machineRules is what the chart grants the hand-off for type ClusterAPI.
	machineRules = []rbacv1.PolicyRule{{APIGroups: []string{"cluster.x-k8s.io"}, Resources: []string{"machines"}, Verbs: []string{"get", "patch"}}}
)

// repairCRD stands in for a provider's repair request kinds, version v1.
func repairCRD(kind, plural string) *unstructured.Unstructured {
	crd := machineCRD()
	crd.Object["spec"].(map[string]any)["versions"].([]any)[0].(map[string]any)["name"] = "v1"
	crd.SetName(plural + "." + repairGroup)
	crd.Object["spec"].(map[string]any)["group"] = repairGroup
	crd.Object["spec"].(map[string]any)["names"] = map[string]any{"plural": plural, "singular": strings.ToLower(kind), "kind": kind}
	return crd
}

// handOffAs makes the harness's hand-off act as the chart sets it up: as
// the gpuhealth-handoff ServiceAccount, impersonated, holding rules (as
// operator.handOff binds them), and allowed to create resources (as the
// chart passes --handoff-resources). The stand-in CRDs are installed.
func (h *harness) handOffAs(rules []rbacv1.PolicyRule, resources ...schema.GroupResource) {
	h.t.Helper()
	for _, crd := range []*unstructured.Unstructured{machineCRD(), repairCRD("RepairRequest", "repairrequests"), repairCRD("RepairTicket", "repairtickets")} {
		h.g.Expect(client.IgnoreAlreadyExists(k8sClient.Create(h.ctx, crd))).To(Succeed())
		h.g.Eventually(func(g Gomega) []any {
			got := crd.DeepCopy()
			g.Expect(k8sClient.Get(h.ctx, client.ObjectKeyFromObject(crd), got)).To(Succeed())
			conds, _, _ := unstructured.NestedSlice(got.Object, "status", "conditions")
			return conds
		}).WithTimeout(20*time.Second).Should(ContainElement(HaveKeyWithValue("type", "Established")), "the CRD is established")
	}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: handoff.ServiceAccount, Namespace: jobNamespace}}
	h.g.Expect(client.IgnoreAlreadyExists(k8sClient.Create(h.ctx, sa))).To(Succeed())
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: h.label + "-handoff"}, Rules: rules}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: h.label + "-handoff"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: handoff.ServiceAccount, Namespace: jobNamespace}},
	}
	for _, o := range []client.Object{role, binding} {
		h.g.Expect(k8sClient.Create(h.ctx, o)).To(Succeed())
		h.t.Cleanup(func() { _ = k8sClient.Delete(context.Background(), o) })
	}
	c, err := handoff.NewClient(testEnv.Config, client.Options{Scheme: testScheme}, jobNamespace, handoff.ServiceAccount)
	h.g.Expect(err).NotTo(HaveOccurred())
	h.r.HandOff, h.r.HandOffResources = client.WithFieldOwner(c, FieldManager), resources
	// The apiserver's RBAC authorizer learns of the binding from a watch:
	// wait until it answers for the service account as it will.
	for _, rule := range rules {
		review := &authorizationv1.SelfSubjectAccessReview{Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &authorizationv1.ResourceAttributes{
			Namespace: h.label, Verb: rule.Verbs[0], Group: rule.APIGroups[0], Resource: rule.Resources[0],
		}}}
		h.g.Eventually(func(g Gomega) bool {
			r := review.DeepCopy()
			g.Expect(c.Create(h.ctx, r)).To(Succeed())
			return r.Status.Allowed
		}).WithTimeout(20 * time.Second).Should(BeTrue())
	}
}

// failForReplacement takes a node of the harness's policy through a
// ReplaceNode finding to Failed, where it is handed off.
func (h *harness) failForReplacement(n *corev1.Node) *gpuhealthv1alpha1.NodeHealth {
	h.t.Helper()
	h.reconcile(n.Name)
	h.fault(n.Name, gpuhealthv1alpha1.CheckXID, "79")
	h.clock.Step(time.Second)
	h.reconcile(n.Name)
	nh := h.nodeHealth(n.Name)
	h.g.Expect(nh.Status.Phase).To(Equal(failed))
	h.g.Expect(nh.Status.HandOff).NotTo(BeNil())
	return nh
}

// replaceRule is a rule whose finding needs the node replaced.
var replaceRule = gpuhealthv1alpha1.Rule{Name: "replace", Match: gpuhealthv1alpha1.RuleMatch{Codes: []string{"79"}},
	Verdict: gpuhealthv1alpha1.VerdictQuarantine, Action: gpuhealthv1alpha1.ActionReplaceNode}

// repairTemplate is a template of kind (RepairRequest or RepairTicket) in namespace.
func repairTemplate(kind, namespace string) *runtime.RawExtension {
	return &runtime.RawExtension{Raw: []byte(`{"apiVersion":"` + repairGroup + `/v1","kind":"` + kind + `","metadata":{"name":"repair-{{.NodeName}}","namespace":"` +
		namespace + `"},"spec":{"node":"{{.NodeName}}","reason":"{{.Reason}}"}}`)}
}

// TestTemplateHandOff: against a real apiserver and as the hand-off's own
// service account, a template that cannot be created (its namespace does
// not exist) is found out by a dry run and recorded as a failed hand-off,
// once; retried under a template that can, the object is created with the
// node's name and reason, owned by the NodeHealth, and its status is
// shown; returned, the object is taken back.
func TestTemplateHandOff(t *testing.T) {
	h := newHarness(t)
	h.handOffAs([]rbacv1.PolicyRule{{APIGroups: []string{repairGroup}, Resources: []string{"repairrequests"}, Verbs: []string{"get", "create", "delete"}}}, repairRequests)
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: h.label}}
	h.g.Expect(k8sClient.Create(h.ctx, ns)).To(Succeed())
	t.Cleanup(func() { _ = k8sClient.Delete(context.Background(), ns) })
	p := h.policy(func(s *gpuhealthv1alpha1.RemediationPolicySpec) {
		s.Remediation.HandOff = &gpuhealthv1alpha1.HandOffSpec{Type: gpuhealthv1alpha1.HandOffTemplate, Template: repairTemplate("RepairRequest", "no-such-namespace")}
		s.Rules = []gpuhealthv1alpha1.Rule{replaceRule}
	})
	n := h.node("a", nil)
	nh := h.failForReplacement(n)
	h.g.Expect(nh.Status.HandOff.State).To(Equal(gpuhealthv1alpha1.HandOffFailed))
	h.g.Expect(nh.Status.HandOff.Message).To(ContainSubstring("no-such-namespace"))
	history := len(nh.Status.History)
	h.reconcile(n.Name)
	h.g.Expect(h.nodeHealth(n.Name).Status.History).To(HaveLen(history), "recorded once")

	h.g.Expect(k8sClient.Get(h.ctx, client.ObjectKeyFromObject(p), p)).To(Succeed())
	p.Spec.Remediation.HandOff.Template = repairTemplate("RepairRequest", h.label)
	h.g.Expect(k8sClient.Update(h.ctx, p)).To(Succeed())
	nh = h.nodeHealth(n.Name)
	nh.Spec.Request = &gpuhealthv1alpha1.ManualRequest{Action: gpuhealthv1alpha1.RequestRecertify, ID: "again"}
	h.g.Expect(k8sClient.Update(h.ctx, nh)).To(Succeed())
	h.clock.Step(time.Minute)
	h.reconcile(n.Name)
	nh = h.nodeHealth(n.Name)
	h.g.Expect(nh.Status.Phase).To(Equal(failed))
	h.g.Expect(nh.Status.HandOff.State).To(Equal(gpuhealthv1alpha1.HandOffDone), nh.Status.HandOff.Message)
	h.g.Expect(nh.Status.HandOff.Target).To(Equal("RepairRequest " + h.label + "/repair-" + n.Name))
	rr := &unstructured.Unstructured{}
	rr.SetGroupVersionKind(repairRequests.WithVersion("v1").GroupVersion().WithKind("RepairRequest"))
	h.g.Expect(k8sClient.Get(h.ctx, client.ObjectKey{Namespace: h.label, Name: "repair-" + n.Name}, rr)).To(Succeed())
	h.g.Expect(rr.Object["spec"]).To(Equal(map[string]any{"node": n.Name, "reason": "ReplaceNode"}))
	h.g.Expect(rr.GetOwnerReferences()).To(HaveLen(1))
	h.g.Expect(rr.GetOwnerReferences()[0].Kind).To(Equal("NodeHealth"))
	h.g.Expect(rr.GetOwnerReferences()[0].UID).To(Equal(nh.UID))
	// The target is recorded whole, its UID once it exists.
	h.clock.Step(time.Minute)
	h.reconcile(n.Name)
	nh = h.nodeHealth(n.Name)
	h.g.Expect(nh.Status.HandOff.TargetRef).To(Equal(&gpuhealthv1alpha1.HandOffRef{
		APIVersion: repairGroup + "/v1", Kind: "RepairRequest", Namespace: h.label, Name: "repair-" + n.Name, UID: rr.GetUID(),
	}))

	// The policy's template changes while the node is handed off (another
	// kind, which the install does not even allow): taking the hand-off
	// back still deletes exactly the RepairRequest it made.
	h.g.Expect(k8sClient.Get(h.ctx, client.ObjectKeyFromObject(p), p)).To(Succeed())
	p.Spec.Remediation.HandOff.Template = repairTemplate("RepairTicket", h.label)
	h.g.Expect(k8sClient.Update(h.ctx, p)).To(Succeed())

	nh.Spec.Request = &gpuhealthv1alpha1.ManualRequest{Action: gpuhealthv1alpha1.RequestRelease, ID: "replaced", Reason: "new tray"}
	h.g.Expect(k8sClient.Update(h.ctx, nh)).To(Succeed())
	h.reconcile(n.Name)
	h.g.Expect(h.nodeHealth(n.Name).Status.Phase).To(Equal(healthy))
	h.g.Expect(apierrors.IsNotFound(k8sClient.Get(h.ctx, client.ObjectKeyFromObject(rr), rr.DeepCopy()))).To(BeTrue(), "taken back on return, by what was recorded")
}

// TestTemplateHandOffRefused: a template the install does not allow, or
// that the hand-off's service account may not create, fails the hand-off
// with the reason, and nothing is created.
func TestTemplateHandOffRefused(t *testing.T) {
	both := []rbacv1.PolicyRule{{APIGroups: []string{repairGroup}, Resources: []string{"repairrequests", "repairtickets"}, Verbs: []string{"get", "create", "delete"}}}
	ticketsReadOnly := []rbacv1.PolicyRule{{APIGroups: []string{repairGroup}, Resources: []string{"repairtickets"}, Verbs: []string{"get"}}}
	for _, tc := range []struct {
		name      string
		rules     []rbacv1.PolicyRule
		allowed   []schema.GroupResource
		kind      string
		namespace string // empty: the test's own
		want      string
	}{
		{name: "a kind the install does not list, though RBAC would allow it", rules: both, allowed: []schema.GroupResource{repairRequests},
			kind: "RepairTicket", want: "resource repairtickets." + repairGroup + " is not among those the install allows a hand-off to create"},
		{name: "a listed kind in the operator's namespace", rules: both, allowed: []schema.GroupResource{repairRequests, repairTickets},
			kind: "RepairRequest", namespace: jobNamespace, want: "never creates objects in the operator's namespace " + jobNamespace},
		{name: "a listed kind the hand-off's service account may not create", rules: ticketsReadOnly, allowed: []schema.GroupResource{repairRequests, repairTickets},
			kind: "RepairTicket", want: `User "system:serviceaccount:` + jobNamespace + `:` + handoff.ServiceAccount + `" cannot create resource "repairtickets"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			h.handOffAs(tc.rules, tc.allowed...)
			ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: h.label}}
			h.g.Expect(k8sClient.Create(h.ctx, ns)).To(Succeed())
			t.Cleanup(func() { _ = k8sClient.Delete(context.Background(), ns) })
			namespace := tc.namespace
			if namespace == "" {
				namespace = h.label
			}
			h.policy(func(s *gpuhealthv1alpha1.RemediationPolicySpec) {
				s.Remediation.HandOff = &gpuhealthv1alpha1.HandOffSpec{Type: gpuhealthv1alpha1.HandOffTemplate, Template: repairTemplate(tc.kind, namespace)}
				s.Rules = []gpuhealthv1alpha1.Rule{replaceRule}
			})
			n := h.node("a", nil)
			nh := h.failForReplacement(n)
			h.g.Expect(nh.Status.HandOff.State).To(Equal(gpuhealthv1alpha1.HandOffFailed))
			h.g.Expect(nh.Status.HandOff.Message).To(ContainSubstring(tc.want))
			h.g.Expect(h.events()).To(ContainElement(ContainSubstring(gpuhealthv1alpha1.ReasonHandOffFailed)))

			got := &unstructured.UnstructuredList{}
			got.SetAPIVersion(repairGroup + "/v1")
			got.SetKind(tc.kind + "List")
			h.g.Expect(k8sClient.List(h.ctx, got)).To(Succeed())
			h.g.Expect(got.Items).To(BeEmpty(), "nothing created")
		})
	}
}
