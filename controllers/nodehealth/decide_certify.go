package nodehealth

import (
	"fmt"
	"strings"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/remediation/fsm"
	"github.com/gpuhealth/gpuhealth/remediation/job"
	nodepkg "github.com/gpuhealth/gpuhealth/remediation/node"
	"github.com/gpuhealth/gpuhealth/remediation/suite"
)

// legacyStep names the one step of recertification.job in status.
const legacyStep = "recertify"

// outputRetry is how long after its Job finished a step's output that
// cannot be read is asked for again before the step fails for want of it.
const outputRetry = 5 * time.Minute

// jobOutput is what a finished step Job printed, as observe read it.
type jobOutput struct {
	text []byte
	// total is how many bytes the Job printed (text is its end when that
	// is more than job.OutputLimit).
	total int64
	// err is final (job.Final) when the output is gone for good or too
	// long to read; any other error is retried.
	err error
}

// stepRecord is one step verdict, counted once the status write succeeded.
type stepRecord struct {
	suite        gpuhealthv1alpha1.Suite
	step         string
	parser       gpuhealthv1alpha1.ParserType
	passed       bool
	duration     time.Duration
	measurements []gpuhealthv1alpha1.Measurement
}

// recertificationSteps is the policy's recertification suite: its steps, or
// recertification.job as one exit-code step (its Job keeps the name it had
// before suites existed).
func recertificationSteps(spec gpuhealthv1alpha1.RecertificationSpec) []gpuhealthv1alpha1.SuiteStep {
	if len(spec.Steps) > 0 || spec.Job == nil {
		return spec.Steps
	}
	return []gpuhealthv1alpha1.SuiteStep{{Job: *spec.Job, Timeout: spec.Timeout, Parser: gpuhealthv1alpha1.ResultParser{Type: gpuhealthv1alpha1.ParserExitCode}}}
}

func stepName(s gpuhealthv1alpha1.SuiteStep) string {
	if s.Name == "" {
		return legacyStep
	}
	return s.Name
}

func parserOf(s gpuhealthv1alpha1.SuiteStep) gpuhealthv1alpha1.ParserType {
	if s.Parser.Type == "" {
		return gpuhealthv1alpha1.ParserExitCode
	}
	return s.Parser.Type
}

