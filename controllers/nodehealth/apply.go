package nodehealth

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/log"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/controllers/computedomain"
	"github.com/gpuhealth/gpuhealth/remediation/handoff"
	"github.com/gpuhealth/gpuhealth/remediation/job"
	"github.com/gpuhealth/gpuhealth/remediation/member"
	nodepkg "github.com/gpuhealth/gpuhealth/remediation/node"
)

// actBeforeDeciding carries out the acts whose answer the decision needs —
// a circuit breaker reset a human asked for, so that the nodes it woke see
// the breaker closed, and a pass of the drain (the Eviction API answers only
// by being tried) — and announces at once what they did, which happened
// whatever this pass writes.
func (r *Reconciler) actBeforeDeciding(ctx context.Context, o *observation) {
	var happened []announcement
	if b := o.breaker; b != nil && b.reset != "" && r.Breaker.Reset(o.policy.Name, b.reset, o.now.Time) {
		// Honoured once per token, however many nodes it woke.
		happened = append(happened, announcement{regarding: o.policy, eventType: corev1.EventTypeNormal,
			reason: gpuhealthv1alpha1.ReasonCircuitBreakerOpen, action: "Reset",
			note: fmt.Sprintf("circuit breaker reset by annotation %s=%s", gpuhealthv1alpha1.ResetCircuitBreakerAnnotation, b.reset)})
		allowed, st := r.Breaker.Check(o.policy.Name, b.settings, o.now.Time)
		b.allowed, b.message = allowed, st.Message
	}
	if nw := o.network; nw != nil && nw.reset != "" && r.Breaker.Reset(nw.key, nw.reset, o.now.Time) {
		happened = append(happened, announcement{regarding: o.policy, eventType: corev1.EventTypeNormal,
			reason: gpuhealthv1alpha1.ReasonCircuitBreakerOpen, action: "Reset",
			note: fmt.Sprintf("network circuit breaker of %s reset by annotation %s=%s", nw.group, gpuhealthv1alpha1.ResetCircuitBreakerAnnotation, nw.reset)})
		allowed, st := r.Breaker.Check(nw.key, nw.settings, o.now.Time)
		nw.allowed, nw.message = allowed, st.Message
	}
	if o.drains {
		started := o.now.Time
		if ds := o.nh.Status.Drain; ds != nil && ds.StartedAt != nil {
			started = ds.StartedAt.Time
		}
		res, err := r.Drainer.Drain(ctx, o.node.Name, o.policy.Spec.Drain, started)
		o.drain = &drainPass{result: res, err: err}
		for _, p := range res.ForceDeleted {
			happened = append(happened, o.nodeAnnouncement(corev1.EventTypeWarning, gpuhealthv1alpha1.ReasonForceDeleted, "Drain",
				"deleted pod "+p.String()+" after the drain timeout"))
		}
	}
	r.drainDevices(ctx, o)
	publish(r.Recorder, happened)
}

