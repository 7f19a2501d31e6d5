package nodehealth

import (
	"fmt"
	"strings"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/internal/readiness"
	"github.com/gpuhealth/gpuhealth/remediation/fsm"
	"github.com/gpuhealth/gpuhealth/remediation/job"
)

// recertifying runs the remediation step, the recertification Job and the
// soak window, then returns the node or counts a failed attempt.
func (d *decider) recertifying() {
	d.outOfService()
	o, st := d.o, &d.p.status
	if d.held("recertification is paused") {
		return
	}
	rc, wait := d.currentAttempt(&st.Recertification)
	if wait {
		return
	}
	if d.dryRun() {
		return
	}
	spec := o.policy.Spec
	if rc.Remediation == "" {
		// Fixed once per attempt: a finding that asks for more later waits
		// for the next attempt instead of acting beside this one.
		rc.Remediation = gpuhealthv1alpha1.ActionNone
		if kind, step := remediationStep(d.action(), spec.Remediation); step != nil {
			rc.Remediation = remediationAction(kind)
		}
	}
	if kind, step := remediationStep(rc.Remediation, spec.Remediation); step != nil && rc.RemediatedAt == nil {
		// Evidence first, then asked before the step starts; once under
		// way it is not stopped.
		if rc.RemediationStartedAt == nil && rc.RemediationJob == "" && (!d.diagnosed(kind, rc) || !d.approved(remediationAction(kind), attemptSubject(rc))) {
			return
		}
		if !d.remediated(kind, step, rc) {
			return
		}
		rc.RemediatedAt = &o.now
	}
	steps := recertificationSteps(spec.Recertification)
	if rc.CompletedAt == nil {
		done, passed, why := d.runSuite(job.Recertification, gpuhealthv1alpha1.SuiteRecertification, steps, spec.Recertification.MaxNotRun, rc, gpuhealthv1alpha1.ReasonRecertifying)
		if !done {
			return
		}
		if !passed {
			if rc.Result == gpuhealthv1alpha1.JobNotRun {
				d.suiteNotRun(gpuhealthv1alpha1.SuiteRecertification, rc, why)
				return
			}
			d.failAttempt(why)
			return
		}
		rc.CompletedAt = &o.now
		rc.Result = gpuhealthv1alpha1.JobSucceeded
		if len(steps) == 0 {
			rc.Message = "no recertification suite configured; the soak window decides"
		}
	}
	for _, j := range d.counting() {
		if j.event.Status.LastSeen != nil && j.event.Status.LastSeen.After(rc.StartedAt.Time) {
			// Overtaken, not failed by its test: the next attempt runs for
			// the new finding (it still counts, so a node that keeps
			// faulting ends Failed).
			d.failAttempt("superseded by a new finding during recertification: " + describe([]judgement{j}))
			rc.Result = gpuhealthv1alpha1.JobSuperseded
			return
		}
	}
	soakEnd := rc.CompletedAt.Add(spec.Recertification.SoakWindow.Get(defaultSoak))
	if o.now.Before(&metav1.Time{Time: soakEnd}) {
		d.statusReason(gpuhealthv1alpha1.ReasonSoaking, fmt.Sprintf("recertification passed; soaking until %s", soakEnd.UTC().Format(time.RFC3339)))
		d.wait(soakEnd.Sub(o.now.Time))
		return
	}
	requireFabric := spec.Recertification.RequireFabricHealthy == nil || *spec.Recertification.RequireFabricHealthy
	var open []judgement
	for _, j := range d.p.judged {
		if j.phase != gpuhealthv1alpha1.EventActive || j.event.Spec.IsPoint() {
			continue
		}
		if j.counts || (requireFabric && j.event.Spec.IsFabric()) {
			open = append(open, j)
		}
	}
	if len(open) > 0 {
		d.statusReason(gpuhealthv1alpha1.ReasonWaitingForResolution, "recertification passed; waiting for findings to clear: "+describe(open))
		return
	}
	if len(steps) > 0 {
		d.certify(gpuhealthv1alpha1.SuiteRecertification, rc)
	}
	d.closeFindings(fsm.Pass, gpuhealthv1alpha1.ReasonRecertified, fmt.Sprintf("recertification attempt %d passed (%s) and the soak window was clean", rc.Attempt, suiteSummary(rc.Steps)), "")
}

