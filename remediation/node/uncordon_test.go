package node_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/strategicpatch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/gpuhealth/gpuhealth/remediation/node"
)

// operator is the field manager gpuhealth writes the node with in these tests.
const operator = "gpuhealth-operator"

// nextSecond sleeps into the next whole second: managedFields times have
// whole seconds, and each step of these tests must have its own.
func nextSecond() {
	now := time.Now()
	time.Sleep(now.Truncate(time.Second).Add(time.Second + 100*time.Millisecond).Sub(now))
}

// managedFields renders the node's managedFields as YAML, for the test log.
func managedFields(t *testing.T, n *corev1.Node) string {
	t.Helper()
	b, err := yaml.Marshal(n.ManagedFields)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// kubectlUncordon does what kubectl uncordon does (k8s.io/kubectl/pkg/drain,
// CordonHelper.PatchOrReplace): a strategic merge patch from the node as read
// to the node with spec.unschedulable false, no field manager given, sent
// with kubectl's User-Agent, from which the apiserver names the manager.
func kubectlUncordon(g *WithT, n *corev1.Node) {
	old, err := json.Marshal(n)
	g.Expect(err).NotTo(HaveOccurred())
	desired := n.DeepCopy()
	desired.Spec.Unschedulable = false
	updated, err := json.Marshal(desired)
	g.Expect(err).NotTo(HaveOccurred())
	patch, err := strategicpatch.CreateTwoWayMergePatch(old, updated, n)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(string(patch)).To(Equal(`{"spec":{"unschedulable":null}}`))
	kubectlPatch(g, n.Name, patch)
}

// kubectlPatch sends a strategic merge patch as kubectl does: with its
// User-Agent and no field manager.
func kubectlPatch(g *WithT, name string, patch []byte) {
	cfg := rest.CopyConfig(restConfig)
	cfg.UserAgent = "kubectl/v1.37.2 (linux/amd64) kubernetes/0000000"
	cs, err := kubernetes.NewForConfig(cfg)
	g.Expect(err).NotTo(HaveOccurred())
	_, err = cs.CoreV1().Nodes().Patch(context.Background(), name, types.StrategicMergePatchType, patch, metav1.PatchOptions{})
	g.Expect(err).NotTo(HaveOccurred())
}

// entryOf is the manager's entry for the node's object.
func entryOf(g *WithT, n *corev1.Node, manager string) metav1.ManagedFieldsEntry {
	for _, e := range n.ManagedFields {
		if e.Manager == manager && e.Subresource == "" {
			return e
		}
	}
	g.ExpectWithOffset(1, n.ManagedFields).To(ContainElement(HaveField("Manager", manager)))
	return metav1.ManagedFieldsEntry{}
}

func TestUncordonedBy(t *testing.T) {
	cases := []struct {
		name     string
		uncordon func(*WithT, *corev1.Node)
		// want is what UncordonedBy says when the uncordon leaves no entry.
		want string
		// manager and operation name the entry the uncordon leaves, when
		// it leaves one; UncordonedBy then names it.
		manager, operation string
	}{
		{
			name:     "kubectl uncordon",
			uncordon: kubectlUncordon,
			want:     "unknown (managedFields name no writer of the uncordon)",
		},
		{
			// The apiserver names kubectl's manager from its User-Agent;
			// a later write is named, whoever uncordoned.
			name: "kubectl uncordon, then another write with kubectl's User-Agent",
			uncordon: func(g *WithT, n *corev1.Node) {
				kubectlUncordon(g, n)
				kubectlPatch(g, n.Name, []byte(`{"metadata":{"labels":{"maintenance":"done"}}}`))
			},
			manager: "kubectl", operation: "Update",
		},
		{
			name: "a merge patch of false by kubectl-uncordon",
			uncordon: func(g *WithT, n *corev1.Node) {
				g.Expect(k8sClient.Patch(context.Background(), n, client.RawPatch(types.MergePatchType, []byte(`{"spec":{"unschedulable":false}}`)),
					client.FieldOwner("kubectl-uncordon"))).To(Succeed())
			},
			want: "unknown (managedFields name no writer of the uncordon)",
		},
		{
			name: "an Update of spec.unschedulable alone by another tool",
			uncordon: func(g *WithT, n *corev1.Node) {
				n.Spec.Unschedulable = false
				g.Expect(k8sClient.Update(context.Background(), n, client.FieldOwner("node-admin-tool"))).To(Succeed())
			},
			want: "unknown (managedFields name no writer of the uncordon)",
		},
		{
			name: "an Update by another tool that also annotates the node",
			uncordon: func(g *WithT, n *corev1.Node) {
				n.Spec.Unschedulable = false
				n.Annotations["node-admin-tool/uncordoned"] = "ticket-4711"
				g.Expect(k8sClient.Update(context.Background(), n, client.FieldOwner("node-admin-tool"))).To(Succeed())
			},
			manager: "node-admin-tool", operation: "Update",
		},
		{
			name: "a server-side apply of false",
			uncordon: func(g *WithT, n *corev1.Node) {
				apply := []byte(`{"apiVersion":"v1","kind":"Node","metadata":{"name":"` + n.Name + `"},"spec":{"unschedulable":false}}`)
				g.Expect(k8sClient.Patch(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.Name}},
					client.RawPatch(types.ApplyPatchType, apply), client.FieldOwner("human-apply"), client.ForceOwnership)).To(Succeed())
			},
			manager: "human-apply", operation: "Apply",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			g := NewWithT(t)
			ctx := context.Background()
			n := newNode(t, g, corev1.NodeSpec{})
			nextSecond()
			g.Expect(node.Quarantine(ctx, client.WithFieldOwner(k8sClient, operator), n, true, quarantineTaint, "Quarantined")).To(Succeed())
			n = get(g, n.Name)
			t.Logf("managedFields after the cordon:\n%s", managedFields(t, n))
			g.Expect(node.UncordonedBy(n, operator)).To(Equal("unknown (managedFields name no writer of the uncordon)"),
				"test-setup created the node before the cordon: not a writer after it")

			cordoned := entryOf(g, n, operator)

			nextSecond()
			from := time.Now().Truncate(time.Second)
			tc.uncordon(g, n)
			to := time.Now()
			n = get(g, n.Name)
			t.Logf("managedFields after the uncordon:\n%s", managedFields(t, n))
			g.Expect(n.Spec.Unschedulable).To(BeFalse())
			g.Expect(node.HumanUncordoned(n)).To(BeTrue())
			ours := entryOf(g, n, operator)
			g.Expect(ours.Time.Time).To(BeTemporally("==", cordoned.Time.Time), "the uncordon leaves the time of our entry alone")
			g.Expect(ours.FieldsV1.GetRawString()).NotTo(ContainSubstring("f:unschedulable"), "nor do we own the cordon any more")
			want := tc.want
			if tc.manager == "" {
				g.Expect(n.ManagedFields).To(HaveEach(HaveField("Manager", BeElementOf("test-setup", operator))), "the uncordon left no entry")
			} else {
				e := entryOf(g, n, tc.manager)
				g.Expect(e.Operation).To(BeEquivalentTo(tc.operation))
				g.Expect(e.Time.Time).To(BeTemporally(">=", from), "written by the uncordon")
				g.Expect(e.Time.Time).To(BeTemporally("<=", to))
				want = "manager " + tc.manager + " (" + tc.operation + " at " + e.Time.UTC().Format(time.RFC3339) + ")"
			}
			g.Expect(node.UncordonedBy(n, operator)).To(Equal(want))
		})
	}
}

