package node

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
)

// Every write to a Node is a patch (merge patches with an optimistic lock
// for the lists), never an update of the whole object.
// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups="",resources=nodes/status,verbs=patch

const (
	// AppliedAnnotation records on the Node what gpuhealth added, as a
	// comma-separated list of "cordon" and "taint=<key>:<effect>" (one per
	// taint it added). It is written in the same patch as the cordon and
	// the taint, so after a crash the operator still knows which cordon and
	// which taints are its own: what it does not list was there before, and
	// Release removes what it lists, whatever the policy's taint is by then,
	// when the NodeHealth's status names it too (see Release). (A bare
	// "taint", written by earlier operators, stands for the policy's taint.)
	AppliedAnnotation = "gpuhealth.dev/applied"
	// PhaseLabel mirrors NodeHealth.status.phase on the Node while it is out of service.
	PhaseLabel = "gpuhealth.dev/phase"

	appliedCordon = "cordon"
	appliedTaint  = "taint"
)

// Applied is what gpuhealth added to a node.
type Applied struct {
	Cordon bool
	// Taints are the taints it added, by key and effect.
	Taints []corev1.Taint
	// PolicyTaint: an earlier operator's record of "the policy's taint",
	// without saying which.
	PolicyTaint bool
}

// AppliedOn reads what gpuhealth added to the node.
func AppliedOn(n *corev1.Node) Applied {
	v, ok := n.Annotations[AppliedAnnotation]
	if !ok {
		return Applied{}
	}
	var a Applied
	for part := range strings.SplitSeq(v, ",") {
		switch key, t, isTaint := strings.Cut(part, "="); {
		case part == appliedCordon:
			a.Cordon = true
		case part == appliedTaint:
			a.PolicyTaint = true
		case isTaint && key == appliedTaint:
			if i := strings.LastIndexByte(t, ':'); i > 0 {
				a.Taints = append(a.Taints, corev1.Taint{Key: t[:i], Effect: corev1.TaintEffect(t[i+1:])})
			}
		}
	}
	return a
}

func (a Applied) String() string {
	var parts []string
	if a.Cordon {
		parts = append(parts, appliedCordon)
	}
	if a.PolicyTaint {
		parts = append(parts, appliedTaint)
	}
	for _, t := range a.Taints {
		parts = append(parts, appliedTaint+"="+t.Key+":"+string(t.Effect))
	}
	return strings.Join(parts, ",")
}

// Any says whether gpuhealth added anything.
func (a Applied) Any() bool { return a.Cordon || a.PolicyTaint || len(a.Taints) > 0 }

// owns says whether gpuhealth added taint t (by key and effect); policy is
// the policy's taint, which an earlier operator's bare record stands for.
func (a Applied) owns(t, policy *corev1.Taint) bool {
	return slices.ContainsFunc(a.Taints, sameTaint(*t)) || a.PolicyTaint && policy != nil && sameTaint(*policy)(*t)
}

// HumanUncordoned says whether someone lifted the cordon gpuhealth put on the node.
func HumanUncordoned(n *corev1.Node) bool {
	return AppliedOn(n).Cordon && !n.Spec.Unschedulable
}

// Taint converts the policy's taint into a Node taint.
func Taint(t *gpuhealthv1alpha1.TaintSpec) *corev1.Taint {
	if t == nil {
		return nil
	}
	return &corev1.Taint{Key: t.Key, Value: t.Value, Effect: t.Effect}
}

func hasTaint(n *corev1.Node, t *corev1.Taint) bool {
	return slices.ContainsFunc(n.Spec.Taints, sameTaint(*t))
}

// Preexisting is what was on the node before gpuhealth first quarantined it.
type Preexisting struct {
	Cordon bool
	Taints []corev1.Taint
}

// PreexistingOn says what of gpuhealth's cordon and taint was on the node
// without gpuhealth having added it: a human's (or another tool's).
func PreexistingOn(n *corev1.Node, taint *corev1.Taint) Preexisting {
	applied := AppliedOn(n)
	var pre Preexisting
	pre.Cordon = n.Spec.Unschedulable && !applied.Cordon
	if taint != nil && !applied.owns(taint, taint) {
		for _, t := range n.Spec.Taints {
			if t.Key == taint.Key && t.Effect == taint.Effect {
				pre.Taints = append(pre.Taints, t)
			}
		}
	}
	return pre
}

