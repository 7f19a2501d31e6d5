package nodehealth

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/priorityqueue"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/internal/readiness"
	"github.com/gpuhealth/gpuhealth/remediation/job"
	nodepkg "github.com/gpuhealth/gpuhealth/remediation/node"
)

// nodeChanged lets through the node changes that matter: labels (policy
// selection), annotations (what we applied), cordon, taints, readiness and
// the boot ID (a reboot step waits for it). Heartbeats, which kubelets send
// every few seconds, do not.
//
// The update that a fence itself causes (our applied annotation appearing)
// is skipped: the pass that fenced already requeued the node at a lower
// priority, and reacting at normal priority would let bookkeeping compete
// with other nodes' fences in a storm.
var nodeChanged = predicate.Funcs{
	UpdateFunc: func(e event.UpdateEvent) bool {
		o, n := e.ObjectOld.(*corev1.Node), e.ObjectNew.(*corev1.Node)
		if _, had := o.Annotations[nodepkg.AppliedAnnotation]; !had {
			if _, has := n.Annotations[nodepkg.AppliedAnnotation]; has {
				return false
			}
		}
		return !equality.Semantic.DeepEqual(o.Labels, n.Labels) ||
			!equality.Semantic.DeepEqual(o.Annotations, n.Annotations) ||
			o.Spec.Unschedulable != n.Spec.Unschedulable ||
			!equality.Semantic.DeepEqual(o.Spec.Taints, n.Spec.Taints) ||
			readyStatus(o) != readyStatus(n) ||
			o.Status.NodeInfo.BootID != n.Status.NodeInfo.BootID
	},
}

// readyStatus is the node's Ready condition status; a dead ComputeDomain
// member is released some time after it turns False or Unknown.
func readyStatus(n *corev1.Node) corev1.ConditionStatus {
	if c := readiness.NodeCondition(n); c != nil {
		return c.Status
	}
	return ""
}

// eventChanged lets through what a producer changes on a finding (a new
// finding, a repeat, a resolution, a deletion), not the judgement the
// operator itself records in its status.
var eventChanged = predicate.Funcs{
	UpdateFunc: func(e event.UpdateEvent) bool {
		o, n := e.ObjectOld.(*gpuhealthv1alpha1.NodeHealthEvent), e.ObjectNew.(*gpuhealthv1alpha1.NodeHealthEvent)
		return o.Generation != n.Generation || o.Status.Count != n.Status.Count ||
			!equality.Semantic.DeepEqual(o.Status.LastSeen, n.Status.LastSeen) ||
			o.Status.Resolved != n.Status.Resolved ||
			!equality.Semantic.DeepEqual(o.Status.ResolvedAt, n.Status.ResolvedAt)
	},
}

// budgetFreed lets through a NodeHealth leaving the phases that use a
// budget (Draining, Recertifying), which is when waiting nodes may go.
var budgetFreed = predicate.Funcs{
	CreateFunc:  func(event.CreateEvent) bool { return false },
	GenericFunc: func(event.GenericEvent) bool { return false },
	UpdateFunc: func(e event.UpdateEvent) bool {
		return usesBudget(e.ObjectOld.(*gpuhealthv1alpha1.NodeHealth)) && !usesBudget(e.ObjectNew.(*gpuhealthv1alpha1.NodeHealth))
	},
	DeleteFunc: func(e event.DeleteEvent) bool {
		nh, ok := e.Object.(*gpuhealthv1alpha1.NodeHealth)
		return ok && usesBudget(nh)
	},
}

func usesBudget(nh *gpuhealthv1alpha1.NodeHealth) bool {
	// Certifying counts where a policy says so; waking the waiting nodes
	// when one leaves costs little either way.
	return nh.Status.Phase.UsesBudget() || nh.Status.Phase == gpuhealthv1alpha1.PhaseCertifying
}

// budgetFreedToWaiting wakes the nodes waiting for a budget.
func (r *Reconciler) budgetFreedToWaiting(ctx context.Context, _ client.Object) []ctrl.Request {
	// The woken nodes must count without the node that left, even if the
	// snapshot cache's own handler has not run yet.
	r.snapshots.changed()
	list := &gpuhealthv1alpha1.NodeHealthList{}
	if err := r.Client.List(ctx, list, client.UnsafeDisableDeepCopy); err != nil {
		log.FromContext(ctx).Error(err, "Listing nodehealths to wake nodes waiting for a budget")
		return nil
	}
	var out []ctrl.Request
	for i := range list.Items {
		if st := list.Items[i].Status; st.Phase == gpuhealthv1alpha1.PhaseQuarantined && st.Reason == gpuhealthv1alpha1.ReasonWaitingForBudget {
			out = append(out, request(list.Items[i].Name)...)
		}
	}
	return out
}

// disruptionsFreed lets through the PodDisruptionBudget changes that can
// let a refused eviction through: more disruptions allowed than before (the
// disruption controller saw replacements become healthy), or the budget
// deleted.
var disruptionsFreed = predicate.Funcs{
	CreateFunc: func(event.CreateEvent) bool { return false },
	UpdateFunc: func(e event.UpdateEvent) bool {
		o, n := e.ObjectOld.(*policyv1.PodDisruptionBudget), e.ObjectNew.(*policyv1.PodDisruptionBudget)
		return n.Status.DisruptionsAllowed > 0 && n.Status.DisruptionsAllowed > o.Status.DisruptionsAllowed
	},
	DeleteFunc:  func(event.DeleteEvent) bool { return true },
	GenericFunc: func(event.GenericEvent) bool { return false },
}