// currentAttempt is the attempt *slot holds, starting attempt 1 when it
// holds none. wait says the attempt started in this pass: it is written
// down before any Job exists (Job names carry the attempt's start, and a
// restart must find the same start to find the same Jobs).
func (d *decider) currentAttempt(slot **gpuhealthv1alpha1.RecertificationStatus) (rc *gpuhealthv1alpha1.RecertificationStatus, wait bool) {
	if *slot == nil || (*slot).StartedAt == nil {
		*slot = &gpuhealthv1alpha1.RecertificationStatus{Attempt: 1, StartedAt: &d.o.now, Result: gpuhealthv1alpha1.JobPending}
		d.attemptStarted = true
	}
	if d.attemptStarted {
		d.p.immediate = true
	}
	return *slot, d.attemptStarted
}

// remediationStep picks the reset or reboot step the action asks for, when
// the policy configures one.
func remediationStep(a gpuhealthv1alpha1.Action, spec gpuhealthv1alpha1.RemediationSpec) (job.Kind, *gpuhealthv1alpha1.RemediationStep) {
	switch a {
	case gpuhealthv1alpha1.ActionResetGPU:
		return job.ResetGPU, spec.ResetGPU
	case gpuhealthv1alpha1.ActionRebootNode:
		return job.RebootNode, spec.RebootNode
	}
	return "", nil
}

// remediated runs the reset or reboot step and says whether it is done. A
// GPU reset is done when its Job succeeded (the recertification that
// follows proves it). A reboot is done when the node reports a boot ID other
// than the one it had when the step started and is Ready again, within the
// step's timeout: a real reboot kills the Job's own pod, so the Job's
// failure or disappearance is expected, not a verdict. A node that reports
// no boot ID (some simulated nodes) falls back to the Job's result.
func (d *decider) remediated(kind job.Kind, step *gpuhealthv1alpha1.RemediationStep, rc *gpuhealthv1alpha1.RecertificationStatus) bool {
	o := d.o
	timeout := step.Timeout.Get(defaultJobTimeout)
	want := job.Build(kind, o.node.Name, o.namespace, rc.Attempt, rc.StartedAt.Time, step.Job, timeout, o.jobEnv)
	if kind != job.RebootNode {
		rc.RemediationJob = want.Name
		return d.jobSucceeded(want, gpuhealthv1alpha1.ReasonRemediating)
	}
	boot := o.node.Status.NodeInfo.BootID
	if rc.RemediationStartedAt == nil {
		// Write down the boot ID before the Job exists, so the reboot is
		// measured against the boot it ends.
		rc.RemediationStartedAt, rc.BootID = &o.now, boot
		d.p.immediate = true
		return false
	}
	if rc.BootID == "" {
		rc.RemediationJob = want.Name
		return d.jobSucceeded(want, gpuhealthv1alpha1.ReasonRemediating)
	}
	if boot != rc.BootID && (readiness.Node(o.node) || rc.JobName != "" || rc.CompletedAt != nil) {
		// Back with a new boot; once past this step (its recertification
		// planned or done), a later NotReady is no reboot still under way.
		return true
	}
	deadline := rc.RemediationStartedAt.Add(timeout)
	if !o.now.Before(&metav1.Time{Time: deadline}) {
		what := "did not report a new boot ID"
		if boot != rc.BootID {
			what = "rebooted but is not Ready"
		}
		d.failAttempt(fmt.Sprintf("reboot: node %s %s within %s (boot ID %s)", o.node.Name, what, timeout, rc.BootID))
		return false
	}
	live := o.jobs[want.Name]
	if rc.RemediationJob != want.Name {
		// Created once: a Job that vanishes with its pod in the reboot is
		// not made again (that would reboot the node a second time).
		rc.RemediationJob = want.Name
		if live == nil {
			d.p.createJobs = append(d.p.createJobs, want)
		}
	}
	state := "job " + want.Namespace + "/" + want.Name + " gone"
	if live != nil {
		_, state = job.Result(live)
		state = "job " + want.Namespace + "/" + want.Name + ": " + state
	}
	d.statusReason(gpuhealthv1alpha1.ReasonRemediating, fmt.Sprintf("attempt %d: rebooting (%s); waiting for a boot ID other than %s until %s",
		rc.Attempt, state, rc.BootID, deadline.UTC().Format(time.RFC3339)))
	d.wait(min(jobRecheck, deadline.Sub(o.now.Time)))
	return false
}

