package eventgc

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
)

// +kubebuilder:rbac:groups=gpuhealth.dev,resources=nodehealthevents,verbs=get;list;watch;delete
// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list;watch

// conflictRecheck is how soon a node is looked at again when an event
// changed between the read and the delete, and the least wait for the next
// due time.
const conflictRecheck = time.Second

// capGrace is how long an event must have been finished before the cap may
// delete it (or the retention, when shorter): a monitor still flushing
// occurrences from before the finding closed then updates the closed event
// instead of creating it anew as an active one, and a finding that keeps
// recurring is not deleted and re-created over and over.
const capGrace = time.Hour

// Why an event was deleted, the reason label of the deletions metric.
const (
	ReasonRetention = "retention"
	ReasonCap       = "cap"
	// ReasonCapObserved: an active finding the policy only observes, the
	// oldest seen, deleted because the node has more unfinished findings
	// than the cap.
	ReasonCapObserved = "cap-observed"
)

// Reconciler deletes a node's finished NodeHealthEvents: those the operator
// judged Resolved, Superseded or Ignored, once they have been finished for
// Retention, and the oldest finished ones beyond MaxPerNode. An active
// finding goes only when the node's unfinished findings alone are more than
// MaxPerNode, and then only one the operator judged Observe (it changes
// nothing the operator does), the least recently seen first: a node agent,
// which may create findings about its node at will, cannot grow what the
// operator caches and judges without bound. A finding judged Quarantine
// (debouncing ones included) or not judged yet is never deleted, whatever
// its age or the count. When the node no longer
// exists, every event of it counts as finished when it was last seen, so
// findings of a node that left the cluster go after the retention too.
//
// Deletes carry the event's UID and resourceVersion as preconditions: an
// event that changed since it was read (a monitor reporting it again) is
// not deleted but looked at again. A monitor that reports a deleted finding
// again creates it anew.
type Reconciler struct {
	// Client reads from the manager's cache and writes to the apiserver.
	Client client.Client
	// Clock tells the age of events.
	Clock clock.PassiveClock
	// Retention is how long an event is kept after it finished; zero keeps
	// finished events (only MaxPerNode bounds them).
	Retention time.Duration
	// MaxPerNode is the most events kept per node; zero means no cap.
	MaxPerNode int
}

// SetupWithManager registers the watches (it lists by the index
// gpuhealthv1alpha1.EventNodeNameField, which controllers/index registers): a new
// event, a change of an event's phase, and a deleted Node (its events may
// now go) reconcile that node.
func (r *Reconciler) SetupWithManager(_ context.Context, mgr ctrl.Manager) error {
	if r.Client == nil || r.Clock == nil || r.Retention < 0 || r.MaxPerNode < 0 {
		return errors.New("eventgc.Reconciler needs Client and Clock, and Retention and MaxPerNode not negative")
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named("nodehealthevent_gc").
		Watches(&gpuhealthv1alpha1.NodeHealthEvent{}, handler.EnqueueRequestsFromMapFunc(eventNode), builder.WithPredicates(createdOrPhaseChanged)).
		Watches(&corev1.Node{}, handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []ctrl.Request {
			return []ctrl.Request{{NamespacedName: types.NamespacedName{Name: o.GetName()}}}
		}), builder.WithPredicates(predicate.Funcs{
			CreateFunc: func(event.CreateEvent) bool { return false },
			UpdateFunc: func(event.UpdateEvent) bool { return false },
		})).
		Complete(r)
}

func eventNode(_ context.Context, o client.Object) []ctrl.Request {
	return []ctrl.Request{{NamespacedName: types.NamespacedName{Name: o.(*gpuhealthv1alpha1.NodeHealthEvent).Spec.NodeName}}}
}