func TestUncordonedByEntries(t *testing.T) {
	t0 := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	at := func(s int) *metav1.Time { return new(metav1.NewTime(t0.Add(time.Duration(s) * time.Second))) }
	entry := func(manager string, op metav1.ManagedFieldsOperationType, s int, sub string) metav1.ManagedFieldsEntry {
		return metav1.ManagedFieldsEntry{Manager: manager, Operation: op, Time: at(s), Subresource: sub}
	}
	update := metav1.ManagedFieldsOperationUpdate
	cases := []struct {
		name    string
		entries []metav1.ManagedFieldsEntry
		want    string
	}{
		{
			name:    "the newest writer after our last write",
			entries: []metav1.ManagedFieldsEntry{entry("test-setup", update, 0, ""), entry(operator, update, 5, ""), entry("a", update, 7, ""), entry("b", update, 9, ""), entry("c", update, 8, "")},
			want:    "manager b (Update at 2026-11-30T12:00:09Z)",
		},
		{
			name:    "our newest write counts, not our first",
			entries: []metav1.ManagedFieldsEntry{entry(operator, update, 1, ""), entry("a", update, 3, ""), entry(operator, metav1.ManagedFieldsOperationApply, 5, "")},
			want:    "unknown (managedFields name no writer of the uncordon)",
		},
		{
			name:    "status writers did not uncordon, and our status writes do not place the cordon",
			entries: []metav1.ManagedFieldsEntry{entry(operator, update, 1, ""), entry("kubelet", update, 9, "status"), entry(operator, update, 9, "status")},
			want:    "unknown (managedFields name no writer of the uncordon)",
		},
		{
			name:    "a writer in the second of our write cannot be ordered",
			entries: []metav1.ManagedFieldsEntry{entry(operator, update, 5, ""), entry("kubectl-edit", update, 5, "")},
			want:    "unknown (managedFields name no writer of the uncordon; kubectl-edit wrote in the second of gpuhealth-operator's last write, 2026-11-30T12:00:05Z, before or after it)",
		},
		{
			name:    "writers of the same second are named together",
			entries: []metav1.ManagedFieldsEntry{entry(operator, update, 5, ""), entry("a", update, 7, ""), entry("b", metav1.ManagedFieldsOperationApply, 7, "")},
			want:    "one of managers a (Update at 2026-11-30T12:00:07Z), b (Apply at 2026-11-30T12:00:07Z)",
		},
		{
			name:    "without a write of ours nothing can be placed after the cordon",
			entries: []metav1.ManagedFieldsEntry{entry("a", update, 7, "")},
			want:    "unknown (managedFields hold no write of gpuhealth-operator to tell the uncordon from earlier writes)",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{ManagedFields: tc.entries}}
			NewWithT(t).Expect(node.UncordonedBy(n, operator)).To(Equal(tc.want))
		})
	}
}