// runSuite runs an attempt's steps in order, one Job at a time, and says
// whether the suite is done and whether it passed (why not when it failed).
// Each step's verdict is written into rc.Steps once and never reached
// again: a restarted operator resumes at the first step without one.
func (d *decider) runSuite(kind job.Kind, which gpuhealthv1alpha1.Suite, steps []gpuhealthv1alpha1.SuiteStep, maxNotRun int32, rc *gpuhealthv1alpha1.RecertificationStatus, waitingReason string) (done, passed bool, why string) {
	o := d.o
	if why := suiteChanged(steps, rc); why != "" {
		// The policy's suite changed under this attempt: its verdicts are
		// of another suite. The attempt starts again (under new Job names),
		// and the old suite's unfinished Jobs go. What it remediated with
		// stays: the reset or reboot is not done again under a new name.
		d.nodeEvent(corev1.EventTypeNormal, waitingReason, string(which), "%s attempt %d starts again: %s", which, rc.Attempt, why)
		*rc = gpuhealthv1alpha1.RecertificationStatus{Attempt: rc.Attempt, StartedAt: &o.now, Result: gpuhealthv1alpha1.JobPending, Request: rc.Request,
			Remediation: rc.Remediation, RemediatedAt: rc.RemediatedAt, DiagnosedAt: rc.DiagnosedAt,
			RemediationJob: rc.RemediationJob, RemediationStartedAt: rc.RemediationStartedAt, BootID: rc.BootID}
		d.statusReason(waitingReason, fmt.Sprintf("attempt %d starts again: %s", rc.Attempt, why))
		d.p.deleteJobs = len(d.runningJobs()) > 0
		d.p.immediate = true
		return false, false, ""
	}
	for i, step := range steps {
		if i >= len(rc.Steps) {
			rc.Steps = append(rc.Steps, gpuhealthv1alpha1.StepResult{Name: stepName(step), Parser: parserOf(step), Result: gpuhealthv1alpha1.JobPending})
		}
		sr := &rc.Steps[i]
		switch sr.Result {
		case gpuhealthv1alpha1.JobSucceeded:
			continue
		case gpuhealthv1alpha1.JobFailed, gpuhealthv1alpha1.JobNotRun:
			return true, false, fmt.Sprintf("step %s: %s", sr.Name, sr.Message)
		}
		timeout := step.Timeout.Get(defaultJobTimeout)
		want := job.BuildStep(kind, o.node.Name, o.namespace, rc.Attempt, rc.StartedAt.Time, step, sr.NotRun, timeout, o.jobEnv)
		sr.Job, rc.JobName = want.Name, want.Name
		if sr.StartedAt == nil {
			sr.StartedAt = &o.now
		}
		progress := fmt.Sprintf("attempt %d, step %d of %d (%s)", rc.Attempt, i+1, len(steps), sr.Name)
		live := o.jobs[want.Name]
		if live == nil {
			d.p.createJobs = append(d.p.createJobs, want)
			sr.Result, rc.Result = gpuhealthv1alpha1.JobPending, gpuhealthv1alpha1.JobPending
			d.statusReason(waitingReason, fmt.Sprintf("%s: job %s/%s created", progress, want.Namespace, want.Name))
			d.wait(jobRecheck)
			return false, false, ""
		}
		if sr.RunningAt == nil && job.Ran(live) {
			sr.RunningAt = &o.now
			if strings.HasPrefix(sr.Message, waitingPrefix) {
				sr.Message = "" // it waits no more
			}
		}
		result, msg := job.Result(live)
		if result == gpuhealthv1alpha1.JobFailed && sr.RunningAt == nil && job.DeadlineExceeded(live) && strings.HasPrefix(sr.Message, waitingPrefix) {
			// Never seen running, and seen waiting: it never ran. (Without
			// a wait seen — the pod's reason unread — it is taken as a
			// failure, as a test that hung would be.)
			return d.stepNotRun(which, rc, sr, progress, live, timeout, maxNotRun, waitingReason)
		}
		if result != gpuhealthv1alpha1.JobSucceeded && result != gpuhealthv1alpha1.JobFailed {
			sr.Result, rc.Result = result, result
			if why := o.waits[live.Name]; why != "" {
				// Kept in the step, for the report should it never run.
				msg += ": " + why
				sr.Message = gpuhealthv1alpha1.Truncate(waitingPrefix+why, 512)
			}
			d.statusReason(waitingReason, fmt.Sprintf("%s: job %s/%s %s", progress, live.Namespace, live.Name, msg))
			if sr.RunningAt == nil {
				d.wait(pendingRecheck)
			} else {
				d.wait(jobRecheck)
			}
			return false, false, ""
		}
		var text []byte
		var cut string
		var outErr error
		if parserOf(step) != gpuhealthv1alpha1.ParserExitCode {
			out, ok := o.outputs[want.Name]
			if !ok {
				out = jobOutput{err: fmt.Errorf("the output of job %s/%s was not read", live.Namespace, live.Name)}
			}
			if out.err != nil && !job.Final(out.err) && o.now.Sub(job.FinishedAt(live)) < outputRetry {
				// Worth another try: the apiserver or kubelet may answer
				// next time. Past outputRetry the step is judged without
				// its output (and fails, saying why).
				d.statusReason(waitingReason, fmt.Sprintf("%s: reading the output of job %s/%s: %v", progress, live.Namespace, live.Name, out.err))
				d.p.err = out.err
				return false, false, ""
			}
			text, cut, outErr = out.text, job.CutNote(out.total), out.err
		}
		v := suite.Judge(step.Parser, result == gpuhealthv1alpha1.JobSucceeded, msg, text, cut, outErr, o.node.Labels)
		sr.CompletedAt = &o.now
		sr.Duration = &metav1.Duration{Duration: o.now.Sub(sr.StartedAt.Time).Round(time.Second)}
		sr.Message, sr.Measurements = gpuhealthv1alpha1.Truncate(v.Message, 512), v.Measurements
		sr.Result = gpuhealthv1alpha1.JobFailed
		if v.Passed {
			sr.Result = gpuhealthv1alpha1.JobSucceeded
		}
		d.p.steps = append(d.p.steps, stepRecord{suite: which, step: sr.Name, parser: sr.Parser, passed: v.Passed, duration: sr.Duration.Duration, measurements: v.Measurements})
		reason, eventType := gpuhealthv1alpha1.ReasonStepPassed, corev1.EventTypeNormal
		if !v.Passed {
			reason, eventType = gpuhealthv1alpha1.ReasonStepFailed, corev1.EventTypeWarning
		}
		d.nodeEvent(eventType, reason, string(which), "%s %s: step %s (%s) %s in %s: %s", which, progress, sr.Name, sr.Parser, strings.ToLower(string(sr.Result)), sr.Duration.Duration, sr.Message)
		if !v.Passed {
			return true, false, fmt.Sprintf("step %s: %s", sr.Name, sr.Message)
		}
	}
	return true, true, ""
}