// Quarantine cordons (when cordon is true) and taints (when taint is set)
// the node and sets the phase label (when label is non-empty), patching only
// what differs, and records what it added in AppliedAnnotation (what was
// there before is then PreexistingOn).
func Quarantine(ctx context.Context, c client.Client, n *corev1.Node, cordon bool, taint *corev1.Taint, label string) error {
	before := AppliedOn(n)
	orig := n.DeepCopy()
	patch := client.MergeFromWithOptions(orig, client.MergeFromWithOptimisticLock{})
	after := before
	if cordon && !n.Spec.Unschedulable {
		n.Spec.Unschedulable = true
		after.Cordon = true
	}
	if taint != nil && !hasTaint(n, taint) {
		t := *taint
		n.Spec.Taints = append(n.Spec.Taints, t)
		after.Taints = append(after.Taints, corev1.Taint{Key: t.Key, Effect: t.Effect})
	}
	if n.Annotations == nil {
		n.Annotations = map[string]string{}
	}
	if after.Any() {
		n.Annotations[AppliedAnnotation] = after.String()
	}
	setLabel(n, label)
	if equality.Semantic.DeepEqual(orig, n) {
		// Nothing to change: no request (an optimistic-lock patch is never empty).
		return nil
	}
	if err := c.Patch(ctx, n, patch); err != nil {
		return fmt.Errorf("quarantining node %s: %w", n.Name, err)
	}
	return nil
}

func hasLabel(n *corev1.Node) bool {
	_, ok := n.Labels[PhaseLabel]
	return ok
}

func setLabel(n *corev1.Node, phase string) {
	if phase == "" {
		delete(n.Labels, PhaseLabel)
		return
	}
	if n.Labels == nil {
		n.Labels = map[string]string{}
	}
	n.Labels[PhaseLabel] = phase
}

// Release lifts what gpuhealth added and the phase label: its cordon, and
// each taint that both AppliedAnnotation and owned name (by key and
// effect), whatever the policy's taint is by then. owned comes from the
// NodeHealth's status, which only the operator writes; the annotation is
// on the Node, which the node's own kubelet may also write, and NodeRestriction
// forbids a kubelet to change its own taints, so the annotation alone must
// never make gpuhealth remove one. (The cordon needs no such check: a
// kubelet may uncordon its own node.) A cordon or taint that was there
// before stays. An earlier operator's bare "taint" record stands for the
// owned taints.
func Release(ctx context.Context, c client.Client, n *corev1.Node, owned []corev1.Taint) error {
	if _, ok := n.Annotations[AppliedAnnotation]; !ok && !hasLabel(n) {
		return nil
	}
	applied := AppliedOn(n)
	patch := client.MergeFromWithOptions(n.DeepCopy(), client.MergeFromWithOptimisticLock{})
	if applied.Cordon {
		n.Spec.Unschedulable = false
	}
	n.Spec.Taints = slices.DeleteFunc(n.Spec.Taints, func(x corev1.Taint) bool {
		return (applied.PolicyTaint || slices.ContainsFunc(applied.Taints, sameTaint(x))) && slices.ContainsFunc(owned, sameTaint(x))
	})
	delete(n.Annotations, AppliedAnnotation)
	setLabel(n, "")
	if err := c.Patch(ctx, n, patch); err != nil {
		return fmt.Errorf("releasing node %s: %w", n.Name, err)
	}
	return nil
}

// sameTaint matches a taint by key and effect, as the apiserver keys them.
func sameTaint(t corev1.Taint) func(corev1.Taint) bool {
	return func(x corev1.Taint) bool { return x.Key == t.Key && x.Effect == t.Effect }
}