// jobSucceeded makes sure the Job exists and says whether it succeeded; a
// failed Job fails the attempt.
func (d *decider) jobSucceeded(want *batchv1.Job, waitingReason string) bool {
	rc := d.p.status.Recertification
	live := d.o.jobs[want.Name]
	if live == nil {
		d.p.createJobs = append(d.p.createJobs, want)
		live = want
	}
	result, msg := job.Result(live)
	switch result {
	case gpuhealthv1alpha1.JobSucceeded:
		return true
	case gpuhealthv1alpha1.JobFailed:
		d.failAttempt(fmt.Sprintf("job %s/%s: %s", live.Namespace, live.Name, msg))
		return false
	default:
		rc.Result = result
		d.statusReason(waitingReason, fmt.Sprintf("attempt %d: job %s/%s %s", rc.Attempt, live.Namespace, live.Name, msg))
		d.wait(jobRecheck)
		return false
	}
}

// failAttempt records a failed recertification attempt: back to quarantine
// for another, or Failed when the attempts are used up.
func (d *decider) failAttempt(why string) {
	rc := d.p.status.Recertification
	rc.Result, rc.CompletedAt, rc.Message = gpuhealthv1alpha1.JobFailed, &d.o.now, gpuhealthv1alpha1.Truncate(why, 1024)
	maxAttempts := d.o.policy.Spec.Recertification.MaxAttempts
	if maxAttempts == 0 {
		maxAttempts = defaultMaxAttempts
	}
	msg := fmt.Sprintf("recertification attempt %d of %d failed: %s", rc.Attempt, maxAttempts, why)
	if rc.Attempt >= maxAttempts {
		d.transition(fsm.Fail, gpuhealthv1alpha1.ReasonRecertificationExhausted, msg, "")
		return
	}
	d.transition(fsm.FailRecertification, gpuhealthv1alpha1.ReasonRecertificationFailed, msg, "")
}

// suiteNotRun ends an attempt whose step never ran in maxNotRun tries:
// Failed with SuiteNotRun, for a human, and not handed off for
// replacement (handOffReason): the cluster kept the test from running
// (an image, a resource, a quota), not the GPU from passing it.
func (d *decider) suiteNotRun(which gpuhealthv1alpha1.Suite, rc *gpuhealthv1alpha1.RecertificationStatus, why string) {
	rc.CompletedAt, rc.Message = &d.o.now, gpuhealthv1alpha1.Truncate(why, 1024)
	msg := fmt.Sprintf("%s attempt %d could not run its suite: %s", strings.ToLower(string(which)), rc.Attempt, why)
	if which == gpuhealthv1alpha1.SuiteCertification {
		d.notCertified(msg)
	}
	d.transition(fsm.Fail, gpuhealthv1alpha1.ReasonSuiteNotRun, msg, "")
}

const (
	// defaultDiagnosticsTimeout is the diagnostics step's deadline when the
	// policy does not say (its CRD default).
	defaultDiagnosticsTimeout = 10 * time.Minute
	// defaultDiagnosticsRetain is how long a finished diagnostics Job is
	// kept when the policy does not say (its CRD default).
	defaultDiagnosticsRetain = 7 * 24 * time.Hour
)

