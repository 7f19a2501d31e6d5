package node

import (
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// UncordonedBy names, as far as the node's managedFields tell, who lifted
// the cordon gpuhealth put on it (HumanUncordoned), for events and logs.
// self is gpuhealth's own field manager (the operator's: without a
// FieldOwner, the name of its binary, from its User-Agent); its newest
// write to the node's object marks when the cordon was put on, at the
// latest. The apiserver leaves an entry's time alone when another writer
// takes or removes a field of it, so the uncordon does not move that mark.
//
// It names the newest writer of the node's object (status writers do not
// count) other than self whose entry is newer than self's newest, as
// "manager node-admin-tool (Update at 2026-11-30T12:00:05Z)", or "one of
// managers …" when several share that second. Failing that it says
// "unknown (managedFields name no writer of the uncordon)". The limits:
//
//   - An entry lists the fields its manager owns now, not what its request
//     changed, and the apiserver keeps no entry that owns nothing. An
//     uncordon removes spec.unschedulable (false is omitted like null), so a
//     request that did nothing else leaves no entry of its writer: not
//     kubectl uncordon (a strategic merge patch {"spec":{"unschedulable":
//     null}} with no field manager, named "kubectl" from its User-Agent),
//     not a merge patch of false, not an Update that changes only that.
//     Writers that do leave one are a server-side apply (its manager keeps
//     spec.unschedulable) and a request that changes more than the cordon.
//   - A writer named is the last one after gpuhealth's last write: most
//     likely the uncordon's, but a later write of another tool (a label, a
//     taint of the node controller) is named all the same, and whoever
//     uncordoned before that is not.
//   - Entry times have whole seconds: a write in the same second as
//     gpuhealth's last write cannot be ordered against it, so it is only
//     mentioned as such, never named as the writer.
//
// Call it before gpuhealth writes the node again: its own write moves self's
// entry past the uncordon.
func UncordonedBy(n *corev1.Node, self string) string {
	var ours *metav1.Time
	for i := range n.ManagedFields {
		e := &n.ManagedFields[i]
		if e.Manager == self && e.Subresource == "" && e.Time != nil && (ours == nil || e.Time.After(ours.Time)) {
			ours = e.Time
		}
	}
	if ours == nil {
		return fmt.Sprintf("unknown (managedFields hold no write of %s to tell the uncordon from earlier writes)", self)
	}
	var newest, tied []string
	var at time.Time
	for i := range n.ManagedFields {
		e := &n.ManagedFields[i]
		if e.Manager == self || e.Subresource != "" || e.Time == nil {
			continue
		}
		switch t := e.Time.Time; {
		case t.Equal(ours.Time):
			tied = append(tied, e.Manager)
		case !t.After(ours.Time):
		case len(newest) == 0 || t.After(at):
			newest, at = []string{describe(e)}, t
		case t.Equal(at):
			newest = append(newest, describe(e))
		}
	}
	switch len(newest) {
	case 0:
		why := "unknown (managedFields name no writer of the uncordon"
		if len(tied) > 0 {
			why += fmt.Sprintf("; %s wrote in the second of %s's last write, %s, before or after it",
				strings.Join(tied, ", "), self, ours.UTC().Format(time.RFC3339))
		}
		return why + ")"
	case 1:
		return "manager " + newest[0]
	default:
		return "one of managers " + strings.Join(newest, ", ")
	}
}

func describe(e *metav1.ManagedFieldsEntry) string {
	return fmt.Sprintf("%s (%s at %s)", e.Manager, e.Operation, e.Time.UTC().Format(time.RFC3339))
}