// waitingPrefix starts a step's message while its pod waits to run: why,
// as last read.
const waitingPrefix = "waiting: "

// defaultMaxNotRun is how many tries of a step may never run, per attempt,
// when the policy does not say (its CRD default).
const defaultMaxNotRun = 3

// stepNotRun handles a step try whose Job reached its deadline before its
// pod ever ran: nothing was tested, so no attempt is spent. The step is
// tried again under a Job of its own (the next try's name), up to maxNotRun
// tries; after that the suite is done, not passed, with the step NotRun,
// and its caller sends the node to Failed with SuiteNotRun.
func (d *decider) stepNotRun(which gpuhealthv1alpha1.Suite, rc *gpuhealthv1alpha1.RecertificationStatus, sr *gpuhealthv1alpha1.StepResult,
	progress string, live *batchv1.Job, timeout time.Duration, maxNotRun int32, waitingReason string) (done, passed bool, why string) {
	if maxNotRun <= 0 {
		maxNotRun = defaultMaxNotRun
	}
	sr.NotRun++
	what := fmt.Sprintf("job %s/%s never ran within its %s deadline", live.Namespace, live.Name, timeout)
	if w, ok := strings.CutPrefix(sr.Message, waitingPrefix); ok {
		// Read while it waited: its pod is gone with the deadline.
		what += " (" + w + ")"
	}
	if sr.NotRun >= maxNotRun {
		sr.Result, sr.CompletedAt = gpuhealthv1alpha1.JobNotRun, &d.o.now
		sr.Message = gpuhealthv1alpha1.Truncate(fmt.Sprintf("never ran in %d tries; last: %s", sr.NotRun, what), 512)
		rc.Result = gpuhealthv1alpha1.JobNotRun
		d.nodeEvent(corev1.EventTypeWarning, gpuhealthv1alpha1.ReasonStepNotRun, string(which), "%s %s: step %s %s", which, progress, sr.Name, sr.Message)
		return true, false, fmt.Sprintf("step %s: %s", sr.Name, sr.Message)
	}
	msg := fmt.Sprintf("try %d of %d: %s; trying again, no attempt spent", sr.NotRun, maxNotRun, what)
	sr.Result, sr.StartedAt, sr.RunningAt, sr.Job = gpuhealthv1alpha1.JobPending, nil, nil, ""
	sr.Message = gpuhealthv1alpha1.Truncate(msg, 512)
	rc.Result = gpuhealthv1alpha1.JobPending
	d.nodeEvent(corev1.EventTypeWarning, gpuhealthv1alpha1.ReasonStepNotRun, string(which), "%s %s: step %s never ran: %s", which, progress, sr.Name, msg)
	d.statusReason(waitingReason, fmt.Sprintf("%s: step %s never ran (%s)", progress, sr.Name, msg))
	d.p.immediate = true
	return false, false, ""
}

// suiteChanged says how the policy's suite differs from the one an attempt
// runs, empty when it does not: the steps recorded so far must be the
// suite's first steps by name and parser (a step's Job is made in the pass
// that records it, with its parser).
func suiteChanged(steps []gpuhealthv1alpha1.SuiteStep, rc *gpuhealthv1alpha1.RecertificationStatus) string {
	if len(rc.Steps) > len(steps) {
		return fmt.Sprintf("the suite has %d steps now, the attempt ran %d", len(steps), len(rc.Steps))
	}
	for i, sr := range rc.Steps {
		if sr.Name != stepName(steps[i]) || sr.Parser != parserOf(steps[i]) {
			return fmt.Sprintf("step %d is %s (%s) now, the attempt ran %s (%s)", i+1, stepName(steps[i]), parserOf(steps[i]), sr.Name, sr.Parser)
		}
	}
	return ""
}

// suiteSummary is one line of the steps' verdicts.
func suiteSummary(steps []gpuhealthv1alpha1.StepResult) string {
	parts := make([]string, 0, len(steps))
	for _, s := range steps {
		parts = append(parts, fmt.Sprintf("%s %s", s.Name, strings.ToLower(string(s.Result))))
	}
	if len(parts) == 0 {
		return "no steps"
	}
	return strings.Join(parts, ", ")
}