// diagnosed runs the policy's diagnostics step, once per attempt, before
// the attempt's reset or reboot, and says whether that act may go ahead:
// the step is done (its Job finished, or is gone) or the policy has none.
// Its outcome never holds the act back: evidence is worth a wait of at
// most its timeout, not a node kept out of service. The finished Job is
// kept for the policy's retain (its TTL): its log is the evidence, named in
// status.diagnostics and an Event.
func (d *decider) diagnosed(kind job.Kind, rc *gpuhealthv1alpha1.RecertificationStatus) bool {
	o, st := d.o, &d.p.status
	spec := o.policy.Spec.Remediation.Diagnostics
	if spec == nil || rc.DiagnosedAt != nil {
		return true
	}
	retain, timeout := spec.Retain.Get(defaultDiagnosticsRetain), spec.Timeout.Get(defaultDiagnosticsTimeout)
	want := job.Build(job.Diagnostics, o.node.Name, o.namespace, rc.Attempt, rc.StartedAt.Time, spec.Job, timeout, o.jobEnv)
	want.Spec.TTLSecondsAfterFinished = ptr.To(int32(retain.Seconds()))
	live := o.jobs[want.Name]
	rec := st.Diagnostics
	if rec == nil || rec.Job != want.Name {
		rec = &gpuhealthv1alpha1.DiagnosticsRecord{Job: want.Name, Before: remediationAction(kind), Attempt: rc.Attempt, StartedAt: &o.now, Result: gpuhealthv1alpha1.JobPending}
		st.Diagnostics = rec
	}
	where := want.Namespace + "/" + want.Name
	if live == nil {
		// Not seen: not made yet, refused, not cached yet, or deleted.
		// Asked for (again: creating an existing Job is a no-op) until its
		// timeout, then taken for gone: the wait is bounded by the timeout
		// whatever became of it, and a slow cache never lets the reset
		// start beside a diagnostics Job that runs.
		if o.now.Sub(rec.StartedAt.Time) < timeout {
			d.p.createJobs = append(d.p.createJobs, want)
			d.statusReason(gpuhealthv1alpha1.ReasonRemediating, fmt.Sprintf("attempt %d: collecting diagnostics before %s: job %s", rc.Attempt, rec.Before, where))
			d.wait(min(jobRecheck, timeout-o.now.Sub(rec.StartedAt.Time)))
			return false
		}
		d.diagnosticsDone(rc, rec, gpuhealthv1alpha1.JobFailed, fmt.Sprintf("job %s not seen within its %s timeout", where, timeout), nil)
		return true
	}
	result, msg := job.Result(live)
	if result == gpuhealthv1alpha1.JobSucceeded || result == gpuhealthv1alpha1.JobFailed {
		until := metav1.NewTime(job.FinishedAt(live).Add(retain))
		d.diagnosticsDone(rc, rec, result, "job "+where+": "+msg, &until)
		return true
	}
	rec.Result = result
	d.statusReason(gpuhealthv1alpha1.ReasonRemediating, fmt.Sprintf("attempt %d: collecting diagnostics before %s: job %s %s", rc.Attempt, rec.Before, where, msg))
	d.wait(jobRecheck)
	return false
}

// diagnosticsDone records the diagnostics step's outcome, with one Event
// saying where its log is, and lets the reset or reboot go ahead.
func (d *decider) diagnosticsDone(rc *gpuhealthv1alpha1.RecertificationStatus, rec *gpuhealthv1alpha1.DiagnosticsRecord, result gpuhealthv1alpha1.JobResult, msg string, until *metav1.Time) {
	rc.DiagnosedAt = &d.o.now
	rec.Result, rec.CompletedAt, rec.KeptUntil = result, &d.o.now, until
	rec.Message = gpuhealthv1alpha1.Truncate(msg, 512)
	if result != gpuhealthv1alpha1.JobSucceeded {
		d.nodeEvent(corev1.EventTypeWarning, gpuhealthv1alpha1.ReasonDiagnosticsFailed, "Diagnose", "diagnostics before %s did not succeed (%s); %s goes ahead", rec.Before, msg, rec.Before)
		return
	}
	d.nodeEvent(corev1.EventTypeNormal, gpuhealthv1alpha1.ReasonDiagnosticsCollected, "Diagnose", "diagnostics before %s collected; kept until %s: kubectl logs -n %s job/%s",
		rec.Before, until.UTC().Format(time.RFC3339), d.o.namespace, rec.Job)
}
