package job

import (
	"strconv"
	"time"

	batchv1 "k8s.io/api/batch/v1"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
)

// StepName is the deterministic name of a suite step's Job: Name with the
// step's name after the kind.
func StepName(kind Kind, step, node string, attempt int32, started time.Time) string {
	return StepTryName(kind, step, node, attempt, started, 0)
}

// StepTryName is StepName for a step's try: a try after one whose Job
// never ran gets a Job of its own (the one that never ran stays, finished,
// for its TTL), its attempt written "<attempt>t<try>" near the end of the
// name, where no step or node name reaches: step a's try 1 is never step
// a-t1's Job. Try 0 is StepName; a step without a name
// (recertification.job) keeps Name's form.
func StepTryName(kind Kind, step, node string, attempt int32, started time.Time, try int32) string {
	k := string(kind)
	if step != "" {
		k += "-" + step
	}
	token := strconv.Itoa(int(attempt))
	if try > 0 {
		token += "t" + strconv.Itoa(int(try))
	}
	return nameOf(Kind(k), node, token, started)
}

// BuildStep returns the Job of one suite step's try for a node, as Build
// does, named by StepTryName and labelled with the step and its parser.
func BuildStep(kind Kind, node, namespace string, attempt int32, started time.Time, step gpuhealthv1alpha1.SuiteStep, try int32, timeout time.Duration, env Env) *batchv1.Job {
	j := Build(kind, node, namespace, attempt, started, step.Job, timeout, env)
	parser := step.Parser.Type
	if parser == "" {
		parser = gpuhealthv1alpha1.ParserExitCode
	}
	for _, labels := range []map[string]string{j.Labels, j.Spec.Template.Labels} {
		labels[ParserLabel] = string(parser)
		if step.Name != "" {
			labels[StepLabel] = step.Name
		}
	}
	j.Name = StepTryName(kind, step.Name, node, attempt, started, try)
	return j
}

// Ran says whether the Job's pod was seen running: the Job counts a ready
// pod (a container without a readiness probe is ready once started), or
// one that succeeded. A Job that fails by its deadline without either never
// ran; see NotRunning for why.
func Ran(j *batchv1.Job) bool {
	return j.Status.Ready != nil && *j.Status.Ready > 0 || j.Status.Succeeded > 0
}

// DeadlineExceeded says whether the Job failed by reaching its
// activeDeadlineSeconds.
func DeadlineExceeded(j *batchv1.Job) bool {
	for _, c := range j.Status.Conditions {
		if (c.Type == batchv1.JobFailed || c.Type == batchv1.JobFailureTarget) && c.Status == "True" && c.Reason == batchv1.JobReasonDeadlineExceeded {
			return true
		}
	}
	return false
}