// certify records a certificate for the suite the attempt passed.
func (d *decider) certify(which gpuhealthv1alpha1.Suite, rc *gpuhealthv1alpha1.RecertificationStatus) {
	st := &d.p.status
	request := rc.Request
	if v := d.o.node.Labels[gpuhealthv1alpha1.CertifyLabel]; v != "" {
		// Any certificate answers the label's request: it is not run again.
		request = v
	}
	st.Certificate = &gpuhealthv1alpha1.Certificate{Time: d.o.now, Suite: which, Attempt: rc.Attempt, Request: gpuhealthv1alpha1.Truncate(request, 63), Steps: append([]gpuhealthv1alpha1.StepResult(nil), rc.Steps...)}
	d.condition(gpuhealthv1alpha1.NodeHealthCertifiedCondition, true, gpuhealthv1alpha1.ReasonCertified,
		fmt.Sprintf("%s attempt %d passed: %s", strings.ToLower(string(which)), rc.Attempt, suiteSummary(rc.Steps)))
}

// notCertified records that the node holds no certificate, and why.
func (d *decider) notCertified(why string) {
	if d.p.status.Certificate != nil {
		return
	}
	d.condition(gpuhealthv1alpha1.NodeHealthCertifiedCondition, false, gpuhealthv1alpha1.ReasonNotCertified, why)
}

// certifyLabelRequest is the value of a gpuhealth.dev/certify label not
// acted on yet, "" when there is none.
func certifyLabelRequest(o *observation) string {
	st := &o.nh.Status
	if v := o.node.Labels[gpuhealthv1alpha1.CertifyLabel]; v != "" && v != st.CertifyRequest && (st.Certificate == nil || st.Certificate.Request != v) {
		return v
	}
	return ""
}

// certificationRequest says whether a healthy node is to be certified now,
// with the transition's reason and message and the request it answers.
func (d *decider) certificationRequest(first bool) (reason, message, request string, ok bool) {
	o, st := d.o, &d.p.status
	if v := certifyLabelRequest(o); v != "" {
		// Certification takes every GPU and holds the node out of service:
		// asked for by a label on a node whose GPUs run someone's pods, it
		// would either wait on them until its steps time out or take the
		// node from under them. Refused, once per label value, saying why:
		// drain the node (or let its pods finish) and label it again.
		if o.workloadsErr != nil {
			d.p.err = o.workloadsErr
			return "", "", "", false
		}
		if len(o.workloads) > 0 {
			st.CertifyRequest = v
			msg := fmt.Sprintf("label %s=%s asked for certification, refused: the node runs %d workload pods (%s); drain it or let them finish, then label it again",
				gpuhealthv1alpha1.CertifyLabel, v, len(o.workloads), gpuhealthv1alpha1.FirstN(o.workloads, 3, ", "))
			d.statusReason(gpuhealthv1alpha1.ReasonCertificationRefused, msg)
			d.nodeEvent(corev1.EventTypeWarning, gpuhealthv1alpha1.ReasonCertificationRefused, "Certify", "%s", msg)
			return "", "", "", false
		}
		return gpuhealthv1alpha1.ReasonCertificationRequested, fmt.Sprintf("label %s=%s asks for certification", gpuhealthv1alpha1.CertifyLabel, v), v, true
	}
	if !first || !o.policy.Spec.Certification.NewNodes {
		return "", "", "", false
	}
	if o.workloadsErr != nil {
		d.p.err = o.workloadsErr
		return "", "", "", false
	}
	if len(o.workloads) > 0 {
		d.notCertified(fmt.Sprintf("the node ran %d workload pods (%s) when gpuhealth first managed it: it stays in service and its next recertification certifies it",
			len(o.workloads), gpuhealthv1alpha1.FirstN(o.workloads, 3, ", ")))
		return "", "", "", false
	}
	return gpuhealthv1alpha1.ReasonCertifying, "a new node: held out of service until its certification passes", "", true
}

// startCertification moves a healthy node into Certifying with attempt 1.
func (d *decider) startCertification(reason, message, request string) {
	if d.dryRun() {
		d.statusReason(gpuhealthv1alpha1.ReasonDryRun, "dry run, would certify: "+message)
		return
	}
	if !d.transition(fsm.Certify, reason, message, "") {
		return
	}
	d.p.status.Certification = &gpuhealthv1alpha1.RecertificationStatus{Attempt: 1, StartedAt: &d.o.now, Result: gpuhealthv1alpha1.JobPending, Request: request}
	if request != "" {
		// Acted on once, whatever becomes of it: a cancelled or released
		// certification is not started again for the same value.
		d.p.status.CertifyRequest = request
	}
	d.attemptStarted = true
}