// SetGPUHealthy sets the node's GPUHealthy condition, writing only when its
// status, reason or message changes (the transition time moves only with the status).
func SetGPUHealthy(ctx context.Context, c client.Client, n *corev1.Node, status corev1.ConditionStatus, reason, message string, now metav1.Time) error {
	idx := slices.IndexFunc(n.Status.Conditions, func(x corev1.NodeCondition) bool { return x.Type == gpuhealthv1alpha1.GPUHealthyNodeCondition })
	if idx >= 0 {
		cur := n.Status.Conditions[idx]
		if cur.Status == status && cur.Reason == reason && cur.Message == message {
			return nil
		}
	}
	patch := client.MergeFromWithOptions(n.DeepCopy(), client.MergeFromWithOptimisticLock{})
	cond := corev1.NodeCondition{Type: gpuhealthv1alpha1.GPUHealthyNodeCondition, Status: status, Reason: reason, Message: message, LastHeartbeatTime: now, LastTransitionTime: now}
	if idx >= 0 {
		if n.Status.Conditions[idx].Status == status {
			cond.LastTransitionTime = n.Status.Conditions[idx].LastTransitionTime
		}
		n.Status.Conditions[idx] = cond
	} else {
		n.Status.Conditions = append(n.Status.Conditions, cond)
	}
	if err := c.Status().Patch(ctx, n, patch); err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("setting condition %s on node %s: %w", gpuhealthv1alpha1.GPUHealthyNodeCondition, n.Name, err)
	}
	return nil
}

// FabricAnnotation records on a Node that gpuhealth added the fabric-degraded
// taint, with the NVLink clique it was added for as value. A fabric-degraded
// taint without it was put there by someone else and is never removed.
const FabricAnnotation = "gpuhealth.dev/fabric-degraded"

// FabricSinceAnnotation records on a Node when gpuhealth added the
// fabric-degraded taint (RFC 3339): the start of the clique's fault
// episode, which names its certification Jobs.
const FabricSinceAnnotation = "gpuhealth.dev/fabric-degraded-since"

// FabricTaint is the taint that keeps new ComputeDomains off a clique with
// a fabric fault. NoSchedule: running members are not evicted by it.
var FabricTaint = corev1.Taint{Key: gpuhealthv1alpha1.FabricDegradedTaintKey, Effect: corev1.TaintEffectNoSchedule}

// TaintFabric adds FabricTaint for clique and records it in
// FabricAnnotation, and since in FabricSinceAnnotation. It returns whether
// it changed the node. A node that already carries the taint without the
// annotation is left alone.
func TaintFabric(ctx context.Context, c client.Client, n *corev1.Node, clique string, since time.Time) (bool, error) {
	if hasTaint(n, &FabricTaint) {
		if v, ours := n.Annotations[FabricAnnotation]; !ours || v == clique {
			return false, nil
		}
	}
	patch := client.MergeFromWithOptions(n.DeepCopy(), client.MergeFromWithOptimisticLock{})
	if !hasTaint(n, &FabricTaint) {
		n.Spec.Taints = append(n.Spec.Taints, FabricTaint)
	}
	if n.Annotations == nil {
		n.Annotations = map[string]string{}
	}
	n.Annotations[FabricAnnotation] = clique
	n.Annotations[FabricSinceAnnotation] = since.UTC().Format(time.RFC3339)
	if err := c.Patch(ctx, n, patch); err != nil {
		return false, fmt.Errorf("tainting node %s fabric-degraded: %w", n.Name, err)
	}
	return true, nil
}

// RestampFabric moves FabricSinceAnnotation to since on a node gpuhealth
// tainted fabric-degraded: the clique's fault came back during its
// certification, and a new episode begins.
func RestampFabric(ctx context.Context, c client.Client, n *corev1.Node, since time.Time) error {
	if _, ours := n.Annotations[FabricAnnotation]; !ours {
		return nil
	}
	patch := client.MergeFromWithOptions(n.DeepCopy(), client.MergeFromWithOptimisticLock{})
	n.Annotations[FabricSinceAnnotation] = since.UTC().Format(time.RFC3339)
	if err := c.Patch(ctx, n, patch); err != nil {
		return fmt.Errorf("restamping the fabric-degraded episode of node %s: %w", n.Name, err)
	}
	return nil
}

