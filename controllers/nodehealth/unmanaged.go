package nodehealth

import (
	"context"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/remediation/job"
)

// A node that leaves management — no policy selects it any more (its
// labels changed, its policy was deleted) — is held where it is, not
// returned: gpuhealth's cordon, taints and phase label stay on a node that
// was out of service, since its GPUs were found faulty and nobody has said
// otherwise (a policy deleted by mistake must not put every broken node
// back in service). What stops is every act: its unfinished reset, reboot
// and recertification Jobs are deleted (privileged Jobs do not run without
// a manager), and its NodeHealth says Managed=False, NotSelected, and what
// stays. It is returned when a policy manages it again (the workflow goes
// on) or when a human lifts the cordon and taint. Excluding a node
// (spec.exclude) follows the same rule (decide).

// leftManagement holds a node no policy manages any more (see above):
// read, plan, act.
func (r *Reconciler) leftManagement(ctx context.Context, name string) error {
	nh := &gpuhealthv1alpha1.NodeHealth{}
	if err := r.Client.Get(ctx, client.ObjectKey{Name: name}, nh); err != nil {
		return client.IgnoreNotFound(err)
	}
	if !r.expect.caughtUp(kindNodeHealth, name, nh) {
		return nil // our write is on its way; the next pass sees it
	}
	if heldAlready(&nh.Status) {
		return nil
	}
	deleted, err := job.DeleteUnfinished(ctx, r.Client, r.Namespace, name)
	if err != nil {
		return err
	}
	status := nh.Status.DeepCopy()
	if !notSelected(status, nh.Generation, deleted, metav1.NewTime(r.Clock.Now())) {
		return nil
	}
	patched := nh.DeepCopy()
	patched.Status = *status
	if err := r.Client.Status().Patch(ctx, patched, client.MergeFromWithOptions(nh, client.MergeFromWithOptimisticLock{})); err != nil {
		if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("patching status of nodehealth %s: %w", name, err)
	}
	r.expect.wrote(kindNodeHealth, name, nh.ResourceVersion, patched.ResourceVersion)
	c := meta.FindStatusCondition(status.Conditions, gpuhealthv1alpha1.NodeHealthManagedCondition)
	log.FromContext(ctx).Info("Node left management", "phase", status.Phase, "deletedJobs", deleted)
	publish(r.Recorder, []announcement{{regarding: &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, related: patched,
		eventType: corev1.EventTypeWarning, reason: gpuhealthv1alpha1.ReasonNotSelected, action: "Release", note: c.Message}})
	return nil
}

// heldAlready says whether a node that left management needs nothing more:
// it is in service (only a node out of service runs Jobs) and already says
// NotSelected. Every pass of every once-managed node no policy selects (a
// deleted policy's whole fleet, each Node heartbeat) then ends at a cached
// read instead of listing Jobs.
func heldAlready(st *gpuhealthv1alpha1.NodeHealthStatus) bool {
	c := meta.FindStatusCondition(st.Conditions, gpuhealthv1alpha1.NodeHealthManagedCondition)
	inService := st.Phase == "" || st.Phase == gpuhealthv1alpha1.PhaseHealthy
	return inService && c != nil && c.Status == metav1.ConditionFalse && c.Reason == gpuhealthv1alpha1.ReasonNotSelected
}

// notSelected sets the Managed condition of a NodeHealth whose node no
// policy selects, saying what stays on the node, and reports whether it
// changed anything.
func notSelected(st *gpuhealthv1alpha1.NodeHealthStatus, generation int64, deleted []string, now metav1.Time) bool {
	msg := "no RemediationPolicy selects the node any more"
	switch st.Phase {
	case "", gpuhealthv1alpha1.PhaseHealthy:
	default:
		msg += fmt.Sprintf("; it left in phase %s, and gpuhealth's cordon, taints and phase label stay until a policy manages it again or a human lifts them", st.Phase)
	}
	if len(deleted) > 0 {
		msg += "; deleted its unfinished jobs " + strings.Join(deleted, ", ")
	}
	c := meta.FindStatusCondition(st.Conditions, gpuhealthv1alpha1.NodeHealthManagedCondition)
	if c != nil && c.Status == metav1.ConditionFalse && c.Reason == gpuhealthv1alpha1.ReasonNotSelected && len(deleted) == 0 {
		return false
	}
	return meta.SetStatusCondition(&st.Conditions, metav1.Condition{
		Type: gpuhealthv1alpha1.NodeHealthManagedCondition, Status: metav1.ConditionFalse, Reason: gpuhealthv1alpha1.ReasonNotSelected,
		Message: gpuhealthv1alpha1.Truncate(msg, 1024), ObservedGeneration: generation, LastTransitionTime: now,
	})
}