// certifying holds a new node out of service (tainted, not cordoned) while
// its certification suite runs, and returns it once the suite passed. A
// counting finding sends it down the fault workflow instead.
func (d *decider) certifying() {
	o, st := d.o, &d.p.status
	if len(d.counting()) > 0 {
		running := d.runningJobs()
		d.healthy()
		if d.machine.Phase() != gpuhealthv1alpha1.PhaseCertifying {
			st.Certification = nil
			d.p.deleteJobs = len(running) > 0
		}
		return
	}
	if d.dryRun() {
		d.statusReason(gpuhealthv1alpha1.ReasonDryRun, "dry run: certification waits")
		return
	}
	if nodepkg.UncertifiedTaintRemoved(o.node) {
		d.closeFindings(fsm.Cancel, gpuhealthv1alpha1.ReasonUncertifiedTaintRemoved, "the uncertified taint was removed by someone else; certification is cancelled", "")
		d.notCertified("certification was cancelled: the uncertified taint was removed")
		return
	}
	d.p.node = nodeUncertified
	if d.held("certification is paused") {
		return
	}
	c, wait := d.currentAttempt(&st.Certification)
	if wait {
		return
	}
	spec := o.policy.Spec.Certification
	if c.Result == gpuhealthv1alpha1.JobFailed && c.CompletedAt != nil {
		until := c.CompletedAt.Add(spec.Backoff.Get(defaultBackoff))
		if o.now.Before(&metav1.Time{Time: until}) {
			d.statusReason(gpuhealthv1alpha1.ReasonBackoff, fmt.Sprintf("certification attempt %d failed (%s); next attempt after %s", c.Attempt, c.Message, until.UTC().Format(time.RFC3339)))
			d.wait(until.Sub(o.now.Time))
			return
		}
		st.Certification = &gpuhealthv1alpha1.RecertificationStatus{Attempt: c.Attempt + 1, StartedAt: &o.now, Result: gpuhealthv1alpha1.JobPending, Request: c.Request}
		d.statusReason(gpuhealthv1alpha1.ReasonCertifying, fmt.Sprintf("certification attempt %d", c.Attempt+1))
		d.p.immediate = true
		return
	}
	done, passed, why := d.runSuite(job.Certification, gpuhealthv1alpha1.SuiteCertification, spec.Steps, spec.MaxNotRun, c, gpuhealthv1alpha1.ReasonCertifying)
	if !done {
		return
	}
	c.CompletedAt = &o.now
	if !passed && c.Result == gpuhealthv1alpha1.JobNotRun {
		d.suiteNotRun(gpuhealthv1alpha1.SuiteCertification, c, why)
		return
	}
	if !passed {
		c.Result, c.Message = gpuhealthv1alpha1.JobFailed, gpuhealthv1alpha1.Truncate(why, 1024)
		maxAttempts := spec.MaxAttempts
		if maxAttempts == 0 {
			maxAttempts = defaultMaxAttempts
		}
		msg := fmt.Sprintf("certification attempt %d of %d failed: %s", c.Attempt, maxAttempts, why)
		d.notCertified(msg)
		if c.Attempt >= maxAttempts {
			d.transition(fsm.Fail, gpuhealthv1alpha1.ReasonCertificationExhausted, msg, "")
			return
		}
		d.statusReason(gpuhealthv1alpha1.ReasonCertificationFailed, msg)
		d.nodeEvent(corev1.EventTypeWarning, gpuhealthv1alpha1.ReasonCertificationFailed, "Certify", "%s", msg)
		d.wait(spec.Backoff.Get(defaultBackoff))
		return
	}
	c.Result = gpuhealthv1alpha1.JobSucceeded
	d.p.deleteJobs = len(d.runningJobs()) > 0
	d.certify(gpuhealthv1alpha1.SuiteCertification, c)
	if !d.transition(fsm.Certified, gpuhealthv1alpha1.ReasonCertified, fmt.Sprintf("certification attempt %d passed: %s", c.Attempt, suiteSummary(c.Steps)), "") {
		return
	}
	st.Certification = nil
	d.inService()
}

// certifiedCondition keeps the Certified condition in step with the
// certificate for nodes that have one.
func (d *decider) certifiedCondition() {
	st := &d.p.status
	if st.Certificate != nil && !meta.IsStatusConditionTrue(st.Conditions, gpuhealthv1alpha1.NodeHealthCertifiedCondition) {
		d.condition(gpuhealthv1alpha1.NodeHealthCertifiedCondition, true, gpuhealthv1alpha1.ReasonCertified,
			fmt.Sprintf("%s attempt %d passed at %s", strings.ToLower(string(st.Certificate.Suite)), st.Certificate.Attempt, st.Certificate.Time.UTC().Format(time.RFC3339)))
	}
}
