package job

import (
	"time"

	batchv1 "k8s.io/api/batch/v1"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
)

// StepName is the deterministic name of a suite step's Job: Name with the
// step's name after the kind.
func StepName(kind Kind, step, node string, attempt int32, started time.Time) string {
	return Name(Kind(string(kind)+"-"+step), node, attempt, started)
}

// BuildStep returns the Job of one suite step for a node, as Build does,
// named by StepName and labelled with the step and its parser. A step
// without a name is the one-step suite of recertification.job and keeps
// Build's name.
func BuildStep(kind Kind, node, namespace string, attempt int32, started time.Time, step gpuhealthv1alpha1.SuiteStep, timeout time.Duration, env Env) *batchv1.Job {
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
	if step.Name != "" {
		j.Name = StepName(kind, step.Name, node, attempt, started)
	}
	return j
}
