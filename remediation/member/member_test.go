package member

import (
	"context"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/gpuhealth/gpuhealth/internal/readiness"
)

func TestReadiness(t *testing.T) {
	t0 := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	node := func(status corev1.ConditionStatus, taints ...corev1.Taint) *corev1.Node {
		n := &corev1.Node{Spec: corev1.NodeSpec{Taints: taints}}
		if status != "" {
			n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: status, LastTransitionTime: metav1.NewTime(t0)}}
		}
		return n
	}
	oos := corev1.Taint{Key: OutOfServiceTaint, Value: "nodeshutdown", Effect: corev1.TaintEffectNoExecute}
	cases := []struct {
		name         string
		node         *corev1.Node
		wantReady    bool
		wantNotReady bool
		wantOOS      bool
	}{
		{name: "a Ready node is not dead", node: node(corev1.ConditionTrue, oos), wantReady: true, wantOOS: true},
		{name: "a node whose kubelet stopped reporting is NotReady since the transition", node: node(corev1.ConditionUnknown), wantNotReady: true},
		{name: "a node reported NotReady is NotReady", node: node(corev1.ConditionFalse, oos), wantNotReady: true, wantOOS: true},
		{name: "a node that never reported is neither", node: node("")},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			g.Expect(readiness.Node(tc.node)).To(Equal(tc.wantReady))
			since, notReady := NotReadySince(tc.node)
			g.Expect(notReady).To(Equal(tc.wantNotReady))
			if notReady {
				g.Expect(since).To(Equal(t0))
			}
			g.Expect(OutOfService(tc.node)).To(Equal(tc.wantOOS))
		})
	}
}

// TestDeleteStalePodRefusesALiveNode checks the last line of the rule:
// whatever the caller decided, a Ready node's pod and another node's pod
// are never deleted.
func TestDeleteStalePodRefusesALiveNode(t *testing.T) {
	g := NewWithT(t)
	scheme := runtime.NewScheme()
	g.Expect(clientgoscheme.AddToScheme(scheme)).To(Succeed())
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "imex", Namespace: "dra", UID: "u1"}, Spec: corev1.PodSpec{NodeName: "n1"}}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(pod.DeepCopy()).Build()
	ctx := context.Background()
	ready := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}, Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}}}
	dead := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}, Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionUnknown}}}}
	other := dead.DeepCopy()
	other.Name = "n2"

	g.Expect(DeleteStalePod(ctx, c, ready, pod)).To(MatchError(ContainSubstring("is Ready")))
	g.Expect(DeleteStalePod(ctx, c, other, pod)).To(MatchError(ContainSubstring("runs on n1")))
	g.Expect(c.Get(ctx, client.ObjectKeyFromObject(pod), &corev1.Pod{})).To(Succeed(), "still there")

	g.Expect(DeleteStalePod(ctx, c, dead, pod)).To(Succeed())
	g.Expect(c.Get(ctx, client.ObjectKeyFromObject(pod), &corev1.Pod{})).NotTo(Succeed(), "deleted")
	g.Expect(DeleteStalePod(ctx, c, dead, pod)).To(Succeed(), "already gone is done")
}

// TestRemoveLabelRefusesALiveNode: a Ready node keeps its label whatever the
// caller decided; a dead one loses it, and a node that changed since it was
// read is left for the next look.
func TestRemoveLabelRefusesALiveNode(t *testing.T) {
	g := NewWithT(t)
	scheme := runtime.NewScheme()
	g.Expect(clientgoscheme.AddToScheme(scheme)).To(Succeed())
	const key = "resource.nvidia.com/computeDomain"
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: map[string]string{key: "uid-1"}},
		Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}}}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(node.DeepCopy()).Build()
	ctx := context.Background()
	read := func() *corev1.Node {
		n := &corev1.Node{}
		g.Expect(c.Get(ctx, client.ObjectKeyFromObject(node), n)).To(Succeed())
		return n
	}

	g.Expect(RemoveLabel(ctx, c, read(), key)).To(MatchError(ContainSubstring("is Ready")))
	g.Expect(read().Labels).To(HaveKey(key))

	dead := read()
	dead.Status.Conditions[0].Status = corev1.ConditionUnknown
	g.Expect(c.Status().Update(ctx, dead)).To(Succeed())
	stale := read()
	current := read()
	current.Labels["other"] = "x"
	g.Expect(c.Update(ctx, current)).To(Succeed())
	g.Expect(RemoveLabel(ctx, c, stale, key)).To(Succeed(), "a conflict is left for the next look")
	g.Expect(read().Labels).To(HaveKey(key))

	g.Expect(RemoveLabel(ctx, c, read(), key)).To(Succeed())
	g.Expect(read().Labels).NotTo(HaveKey(key))
	g.Expect(RemoveLabel(ctx, c, read(), key)).To(Succeed(), "already gone is done")
}
