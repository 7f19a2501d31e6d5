package nodehealth

import (
	"context"
	"fmt"
	"strings"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/remediation/fsm"
)

// handleRequest carries out spec.request once per id and records it in
// status.lastRequest with who asked.
func (r *Reconciler) handleRequest(ctx context.Context, s *scope) error {
	req := s.nh.Spec.Request
	if req == nil || (s.nh.Status.LastRequest != nil && s.nh.Status.LastRequest.ID == req.ID) {
		return nil
	}
	by := requester(s.nh)
	result := ""
	var err error
	phase := s.machine.Phase()
	switch req.Action {
	case gpuhealthv1alpha1.RequestRelease:
		if phase == gpuhealthv1alpha1.PhaseHealthy {
			result = "nothing to do: the node is already Healthy"
			break
		}
		msg := fmt.Sprintf("released without recertification by %s: %s", by, req.Reason)
		err = r.closeFindings(ctx, s, fsm.Release, ReasonManualRelease, msg, by)
		result = "released from " + string(phase)
	case gpuhealthv1alpha1.RequestRecertify:
		switch phase {
		case gpuhealthv1alpha1.PhaseHealthy:
			err = r.transition(ctx, s, fsm.Quarantine, ReasonManualRecertify, fmt.Sprintf("recertification requested by %s: %s", by, req.Reason), by)
			result = "quarantined for recertification"
		case gpuhealthv1alpha1.PhaseFailed:
			err = r.transition(ctx, s, fsm.Retry, ReasonManualRecertify, fmt.Sprintf("recertification requested by %s: %s", by, req.Reason), by)
			// A fresh start: attempts count from 1 again.
			s.nh.Status.Recertification = nil
			result = "retrying from Failed with fresh attempts"
		default:
			result = "nothing to do: recertification is already under way (" + string(phase) + ")"
		}
	}
	if err != nil {
		return err
	}
	s.nh.Status.LastRequest = &gpuhealthv1alpha1.HandledRequest{ID: req.ID, Action: req.Action, By: truncate(by, 512), Time: s.now, Result: result}
	return nil
}

// requester names who asked: the request's requestedBy and the field
// manager that last wrote spec.request (from managedFields, which the
// apiserver maintains and a client cannot forge for another manager's write).
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