// createdOrPhaseChanged passes new events (the initial list too) and
// changes of whether and when an event finished (a phase change, a finding
// closed again at a new time); a monitor's count updates of an active
// finding do not matter here.
var createdOrPhaseChanged = predicate.Funcs{
	UpdateFunc: func(e event.UpdateEvent) bool {
		o, n := e.ObjectOld.(*gpuhealthv1alpha1.NodeHealthEvent), e.ObjectNew.(*gpuhealthv1alpha1.NodeHealthEvent)
		oAt, oDone := finishedAt(o, false)
		nAt, nDone := finishedAt(n, false)
		return o.Status.Phase != n.Status.Phase || oDone != nDone || !oAt.Equal(nAt)
	},
	DeleteFunc: func(event.DeleteEvent) bool { return false },
}

// Reconcile deletes what is due on one node and asks to come back when the
// next finished event's retention ends.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	events := &gpuhealthv1alpha1.NodeHealthEventList{}
	if err := r.Client.List(ctx, events, client.MatchingFields{gpuhealthv1alpha1.EventNodeNameField: req.Name}); err != nil {
		return ctrl.Result{}, fmt.Errorf("listing nodehealthevents of node %s: %w", req.Name, err)
	}
	if len(events.Items) == 0 {
		return ctrl.Result{}, nil
	}
	nodeGone := false
	if err := r.Client.Get(ctx, req.NamespacedName, &corev1.Node{}); err != nil {
		if !apierrors.IsNotFound(err) {
			return ctrl.Result{}, fmt.Errorf("reading node %s: %w", req.Name, err)
		}
		nodeGone = true
	}
	now := r.Clock.Now()
	plan := r.plan(events.Items, nodeGone, now)

	logger := log.FromContext(ctx)
	requeue := false
	dropped := 0 // active findings the cap took
	for _, d := range plan.deletes {
		e := d.event
		err := r.Client.Delete(ctx, e, client.Preconditions{UID: &e.UID, ResourceVersion: &e.ResourceVersion})
		switch {
		case err == nil:
			deleted.WithLabelValues(d.reason).Inc()
			if d.reason == ReasonCapObserved {
				dropped++
			}
			logger.V(1).Info("Deleted a NodeHealthEvent", "NodeHealthEvent", klog.KObj(e), "phase", e.Status.Phase, "finishedAt", d.finished, "why", d.reason)
		case apierrors.IsNotFound(err):
		case apierrors.IsConflict(err):
			// Changed since the cache read it: judge it again.
			requeue = true
		default:
			return ctrl.Result{}, fmt.Errorf("deleting nodehealthevent %s: %w", e.Name, err)
		}
	}
	if plan.overCap > 0 {
		logger.Info("Node has more unfinished NodeHealthEvents than the cap; they are kept", "over", plan.overCap, "cap", r.MaxPerNode)
	}
	if n := dropped; n > 0 {
		logger.Info("Node has more unfinished NodeHealthEvents than the cap; the least recently seen of those judged Observe are deleted", "deleted", n, "cap", r.MaxPerNode)
	}
	if requeue {
		// After the cache has caught up with the change.
		return ctrl.Result{RequeueAfter: conflictRecheck}, nil
	}
	if !plan.next.IsZero() {
		// At least a moment: a zero or negative RequeueAfter would not requeue.
		return ctrl.Result{RequeueAfter: max(plan.next.Sub(now), conflictRecheck)}, nil
	}
	return ctrl.Result{}, nil
}

type deletion struct {
	event    *gpuhealthv1alpha1.NodeHealthEvent
	finished time.Time
	reason   string
}

type plan struct {
	deletes []deletion
	// next is when a kept finished event next becomes due: the earliest
	// end of a retention, or of the cap's grace when the node is over the
	// cap; zero when none will.
	next time.Time
	// overCap is how many events beyond MaxPerNode are kept because they
	// are not finished (finished ones still in their grace are not counted).
	overCap int
}

