package nodehealth

import (
	"context"
	"errors"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/remediation/handoff"
)

// handOffTarget is what observe found for a failed node's hand-off.
type handOffTarget struct {
	// obj is the Machine, or the object the template names once it exists.
	obj *unstructured.Unstructured
	// want is the rendered template (type Template).
	want *unstructured.Unstructured
	// err says why the hand-off cannot be made (permanent).
	err error
}

// observeHandOff reads what a failed node's hand-off needs: the Machine, or
// the rendered template (when the install allows its kind) and the object
// it names; all of it as the hand-off's identity (Reconciler.HandOff). A permanent failure is
// part of the observation (decide records it); any other error fails the pass.
func (r *Reconciler) observeHandOff(ctx context.Context, o *observation) (*handOffTarget, error) {
	spec := o.policy.Spec.Remediation.HandOff
	t := &handOffTarget{}
	var err error
	switch spec.Type {
	case gpuhealthv1alpha1.HandOffClusterAPI:
		t.obj, err = handoff.GetMachine(ctx, r.HandOff, r.HandOff, o.node)
	case gpuhealthv1alpha1.HandOffTemplate:
		t.want, err = r.renderHandOff(o)
		if err == nil {
			t.obj, err = handoff.Get(ctx, r.HandOff, t.want)
		}
		if err == nil && t.obj == nil && o.nh.Status.HandOff == nil {
			err = handoff.Check(ctx, r.HandOff, t.want)
		}
	default:
		return nil, nil
	}
	if errors.Is(err, handoff.ErrPermanent) {
		t.err = err
		return t, nil
	}
	return t, err
}

// renderHandOff renders the policy's template for the node and checks that
// the install allows a hand-off to create it (handoff.Allowed.Permit).
func (r *Reconciler) renderHandOff(o *observation) (*unstructured.Unstructured, error) {
	want, err := handoff.Render(o.policy.Spec.Remediation.HandOff.Template, handOffData(o), nodeHealthOwner(o))
	if err != nil {
		return nil, err
	}
	allowed := handoff.Allowed{Resources: r.HandOffResources, Namespace: r.Namespace}
	if err := allowed.Permit(r.HandOff.RESTMapper(), want); err != nil {
		return nil, err
	}
	return want, nil
}
