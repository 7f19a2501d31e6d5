package nodehealth

import (
	"fmt"
	"slices"
	"time"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/remediation/fsm"
)

// Repair outcomes, the outcome label of gpuhealth_node_repair_duration_seconds.
const (
	outcomeRecertified = "recertified"
	outcomeReleased    = "released"
	outcomeCancelled   = "cancelled"
	outcomeFailed      = "failed"
)

// repairRecord is one fault outage that ended (Healthy or Failed), for the
// repair-duration histogram.
type repairRecord struct {
	action  gpuhealthv1alpha1.Action
	outcome string
	took    time.Duration
}

// faultGap is the time since the node's previous fault of the same class.
type faultGap struct {
	check gpuhealthv1alpha1.Check
	gap   time.Duration
}

// outage keeps status.outage in step with a transition: a node leaving
// service starts one (with its cause, and for a fault the most drastic
// finding), a node returning ends it. A fault outage's repair time is
// measured once: when it ends Healthy, or when it first ends Failed (a
// human's later return of a failed node is not a second repair).
func (d *decider) outage(from, to gpuhealthv1alpha1.NodeHealthPhase, reason string) {
	st, now := &d.p.status, d.o.now
	healthy := gpuhealthv1alpha1.PhaseHealthy
	switch {
	case to == healthy:
		if o := st.Outage; o != nil && o.Cause == gpuhealthv1alpha1.OutageFault && o.FailedAt == nil {
			d.p.repairs = append(d.p.repairs, repairRecord{action: o.Action, outcome: repairOutcome(reason), took: now.Sub(o.Since.Time)})
		}
		d.withdrawHandOff()
		st.Outage = nil
		return
	case d.dryRun():
		// A dry run takes nothing out of service.
	case from == healthy || from == gpuhealthv1alpha1.PhaseCertifying && to == gpuhealthv1alpha1.PhaseQuarantined:
		d.startOutage(to, reason)
	case from == gpuhealthv1alpha1.PhaseFailed:
		// Retried: a new hand-off may follow a new failure; the last one
		// is taken back.
		d.withdrawHandOff()
	}
	if o := st.Outage; to == gpuhealthv1alpha1.PhaseFailed && o != nil && o.FailedAt == nil {
		o.FailedAt = &now
		// The fault's action may have grown since the quarantine.
		if a := d.action(); o.Cause == gpuhealthv1alpha1.OutageFault && actionRank[a] > actionRank[o.Action] {
			o.Action = a
		}
		if o.Cause == gpuhealthv1alpha1.OutageFault {
			d.p.repairs = append(d.p.repairs, repairRecord{action: o.Action, outcome: outcomeFailed, took: now.Sub(o.Since.Time)})
		}
	}
}

// startOutage records why the node leaves service now.
func (d *decider) startOutage(to gpuhealthv1alpha1.NodeHealthPhase, reason string) {
	st, now := &d.p.status, d.o.now
	o := &gpuhealthv1alpha1.Outage{Since: now, Cause: outageCause(to, reason)}
	st.Outage = o
	if o.Cause != gpuhealthv1alpha1.OutageFault {
		return
	}
	o.Action = gpuhealthv1alpha1.ActionRecertify
	if j := d.worst(); j != nil {
		o.Check, o.Code, o.Action = j.event.Spec.Check, gpuhealthv1alpha1.Truncate(j.event.Spec.Code, 128), j.action
	}
	if o.Check == "" {
		return
	}
	i := slices.IndexFunc(st.LastFaults, func(m gpuhealthv1alpha1.FaultMark) bool { return m.Check == o.Check })
	if i >= 0 {
		d.p.faultGaps = append(d.p.faultGaps, faultGap{check: o.Check, gap: now.Sub(st.LastFaults[i].Time.Time)})
		st.LastFaults[i].Time = now
		return
	}
	if len(st.LastFaults) >= 16 {
		// The class seen longest ago makes room.
		oldest := 0
		for k := range st.LastFaults {
			if st.LastFaults[k].Time.Before(&st.LastFaults[oldest].Time) {
				oldest = k
			}
		}
		st.LastFaults = slices.Delete(st.LastFaults, oldest, oldest+1)
	}
	st.LastFaults = append(st.LastFaults, gpuhealthv1alpha1.FaultMark{Check: o.Check, Time: now})
}

