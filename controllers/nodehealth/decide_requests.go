package nodehealth

import (
	"fmt"
	"strings"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/remediation/fsm"
)

// request carries out spec.request once per id and records it in
// status.lastRequest with who asked.
func (d *decider) request() {
	nh := d.o.nh
	if !newRequest(nh) {
		return
	}
	req := nh.Spec.Request
	by := requester(nh)
	result := ""
	phase := d.machine.Phase()
	switch req.Action {
	case gpuhealthv1alpha1.RequestRelease:
		if phase == gpuhealthv1alpha1.PhaseHealthy {
			result = "nothing to do: the node is already Healthy"
			break
		}
		d.closeFindings(fsm.Release, gpuhealthv1alpha1.ReasonManualRelease, fmt.Sprintf("released without recertification by %s: %s", by, req.Reason), by)
		result = "released from " + string(phase)
	case gpuhealthv1alpha1.RequestRecertify:
		msg := fmt.Sprintf("recertification requested by %s: %s", by, req.Reason)
		switch phase {
		case gpuhealthv1alpha1.PhaseHealthy:
			d.transition(fsm.Quarantine, gpuhealthv1alpha1.ReasonManualRecertify, msg, by)
			result = "quarantined for recertification"
		case gpuhealthv1alpha1.PhaseMaintenance:
			result = d.returnFromMaintenance(msg, by)
		case gpuhealthv1alpha1.PhaseFailed:
			d.transition(fsm.Retry, gpuhealthv1alpha1.ReasonManualRecertify, msg, by)
			// A fresh start: attempts count from 1 again.
			d.p.status.Recertification = nil
			result = "retrying from Failed with fresh attempts"
		default:
			result = "nothing to do: recertification is already under way (" + string(phase) + ")"
		}
	case gpuhealthv1alpha1.RequestMaintenance:
		result = d.maintenanceRequest(by, req.Reason)
	case gpuhealthv1alpha1.RequestApprove:
		result = d.approve(by, req.Reason)
	}
	d.p.status.LastRequest = &gpuhealthv1alpha1.HandledRequest{ID: req.ID, Action: req.Action, By: gpuhealthv1alpha1.Truncate(by, 512), Time: d.o.now, Result: result}
}

// requester names who asked: the request's requestedBy, which the
// install's admission policy (config/nodehealth/request_policy.yaml) holds
// to the user name that wrote the request, and the field manager that last
// wrote spec.request (from managedFields: the client chooses its manager
// name, so it says which tool, not who).
func requester(nh *gpuhealthv1alpha1.NodeHealth) string {
	var who []string
	if nh.Spec.Request.RequestedBy != "" {
		who = append(who, nh.Spec.Request.RequestedBy)
	}
	for _, mf := range nh.ManagedFields {
		if mf.FieldsV1 != nil && mf.Subresource == "" && strings.Contains(mf.FieldsV1.GetRawString(), `"f:request"`) {
			who = append(who, "manager "+mf.Manager)
		}
	}
	if len(who) == 0 {
		return "unknown"
	}
	return strings.Join(who, ", ")
}
