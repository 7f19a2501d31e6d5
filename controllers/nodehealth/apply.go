package nodehealth

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/controllers/computedomain"
	"github.com/gpuhealth/gpuhealth/remediation/job"
	"github.com/gpuhealth/gpuhealth/remediation/member"
	nodepkg "github.com/gpuhealth/gpuhealth/remediation/node"
)

// apply carries out what must happen before the status is written: the
// fence, keeping the node out of service, the Jobs and the deletion of a
// dead member's daemon pods. Every step is idempotent, so a pass that
// fails part-way is repeated safely. It says whether it fenced the node.
func (r *Reconciler) apply(ctx context.Context, o *observation, p *plan) (fenced bool, err error) {
	logger := log.FromContext(ctx)
	taint := nodepkg.Taint(o.policy.Spec.Quarantine.Taint)
	switch p.node {
	case nodeFence:
		err := r.writeNode(o, func(n *corev1.Node) error {
			return nodepkg.Quarantine(ctx, r.Client, n, policyCordons(o.policy), taint, phaseLabel(o.policy, gpuhealthv1alpha1.PhaseQuarantined))
		})
		if err != nil {
			return false, err
		}
		fenced = true
		logger.Info("Fenced node", "findings", describe(countingOf(p.judged)))
		r.storm.fenced(o.node.Name)
	case nodeOutOfService:
		err := r.writeNode(o, func(n *corev1.Node) error {
			if err := nodepkg.Quarantine(ctx, r.Client, n, policyCordons(o.policy), taint, phaseLabel(o.policy, p.status.Phase)); err != nil {
				return err
			}
			return nodepkg.SetGPUHealthy(ctx, r.Client, n, false, p.nodeReason, truncate(p.nodeMessage, 1024), o.now)
		})
		if err != nil {
			return fenced, err
		}
	case nodeUncertified:
		err := r.writeNode(o, func(n *corev1.Node) error {
			if err := nodepkg.HoldUncertified(ctx, r.Client, n, phaseLabel(o.policy, p.status.Phase)); err != nil {
				return err
			}
			return nodepkg.SetGPUHealthy(ctx, r.Client, n, false, p.nodeReason, truncate(p.nodeMessage, 1024), o.now)
		})
		if err != nil {
			return fenced, err
		}
	}
	if p.deleteJobs {
		deleted, err := job.DeleteUnfinished(ctx, r.Client, o.namespace, o.node.Name)
		if err != nil {
			return fenced, err
		}
		if len(deleted) > 0 {
			logger.Info("Deleted unfinished jobs of a workflow that ended", "jobs", deleted)
			r.Recorder.Eventf(o.node, o.nh, corev1.EventTypeNormal, gpuhealthv1alpha1.ReasonJobsDeleted, "Delete",
				"deleted unfinished jobs %s: the node's workflow ended", strings.Join(deleted, ", "))
		}
	}
	for _, want := range p.createJobs {
		if _, err := job.Ensure(ctx, r.Client, want); err != nil {
			return fenced, err
		}
	}
	if err := r.applyHandOff(ctx, p); err != nil {
		return fenced, err
	}
	if err := r.applyWithdraw(ctx, o, p); err != nil {
		return fenced, err
	}
	if p.removeDomainLabel {
		err := r.writeNode(o, func(n *corev1.Node) error {
			return member.RemoveLabel(ctx, r.Client, n, computedomain.NodeLabel)
		})
		if err != nil {
			return fenced, err
		}
	}
	for _, pod := range p.deleteDaemonPods {
		since := p.status.ComputeDomain.DeadSince.UTC().Format(time.RFC3339)
		logger.Info("Deleting stale ComputeDomain daemon pod of a dead member", "Pod", klog.KObj(pod), "notReadySince", since)
		if err := member.DeleteStalePod(ctx, r.Client, o.node, pod); err != nil {
			return fenced, err
		}
		staleDaemonPodsDeleted.Inc()
		r.Recorder.Eventf(o.node, o.nh, corev1.EventTypeWarning, gpuhealthv1alpha1.ReasonStaleDaemonPodDeleted, "Delete",
			"deleted ComputeDomain daemon pod %s/%s of the dead node (NotReady since %s)", pod.Namespace, pod.Name, since)
		if a, ok := domainAnnouncement(o, p.status.ComputeDomain, corev1.EventTypeWarning, gpuhealthv1alpha1.ReasonStaleDaemonPodDeleted, "Delete",
			fmt.Sprintf("node %s is dead (NotReady since %s, fenced): deleted its daemon pod %s so the other members drop it", o.node.Name, since, pod.Name)); ok {
			publish(r.Recorder, []announcement{a})
		}
	}
	return fenced, nil
}

// applyAfterWrite carries out what must follow the status write: a node
// returns to service only once its NodeHealth says Healthy, so a crash in
// between never fences it again.
func (r *Reconciler) applyAfterWrite(ctx context.Context, o *observation, p *plan) error {
	if p.node != nodeInService {
		return nil
	}
	taint := nodepkg.Taint(o.policy.Spec.Quarantine.Taint)
	return r.writeNode(o, func(n *corev1.Node) error {
		if err := nodepkg.Release(ctx, r.Client, n, taint); err != nil {
			return err
		}
		if _, err := nodepkg.ReleaseUncertified(ctx, r.Client, n); err != nil {
			return err
		}
		return nodepkg.SetGPUHealthy(ctx, r.Client, n, true, p.nodeReason, p.nodeMessage, o.now)
	})
}

// writeNode runs writes on a copy of the observed Node and, when one went
// through, expects the cache to move past the observed version before the
// node is decided on again.
func (r *Reconciler) writeNode(o *observation, write func(*corev1.Node) error) error {
	n := o.node.DeepCopy()
	err := write(n)
	if n.ResourceVersion != o.node.ResourceVersion {
		r.expect.wrote(kindNode, o.node, o.node.ResourceVersion)
	}
	return err
}

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
		r.expect.wrote(kindHealthEvent, j.orig, j.orig.ResourceVersion)
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
	r.expect.wrote(kindNodeHealth, o.nh, o.nh.ResourceVersion)
	for _, t := range p.transitions {
		log.FromContext(ctx).Info("Transitioned node", "fromPhase", t.from, "toPhase", t.to, "reason", t.reason)
		transitions.WithLabelValues(string(t.from), string(t.to), t.reason).Inc()
		phaseDuration.WithLabelValues(string(t.from)).Observe(t.spent.Seconds())
	}
	countOutages(p)
	if p.budgetBlocked != "" {
		budgetBlocked.WithLabelValues(string(p.budgetBlocked)).Inc()
	}
	countSteps(o.node.Name, p.steps)
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

// countingOf returns the judgements that count against the node.
func countingOf(js []judgement) []judgement {
	var out []judgement
	for _, j := range js {
		if j.counts {
			out = append(out, j)
		}
	}
	return out
}

// phaseLabel is the phase label value a policy wants, empty for none.
func phaseLabel(p *gpuhealthv1alpha1.RemediationPolicy, phase gpuhealthv1alpha1.NodeHealthPhase) string {
	if l := p.Spec.Quarantine.PhaseLabel; l != nil && !*l {
		return ""
	}
	return string(phase)
}