// outageCause is why a node leaves service, from the transition that takes it out.
func outageCause(to gpuhealthv1alpha1.NodeHealthPhase, reason string) gpuhealthv1alpha1.OutageCause {
	switch {
	case to == gpuhealthv1alpha1.PhaseCertifying:
		return gpuhealthv1alpha1.OutageCertification
	case reason == gpuhealthv1alpha1.ReasonMaintenance:
		return gpuhealthv1alpha1.OutageMaintenance
	case reason == gpuhealthv1alpha1.ReasonManualRecertify:
		return gpuhealthv1alpha1.OutageRequest
	}
	return gpuhealthv1alpha1.OutageFault
}

// repairOutcome names how a fault outage ended Healthy: MTTR is reported
// from the recertified ones, without releases and cancels, which end a
// repair without proving it.
func repairOutcome(reason string) string {
	switch reason {
	case gpuhealthv1alpha1.ReasonRecertified:
		return outcomeRecertified
	case gpuhealthv1alpha1.ReasonManualRelease:
		return outcomeReleased
	}
	return outcomeCancelled
}

// worst is the counting finding with the most drastic action (the first
// of equals), nil when none counts.
func (d *decider) worst() *judgement {
	var best *judgement
	for _, j := range d.counting() {
		if best == nil || actionRank[j.action] > actionRank[best.action] {
			best = &j
		}
	}
	return best
}

// maintenanceRequest takes a Healthy node out for planned maintenance: it
// is quarantined, then drained like a faulty node under the same budgets,
// and held in Maintenance once drained.
func (d *decider) maintenanceRequest(by, reason string) string {
	phase := d.machine.Phase()
	switch {
	case d.dryRun():
		return "dry run: would quarantine the node for maintenance"
	case phase == gpuhealthv1alpha1.PhaseHealthy:
		d.transition(fsm.Quarantine, gpuhealthv1alpha1.ReasonMaintenance, fmt.Sprintf("maintenance requested by %s: %s", by, reason), by)
		return "quarantined for maintenance; it drains when the budgets allow"
	case phase == gpuhealthv1alpha1.PhaseMaintenance:
		return "nothing to do: the node is already in maintenance"
	}
	return "refused: the node is out of service already (" + string(phase) + "); release or recertify it first"
}

// maintained holds a drained node for maintenance; true when it did (the
// drain's next step is then not taken). A node whose outage is a
// maintenance and that has not started recertifying goes to Maintenance;
// one back from maintenance whose recertification failed drains again for
// its next attempt instead, and so does one that failed since and was
// retried.
func (d *decider) maintained() bool {
	st := &d.p.status
	if o := st.Outage; o == nil || o.Cause != gpuhealthv1alpha1.OutageMaintenance || o.FailedAt != nil || st.Recertification != nil {
		return false
	}
	d.transition(fsm.Maintain, gpuhealthv1alpha1.ReasonMaintenance,
		"drained; held for maintenance until a Recertify (the usual way back) or a Release request", "")
	return true
}

// returnFromMaintenance starts the recertification of a node back from
// maintenance; one whose findings (seen meanwhile) need a human goes to
// Failed instead.
func (d *decider) returnFromMaintenance(msg, by string) string {
	if a := d.action(); needsHuman(a) {
		d.transition(fsm.Fail, gpuhealthv1alpha1.ReasonNeedsHuman, fmt.Sprintf("%s; but the findings recommend %s: %s", msg, a, describe(d.counting())), by)
		return "back from maintenance: Failed, the findings recommend " + string(a)
	}
	if !d.transition(fsm.Recertify, gpuhealthv1alpha1.ReasonManualRecertify, msg, by) {
		return ""
	}
	now := d.o.now
	d.p.status.Recertification = &gpuhealthv1alpha1.RecertificationStatus{Attempt: 1, StartedAt: &now, Result: gpuhealthv1alpha1.JobPending}
	d.attemptStarted = true
	return "back from maintenance: recertifying"
}