// plan decides which of one node's events go, and why.
func (r *Reconciler) plan(items []gpuhealthv1alpha1.NodeHealthEvent, nodeGone bool, now time.Time) plan {
	var out plan
	var kept []deletion     // finished, kept for now
	var observed []deletion // active, judged Observe: the cap may take them
	unfinished := 0
	for i := range items {
		e := &items[i]
		at, ok := finishedAt(e, nodeGone)
		if !ok {
			unfinished++
			if observeOnly(e) {
				observed = append(observed, deletion{event: e, finished: lastSeen(e), reason: ReasonCapObserved})
			}
			continue
		}
		if r.Retention > 0 && !now.Before(at.Add(r.Retention)) {
			out.deletes = append(out.deletes, deletion{event: e, finished: at, reason: ReasonRetention})
			continue
		}
		kept = append(kept, deletion{event: e, finished: at, reason: ReasonCap})
	}
	if excess := unfinished - r.MaxPerNode; r.MaxPerNode > 0 && excess > 0 {
		// Least recently seen first.
		slices.SortFunc(observed, byTimeThenName)
		n := min(excess, len(observed))
		out.deletes = append(out.deletes, observed[:n]...)
		unfinished -= n
	}
	// Oldest finished first; the name breaks ties so the choice is stable.
	slices.SortFunc(kept, byTimeThenName)
	if over := unfinished + len(kept) - r.MaxPerNode; r.MaxPerNode > 0 && over > 0 {
		grace := capGrace
		if r.Retention > 0 {
			grace = min(grace, r.Retention)
		}
		// kept is oldest first: the ones finished long enough ago lead.
		n := 0
		for n < min(over, len(kept)) && !now.Before(kept[n].finished.Add(grace)) {
			n++
		}
		out.deletes = append(out.deletes, kept[:n]...)
		kept = kept[n:]
		out.overCap = over - n
		if out.overCap > 0 && len(kept) > 0 {
			// Back when the next one's grace ends.
			out.next = kept[0].finished.Add(grace)
			out.overCap -= min(out.overCap, len(kept))
		}
	}
	if r.Retention > 0 && len(kept) > 0 {
		if due := kept[0].finished.Add(r.Retention); out.next.IsZero() || due.Before(out.next) {
			out.next = due
		}
	}
	return out
}

func byTimeThenName(a, b deletion) int {
	if c := a.finished.Compare(b.finished); c != 0 {
		return c
	}
	return strings.Compare(a.event.Name, b.event.Name)
}

// observeOnly says whether the operator judged an active finding Observe:
// it is shown, counted and alerted on, but moves no node.
func observeOnly(e *gpuhealthv1alpha1.NodeHealthEvent) bool {
	c := e.Status.Classification
	return e.Status.Phase == gpuhealthv1alpha1.EventActive && c != nil && c.Verdict == gpuhealthv1alpha1.VerdictObserve
}

// lastSeen is when the finding was last reported (its creation, before any
// count).
func lastSeen(e *gpuhealthv1alpha1.NodeHealthEvent) time.Time {
	if e.Status.LastSeen != nil {
		return e.Status.LastSeen.Time
	}
	return e.CreationTimestamp.Time
}

// finishedAt returns when an event finished, and whether it has: Resolved
// at resolvedAt, Superseded at supersededAt, Ignored when last seen. A
// Resolved or Superseded finding seen again since is active again, whatever
// the phase still says until the operator judges it again. An event of a node that no longer exists finished when last seen.
// Missing times fall back to the last sighting and then to the creation.
func finishedAt(e *gpuhealthv1alpha1.NodeHealthEvent, nodeGone bool) (time.Time, bool) {
	st := &e.Status
	seen := e.CreationTimestamp.Time
	if st.LastSeen != nil {
		seen = st.LastSeen.Time
	}
	if nodeGone {
		return seen, true
	}
	switch st.Phase {
	case gpuhealthv1alpha1.EventResolved:
		if !st.Resolved {
			// Seen again since it resolved; the operator has not judged it
			// again yet.
			return time.Time{}, false
		}
		if st.ResolvedAt != nil {
			return st.ResolvedAt.Time, true
		}
		return seen, true
	case gpuhealthv1alpha1.EventSuperseded:
		if st.SupersededAt == nil {
			return seen, true
		}
		if st.LastSeen != nil && st.LastSeen.After(st.SupersededAt.Time) {
			return time.Time{}, false
		}
		return st.SupersededAt.Time, true
	case gpuhealthv1alpha1.EventIgnored:
		return seen, true
	}
	return time.Time{}, false
}