// UntaintFabric removes the fabric-degraded taint gpuhealth added (per
// FabricAnnotation) and the annotation. It returns whether it changed the node.
func UntaintFabric(ctx context.Context, c client.Client, n *corev1.Node) (bool, error) {
	if _, ours := n.Annotations[FabricAnnotation]; !ours {
		return false, nil
	}
	patch := client.MergeFromWithOptions(n.DeepCopy(), client.MergeFromWithOptimisticLock{})
	n.Spec.Taints = slices.DeleteFunc(n.Spec.Taints, func(x corev1.Taint) bool {
		return x.Key == FabricTaint.Key && x.Effect == FabricTaint.Effect
	})
	delete(n.Annotations, FabricAnnotation)
	delete(n.Annotations, FabricSinceAnnotation)
	if err := c.Patch(ctx, n, patch); err != nil {
		return false, fmt.Errorf("lifting the fabric-degraded taint from node %s: %w", n.Name, err)
	}
	return true, nil
}

// UncertifiedAnnotation records on a Node that gpuhealth added the
// uncertified taint. An uncertified taint without it was put there by
// someone else and is never removed; the annotation without the taint means
// a human removed it.
const UncertifiedAnnotation = "gpuhealth.dev/uncertified"

// UncertifiedTaint holds a node out of service until its certification
// passes. NoSchedule and no cordon: DaemonSets and the certification Jobs
// (which tolerate every taint) still run there.
var UncertifiedTaint = corev1.Taint{Key: gpuhealthv1alpha1.UncertifiedTaintKey, Effect: corev1.TaintEffectNoSchedule}

// UncertifiedTaintRemoved says whether gpuhealth added the uncertified
// taint and someone has removed it since.
func UncertifiedTaintRemoved(n *corev1.Node) bool {
	_, ours := n.Annotations[UncertifiedAnnotation]
	return ours && !hasTaint(n, &UncertifiedTaint)
}

// HoldUncertified adds UncertifiedTaint (recording it in
// UncertifiedAnnotation) and sets the phase label (when label is non-empty),
// patching only what differs. A taint already there without the annotation
// is someone else's and is left as it is.
func HoldUncertified(ctx context.Context, c client.Client, n *corev1.Node, label string) error {
	orig := n.DeepCopy()
	patch := client.MergeFromWithOptions(orig, client.MergeFromWithOptimisticLock{})
	if !hasTaint(n, &UncertifiedTaint) {
		if _, ours := n.Annotations[UncertifiedAnnotation]; !ours {
			n.Spec.Taints = append(n.Spec.Taints, UncertifiedTaint)
			if n.Annotations == nil {
				n.Annotations = map[string]string{}
			}
			n.Annotations[UncertifiedAnnotation] = "taint"
		}
	}
	setLabel(n, label)
	if equality.Semantic.DeepEqual(orig, n) {
		return nil
	}
	if err := c.Patch(ctx, n, patch); err != nil {
		return fmt.Errorf("holding node %s uncertified: %w", n.Name, err)
	}
	return nil
}

// ReleaseUncertified removes the uncertified taint gpuhealth added (per
// UncertifiedAnnotation) and the annotation. It returns whether it changed
// the node.
func ReleaseUncertified(ctx context.Context, c client.Client, n *corev1.Node) (bool, error) {
	if _, ours := n.Annotations[UncertifiedAnnotation]; !ours {
		return false, nil
	}
	patch := client.MergeFromWithOptions(n.DeepCopy(), client.MergeFromWithOptimisticLock{})
	n.Spec.Taints = slices.DeleteFunc(n.Spec.Taints, func(x corev1.Taint) bool {
		return x.Key == UncertifiedTaint.Key && x.Effect == UncertifiedTaint.Effect
	})
	delete(n.Annotations, UncertifiedAnnotation)
	if err := c.Patch(ctx, n, patch); err != nil {
		return false, fmt.Errorf("lifting the uncertified taint from node %s: %w", n.Name, err)
	}
	return true, nil
}