// budgetToBlockedNodes wakes the draining nodes that have pods blocked in
// the budget's namespace (or more blocked pods than their status lists),
// so a drain goes on as soon as the budget allows, not at the next recheck.
func (r *Reconciler) budgetToBlockedNodes(ctx context.Context, o client.Object) []ctrl.Request {
	list := &gpuhealthv1alpha1.NodeHealthList{}
	if err := r.Client.List(ctx, list, client.UnsafeDisableDeepCopy); err != nil {
		log.FromContext(ctx).Error(err, "Listing nodehealths to wake drains blocked by a PodDisruptionBudget")
		return nil
	}
	var out []ctrl.Request
	for i := range list.Items {
		if blockedIn(list.Items[i].Status, o.GetNamespace()) {
			out = append(out, request(list.Items[i].Name)...)
		}
	}
	return out
}

// blockedIn says whether a node in status is draining with pods blocked
// in namespace, as far as its status tells.
func blockedIn(st gpuhealthv1alpha1.NodeHealthStatus, namespace string) bool {
	if st.Phase != gpuhealthv1alpha1.PhaseDraining || st.Drain == nil || st.Drain.PodsBlocked == 0 {
		return false
	}
	if int(st.Drain.PodsBlocked) > len(st.Drain.Blocked) {
		return true // the list is cut short: any namespace may be among the rest
	}
	for _, b := range st.Drain.Blocked {
		if b.Namespace == namespace {
			return true
		}
	}
	return false
}

// podLeftOrFinished lets through the pod changes a drain waits for.
var podLeftOrFinished = predicate.Funcs{
	CreateFunc: func(event.CreateEvent) bool { return false },
	UpdateFunc: func(e event.UpdateEvent) bool {
		o, n := e.ObjectOld.(*corev1.Pod), e.ObjectNew.(*corev1.Pod)
		return o.Status.Phase != n.Status.Phase || (o.DeletionTimestamp == nil) != (n.DeletionTimestamp == nil)
	},
	DeleteFunc: func(event.DeleteEvent) bool { return true },
}

func request(node string) []ctrl.Request {
	if node == "" {
		return nil
	}
	return []ctrl.Request{{NamespacedName: types.NamespacedName{Name: node}}}
}

func nodeHealthToNode(_ context.Context, o client.Object) []ctrl.Request { return request(o.GetName()) }

// findingsFirst enqueues, from the informer's initial list after a start,
// the node of each finding awaiting action at the priority of fresh work rather
// than controller-runtime's LowPriority for initial-list items. A restarted
// operator lists every node of the fleet at LowPriority; with this the nodes
// that a finding may take out of service (a raise of the same key's
// priority in the queue) are passed before the thousands that have nothing
// to do, so that restart → all fenced grows with the nodes that need it, not
// with the fleet. Every other event goes through the wrapped handler.
type findingsFirst struct {
	handler.EventHandler
}

// Create raises the initial-list findings' nodes; see findingsFirst.
func (h findingsFirst) Create(ctx context.Context, e event.CreateEvent, q workqueue.TypedRateLimitingInterface[ctrl.Request]) {
	ev, isEvent := e.Object.(*gpuhealthv1alpha1.NodeHealthEvent)
	pq, isPriority := q.(priorityqueue.PriorityQueue[ctrl.Request])
	if !e.IsInInitialList || !isEvent || !isPriority || !awaitsAction(ev) {
		h.EventHandler.Create(ctx, e, q)
		return
	}
	pq.AddWithOpts(priorityqueue.AddOpts{Priority: ptr.To(normalPriority)}, request(ev.Spec.NodeName)...)
}

// atPriority enqueues the object's name at priority (the workqueue of a
// controller with the priority queue, as the operator's are), for wake-ups
// that must not jump ahead of fresh work.
func atPriority(priority int) handler.EventHandler {
	return handler.Funcs{
		GenericFunc: func(_ context.Context, e event.GenericEvent, q workqueue.TypedRateLimitingInterface[ctrl.Request]) {
			req := request(e.Object.GetName())
			if pq, ok := q.(priorityqueue.PriorityQueue[ctrl.Request]); ok {
				pq.AddWithOpts(priorityqueue.AddOpts{Priority: ptr.To(priority)}, req...)
				return
			}
			for _, r := range req {
				q.Add(r)
			}
		},
	}
}

// awaitsAction says whether a finding may still move its node: open, and
// not yet the cause of a transition (observedBy), ignored or superseded. A
// restart finds every quarantined node's findings open too; those were
// acted on and wait at LowPriority with the rest.
func awaitsAction(ev *gpuhealthv1alpha1.NodeHealthEvent) bool {
	st := ev.Status
	return ev.Spec.NodeName != "" && !st.Resolved && st.ObservedBy == nil &&
		st.Phase != gpuhealthv1alpha1.EventIgnored && st.Phase != gpuhealthv1alpha1.EventSuperseded
}

func eventToNode(_ context.Context, o client.Object) []ctrl.Request {
	return request(o.(*gpuhealthv1alpha1.NodeHealthEvent).Spec.NodeName)
}

func podToNode(_ context.Context, o client.Object) []ctrl.Request {
	return request(o.(*corev1.Pod).Spec.NodeName)
}

func jobToNode(_ context.Context, o client.Object) []ctrl.Request {
	return request(o.GetLabels()[job.NodeLabel])
}

func (r *Reconciler) policyToNodes(ctx context.Context, _ client.Object) []ctrl.Request {
	list := &corev1.NodeList{}
	if err := r.Client.List(ctx, list, client.UnsafeDisableDeepCopy); err != nil {
		log.FromContext(ctx).Error(err, "Listing nodes for a policy change")
		return nil
	}
	out := make([]ctrl.Request, 0, len(list.Items))
	for i := range list.Items {
		out = append(out, request(list.Items[i].Name)...)
	}
	return out
}
