package nodehealth

import (
	"context"
	"errors"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
)

// record writes what the plan decided: each finding's status, then the
// NodeHealth status once, with the optimistic lock. Only when that write
// succeeded are the plan's Events published and its transitions counted.
// It returns whether the status write went through (or had nothing to do).
func (r *Reconciler) record(ctx context.Context, o *observation, p *plan) (bool, error) {
	var errs []error
	for _, j := range p.judged {
		if j.orig == nil || equality.Semantic.DeepEqual(j.orig.Status, j.event.Status) {
			continue
		}
		if err := r.Client.Status().Patch(ctx, j.event, client.MergeFrom(j.orig)); err != nil {
			if !apierrors.IsNotFound(err) {
				errs = append(errs, fmt.Errorf("recording judgement of event %s: %w", j.event.Name, err))
			}
			continue
		}
		r.expect.wrote(kindHealthEvent, j.orig.Name, j.orig.ResourceVersion, j.event.ResourceVersion)
	}
	if err := errors.Join(errs...); err != nil {
		// The NodeHealth waits: a node must not return to service while
		// the findings that sent it out still look open.
		return false, err
	}
	for _, e := range p.illegal {
		illegalTransitions.WithLabelValues(string(e.Phase), string(e.Event)).Inc()
	}
	if equality.Semantic.DeepEqual(o.nh.Status, p.status) {
		publish(r.Recorder, p.announce)
		return true, nil
	}
	nh := o.nh.DeepCopy()
	nh.Status = p.status
	if err := r.Client.Status().Patch(ctx, nh, client.MergeFromWithOptions(o.nh, client.MergeFromWithOptimisticLock{})); err != nil {
		if apierrors.IsConflict(err) {
			return false, nil
		}
		return false, fmt.Errorf("patching status of nodehealth %s: %w", nh.Name, err)
	}
	r.expect.wrote(kindNodeHealth, o.nh.Name, o.nh.ResourceVersion, nh.ResourceVersion)
	for _, t := range p.transitions {
		log.FromContext(ctx).Info("Transitioned node", "fromPhase", t.from, "toPhase", t.to, "reason", t.reason)
		transitions.WithLabelValues(string(t.from), string(t.to), t.reason).Inc()
		phaseDuration.WithLabelValues(string(t.from)).Observe(t.spent.Seconds())
	}
	for _, m := range p.deviceMoves {
		deviceTransitions.WithLabelValues(string(m.from), string(m.to)).Inc()
	}
	countOutages(p)
	if p.budgetBlocked != "" {
		budgetBlocked.WithLabelValues(string(p.budgetBlocked)).Inc()
	}
	countSteps(o.node.Name, p.steps)
	countGangWaves(p.gangWaves)
	publish(r.Recorder, p.announce)
	return true, nil
}

// result is the workqueue's next move for a plan.
func result(p *plan) ctrl.Result {
	switch {
	case p.fenceOnly:
		// The bookkeeping pass after a fence, below fresh work, so a storm's
		// fences go first (see fencedPriority).
		return ctrl.Result{RequeueAfter: max(p.requeue, time.Millisecond), Priority: ptr.To(fencedPriority)}
	case p.immediate:
		return ctrl.Result{RequeueAfter: time.Millisecond, Priority: ptr.To(normalPriority)}
	}
	// An explicit priority: without one controller-runtime keeps the one the
	// item was taken off the queue with, and a node would go on waiting
	// below fresh work after its write-up pass at fencedPriority.
	return ctrl.Result{RequeueAfter: p.requeue, Priority: ptr.To(normalPriority)}
}

// announcement is an Event a plan publishes once its status is written:
// Normal for progress, Warning for faults and blocks; reasons are the
// gpuhealthv1alpha1.Reason… constants.
type announcement struct {
	regarding, related runtime.Object
	eventType          string
	reason, action     string
	note               string
}

// publish sends the announcements. It is the one way an Event leaves the
// reconciler.
func publish(rec events.EventRecorder, as []announcement) {
	for _, a := range as {
		rec.Eventf(a.regarding, a.related, a.eventType, a.reason, a.action, "%s", a.note)
	}
}

// unobserved ends a pass that has nothing to decide on: the cache lags
// behind a write of ours (come back shortly), the read failed, or the node
// is gone or no longer managed (forget what this process keeps of it).
func (r *Reconciler) unobserved(ctx context.Context, name string, err error) (ctrl.Result, error) {
	var behind *errCacheBehind
	switch {
	case errors.As(err, &behind):
		log.FromContext(ctx).V(1).Info("Waiting for the cache to show this operator's write", "err", err)
		return after(cacheRetry), nil
	case errors.Is(err, errNodeGone):
		r.expect.forget(kindNode, name)
		r.expect.forget(kindNodeHealth, name)
	case err != nil:
		return ctrl.Result{}, err
	default:
		// No policy manages the node: held where it is (unmanaged.go).
		if err := r.leftManagement(ctx, name); err != nil {
			return ctrl.Result{}, err
		}
	}
	forgetSuiteMeasurements(name)
	return ctrl.Result{}, nil
}

// nodeAnnouncement is an Event on the Node, with its NodeHealth as the
// related object.
func (o *observation) nodeAnnouncement(eventType, reason, action, note string) announcement {
	return announcement{regarding: o.node, related: o.nh, eventType: eventType, reason: reason, action: action, note: note}
}
