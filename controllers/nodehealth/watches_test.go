package nodehealth

import (
	"context"
	"testing"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/controller/priorityqueue"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
)

// TestARestartPassesTheNodesWithFindingsFirst: after a start the Node
// watch's initial list enqueues every node at LowPriority; the findings'
// initial list raises the nodes of findings awaiting action to fresh work,
// so the workqueue hands them out first; a resolved finding, one that
// already caused its transition, or a later create changes nothing of the
// kind.
func TestARestartPassesTheNodesWithFindingsFirst(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	q := priorityqueue.New[ctrl.Request]("findings-first")
	defer q.ShutDown()

	nodes := handler.EnqueueRequestsFromMapFunc(nodeHealthToNode)
	for _, name := range []string{"a", "b", "c", "d", "e"} {
		nodes.Create(ctx, event.CreateEvent{Object: &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, IsInInitialList: true}, q)
	}
	finding := func(node string, resolved bool) *gpuhealthv1alpha1.NodeHealthEvent {
		ev := &gpuhealthv1alpha1.NodeHealthEvent{ObjectMeta: metav1.ObjectMeta{Name: "f-" + node, Namespace: "gpuhealth-system"}}
		ev.Spec.NodeName, ev.Status.Resolved = node, resolved
		return ev
	}
	h := findingsFirst{handler.EnqueueRequestsFromMapFunc(eventToNode)}
	h.Create(ctx, event.CreateEvent{Object: finding("d", false), IsInInitialList: true}, q)
	h.Create(ctx, event.CreateEvent{Object: finding("b", true), IsInInitialList: true}, q)
	h.Create(ctx, event.CreateEvent{Object: finding("e", false), IsInInitialList: true}, q)
	acted := finding("c", false)
	acted.Status.ObservedBy = &gpuhealthv1alpha1.TransitionRef{}
	h.Create(ctx, event.CreateEvent{Object: acted, IsInInitialList: true}, q)

	var order []string
	var priorities []int
	for q.Len() > 0 {
		req, prio, _ := q.GetWithPriority()
		order = append(order, req.Name)
		priorities = append(priorities, prio)
		q.Done(req)
	}
	g.Expect(order[:2]).To(ConsistOf("d", "e"), "the nodes of unresolved findings first")
	g.Expect(priorities[:2]).To(Equal([]int{normalPriority, normalPriority}))
	g.Expect(order[2:]).To(ConsistOf("a", "b", "c"), "the rest, at LowPriority: a resolved finding's node, and that of a finding already acted on (a quarantined node's)")
	g.Expect(priorities[2:]).To(Equal([]int{handler.LowPriority, handler.LowPriority, handler.LowPriority}))

	// A finding created after the start is fresh work through the wrapped
	// handler, as before.
	h.Create(ctx, event.CreateEvent{Object: finding("a", false)}, q)
	req, prio, _ := q.GetWithPriority()
	g.Expect(req.Name).To(Equal("a"))
	g.Expect(prio).To(Equal(0))
	q.Done(req)
}