// apply carries out what must happen before the status is written: the
// NodeHealth's creation, the fence, keeping the node out of service, the
// Jobs and the deletion of a dead member's daemon pods. Every step is
// idempotent, so a pass that fails part-way is repeated safely. A fence
// that went through keeps the ticket's quarantine.
func (r *Reconciler) apply(ctx context.Context, o *observation, p *plan, t *ticket) error {
	logger := log.FromContext(ctx)
	if p.createNodeHealth {
		if err := r.createNodeHealth(ctx, o); err != nil {
			return err
		}
	}
	taint := nodepkg.Taint(o.policy.Spec.Quarantine.Taint)
	switch p.node {
	case nodeFence:
		err := r.writeNode(o, func(n *corev1.Node) error {
			return nodepkg.Quarantine(ctx, r.Client, n, policyCordons(o.policy), taint, phaseLabel(o.policy, gpuhealthv1alpha1.PhaseQuarantined))
		})
		if err != nil {
			return err
		}
		t.keep()
		logger.Info("Fenced node", "findings", describe(countingOf(p.judged)))
		r.storm.fenced(o.node.Name)
	case nodeOutOfService:
		err := r.writeNode(o, func(n *corev1.Node) error {
			if err := nodepkg.Quarantine(ctx, r.Client, n, policyCordons(o.policy), taint, phaseLabel(o.policy, p.status.Phase)); err != nil {
				return err
			}
			return nodepkg.SetGPUHealthy(ctx, r.Client, n, corev1.ConditionFalse, p.nodeReason, gpuhealthv1alpha1.Truncate(p.nodeMessage, 1024), o.now)
		})
		if err != nil {
			return err
		}
	case nodeUncertified:
		err := r.writeNode(o, func(n *corev1.Node) error {
			if err := nodepkg.HoldUncertified(ctx, r.Client, n, phaseLabel(o.policy, p.status.Phase)); err != nil {
				return err
			}
			return nodepkg.SetGPUHealthy(ctx, r.Client, n, corev1.ConditionFalse, p.nodeReason, gpuhealthv1alpha1.Truncate(p.nodeMessage, 1024), o.now)
		})
		if err != nil {
			return err
		}
	}
	if p.node == nodeHeld {
		err := r.writeNode(o, func(n *corev1.Node) error {
			return nodepkg.SetGPUHealthy(ctx, r.Client, n, corev1.ConditionUnknown, p.nodeReason, gpuhealthv1alpha1.Truncate(p.nodeMessage, 1024), o.now)
		})
		if err != nil {
			return err
		}
	}
	if p.deleteJobs {
		deleted, err := job.DeleteUnfinished(ctx, r.Client, o.namespace, o.node.Name)
		if err != nil {
			return err
		}
		if len(deleted) > 0 {
			logger.Info("Deleted unfinished jobs of a workflow that ended", "jobs", deleted)
			publish(r.Recorder, []announcement{o.nodeAnnouncement(corev1.EventTypeNormal, gpuhealthv1alpha1.ReasonJobsDeleted, "Delete",
				"deleted unfinished jobs "+strings.Join(deleted, ", ")+": the node's workflow ended")})
		}
	}
	if err := r.applyDevices(ctx, p); err != nil {
		return err
	}
	for _, want := range p.createJobs {
		if _, err := job.Ensure(ctx, r.Client, want); err != nil {
			if want.Labels[job.KindLabel] == string(job.Diagnostics) {
				// Evidence never holds the reset back: a diagnostics Job
				// the apiserver refuses (a quota, a webhook) is asked for
				// again each pass and taken for gone after its timeout.
				logger.Error(err, "Could not create the diagnostics job; the reset or reboot goes ahead at its timeout", "job", want.Name)
				continue
			}
			return err
		}
	}
	if err := r.applyHandOff(ctx, p); err != nil {
		return err
	}
	if err := r.applyWithdraw(ctx, o, p); err != nil {
		return err
	}
	if p.removeDomainLabel {
		err := r.writeNode(o, func(n *corev1.Node) error {
			return member.RemoveLabel(ctx, r.Client, n, computedomain.NodeLabel)
		})
		if err != nil {
			return err
		}
	}
	for _, pod := range p.deleteDaemonPods {
		since := p.status.ComputeDomain.DeadSince.UTC().Format(time.RFC3339)
		logger.Info("Deleting stale ComputeDomain daemon pod of a dead member", "Pod", klog.KObj(pod), "notReadySince", since)
		if err := member.DeleteStalePod(ctx, r.Client, o.node, pod); err != nil {
			return err
		}
		staleDaemonPodsDeleted.Inc()
		// Announced at once: the pod is gone whatever the status write does.
		done := []announcement{o.nodeAnnouncement(corev1.EventTypeWarning, gpuhealthv1alpha1.ReasonStaleDaemonPodDeleted, "Delete",
			fmt.Sprintf("deleted ComputeDomain daemon pod %s/%s of the dead node (NotReady since %s)", pod.Namespace, pod.Name, since))}
		if a, ok := domainAnnouncement(o, p.status.ComputeDomain, corev1.EventTypeWarning, gpuhealthv1alpha1.ReasonStaleDaemonPodDeleted, "Delete",
			fmt.Sprintf("node %s is dead (NotReady since %s, fenced): deleted its daemon pod %s so the other members drop it", o.node.Name, since, pod.Name)); ok {
			done = append(done, a)
		}
		publish(r.Recorder, done)
	}
	return nil
}

// applyAfterWrite carries out what must follow the status write: a node
// returns to service only once its NodeHealth says Healthy, so a crash in
// between never fences it again.
func (r *Reconciler) applyAfterWrite(ctx context.Context, o *observation, p *plan) error {
	if err := r.returnDevices(ctx, o, p); err != nil {
		return err
	}
	if p.node != nodeInService {
		return nil
	}
	owned := releasable(&o.nh.Status, nodepkg.Taint(o.policy.Spec.Quarantine.Taint))
	return r.writeNode(o, func(n *corev1.Node) error {
		if err := nodepkg.Release(ctx, r.Client, n, owned); err != nil {
			return err
		}
		if _, err := nodepkg.ReleaseUncertified(ctx, r.Client, n); err != nil {
			return err
		}
		return nodepkg.SetGPUHealthy(ctx, r.Client, n, corev1.ConditionTrue, p.nodeReason, p.nodeMessage, o.now)
	})
}

// createNodeHealth creates the node's NodeHealth, owned by the Node so that
// deleting the Node deletes it, and makes it the observed one, whose status
// record writes. AlreadyExists means our cache was behind: the pass is
// repeated (see retryOn).
func (r *Reconciler) createNodeHealth(ctx context.Context, o *observation) error {
	nh := &gpuhealthv1alpha1.NodeHealth{ObjectMeta: metav1.ObjectMeta{Name: o.node.Name}}
	if err := controllerutil.SetOwnerReference(o.node, nh, r.Client.Scheme()); err != nil {
		return fmt.Errorf("owning nodehealth %s: %w", nh.Name, err)
	}
	if err := r.Client.Create(ctx, nh); err != nil {
		return fmt.Errorf("creating nodehealth %s: %w", nh.Name, err)
	}
	o.nh, o.nhMissing = nh, false
	return nil
}

// writeNode runs writes on a copy of the observed Node and, when one went
// through, expects the cache to move past the observed version before the
// node is decided on again.
func (r *Reconciler) writeNode(o *observation, write func(*corev1.Node) error) error {
	n := o.node.DeepCopy()
	err := write(n)
	r.expect.wrote(kindNode, o.node.Name, o.node.ResourceVersion, n.ResourceVersion)
	return err
}

// applyHandOff makes the hand-off decided; idempotent, so a pass whose
// status write fails repeats it harmlessly.
func (r *Reconciler) applyHandOff(ctx context.Context, p *plan) error {
	t := p.handOff
	if t == nil {
		return nil
	}
	if t.want == nil {
		return handoff.AnnotateMachine(ctx, r.HandOff, t.obj, p.handedOff.Reason)
	}
	if t.obj != nil {
		return nil
	}
	return handoff.Create(ctx, r.HandOff, t.want)
}

// applyWithdraw takes back a hand-off the plan ends (see withdrawHandOff).
// What is gone already, or cannot be read for good, has nothing to take back.
func (r *Reconciler) applyWithdraw(ctx context.Context, o *observation, p *plan) error {
	h := p.withdraw
	if h == nil {
		return nil
	}
	var err error
	switch {
	case h.TargetRef != nil:
		// Exactly what was handed the node, whatever the policy says now.
		want := handoff.FromRef(h.TargetRef)
		if h.Type == gpuhealthv1alpha1.HandOffClusterAPI {
			var m *unstructured.Unstructured
			if m, err = handoff.Get(ctx, r.HandOff, want); err == nil && handoff.Same(h.TargetRef, m) {
				err = handoff.Unannotate(ctx, r.HandOff, m)
			}
			break
		}
		err = handoff.DeleteOwned(ctx, r.HandOff, r.HandOff, want, o.nh.UID, h.TargetRef.UID)
	// A hand-off recorded without its target whole (by an earlier
	// operator) is found as the policy names it now.
	case h.Type == gpuhealthv1alpha1.HandOffClusterAPI:
		var m *unstructured.Unstructured
		if m, err = handoff.GetMachine(ctx, r.HandOff, r.HandOff, o.node); err == nil {
			err = handoff.Unannotate(ctx, r.HandOff, m)
		}
	case h.Type == gpuhealthv1alpha1.HandOffTemplate:
		spec := o.policy.Spec.Remediation.HandOff
		if spec == nil || spec.Template == nil {
			return nil
		}
		var want *unstructured.Unstructured
		if want, err = r.renderHandOff(o); err == nil {
			err = handoff.DeleteOwned(ctx, r.HandOff, r.HandOff, want, o.nh.UID, "")
		}
	}
	if errors.Is(err, handoff.ErrPermanent) {
		// Gone, or not ours to take back (no RBAC): the node's return must
		// not wait for it.
		log.FromContext(ctx).Info("Could not take the hand-off back", "type", h.Type, "reason", err.Error())
		return nil
	}
	return err
}
