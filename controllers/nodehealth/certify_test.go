package nodehealth

import (
	"errors"
	"fmt"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/remediation/job"
	nodepkg "github.com/gpuhealth/gpuhealth/remediation/node"
)

const certifying = gpuhealthv1alpha1.PhaseCertifying

// ncclReport is an all_reduce_perf report (nccl-tests 2.18's layout) whose
// largest size reaches busbw GB/s.
func ncclReport(busbw float64) []byte {
	return fmt.Appendf(nil, `# nccl-tests version 2.18.2 nccl-headers=23007 nccl-library=23007
# Collective test starting: all_reduce_perf
#
#       size         count      type   redop    root     time   algbw   busbw  #wrong     time   algbw   busbw  #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)             (us)  (GB/s)  (GB/s)
     1048576        262144     float     sum      -1   339.61    3.09    3.09       0   335.85    3.12    3.12       0
  4294967296    1073741824     float     sum      -1  18522.0  231.88  %6.2f       0  18514.0  231.98  %6.2f       0
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 120.5
#
`, busbw, busbw)
}

// dcgmPass is a DCGM 3 diagnostic report in which every test passed.
var dcgmPass = []byte(`{"DCGM GPU Diagnostic": {"test_categories": [
 {"category": "Deployment", "tests": [{"name": "Denylist", "results": [{"status": "Pass"}]}]},
 {"category": "Integration", "tests": [{"name": "PCIe", "results": [{"gpu_ids": "0", "status": "Pass"}, {"gpu_ids": "1", "status": "Pass"}]}]}],
 "version": "3.3.9"}}`)

// suitePolicy gives the policy a two-step suite (dcgm-diag, then an
// nccl-tests all-reduce with a 100 GB/s threshold) for certification and
// recertification, and certifies new nodes.
func suitePolicy(o *observation) {
	steps := []gpuhealthv1alpha1.SuiteStep{
		{Name: "dcgm", Job: gpuhealthv1alpha1.JobTemplate{Image: "dcgm"}, Parser: gpuhealthv1alpha1.ResultParser{Type: gpuhealthv1alpha1.ParserDCGMDiag}},
		{Name: "nccl", Job: gpuhealthv1alpha1.JobTemplate{Image: "nccl"}, Parser: gpuhealthv1alpha1.ResultParser{Type: gpuhealthv1alpha1.ParserNCCLTests,
			NCCL: &gpuhealthv1alpha1.NCCLThresholds{Products: []gpuhealthv1alpha1.ProductThreshold{{Product: "NVIDIA-H100-80GB-HBM3", MinBusBandwidthGBps: 100}}}}},
	}
	o.policy.Spec.Certification = gpuhealthv1alpha1.CertificationSpec{NewNodes: true, Steps: steps, MaxAttempts: 2, Backoff: dur("1m")}
	o.policy.Spec.Recertification.Steps = steps
	o.policy.Spec.Recertification.SoakWindow = dur("0s")
	o.node.Labels = map[string]string{"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
}

func newNode(o *observation) { o.nh.Status = gpuhealthv1alpha1.NodeHealthStatus{} }

// certAttempt puts the node in certification attempt n, started a minute
// ago, with its uncertified taint on.
func certAttempt(n int32) func(*observation) {
	return func(o *observation) {
		inPhase(certifying)(o)
		started := metav1.NewTime(t0.Add(-time.Minute))
		o.nh.Status.Certification = &gpuhealthv1alpha1.RecertificationStatus{Attempt: n, StartedAt: &started, Result: gpuhealthv1alpha1.JobPending}
		o.node.Spec.Taints = append(o.node.Spec.Taints, nodepkg.UncertifiedTaint)
		if o.node.Annotations == nil {
			o.node.Annotations = map[string]string{}
		}
		o.node.Annotations[nodepkg.UncertifiedAnnotation] = "taint"
	}
}

// stepDone records step i of the current attempt as passed.
func stepDone(rc func(*observation) *gpuhealthv1alpha1.RecertificationStatus, names ...string) func(*observation) {
	return func(o *observation) {
		at := metav1.NewTime(t0.Add(-30 * time.Second))
		for _, n := range names {
			parser := gpuhealthv1alpha1.ParserExitCode
			for _, s := range o.policy.Spec.Certification.Steps {
				if s.Name == n {
					parser = s.Parser.Type
				}
			}
			rc(o).Steps = append(rc(o).Steps, gpuhealthv1alpha1.StepResult{Name: n, Parser: parser, Result: gpuhealthv1alpha1.JobSucceeded, CompletedAt: &at})
		}
	}
}

// unschedulable is the scheduler's word for a step whose pod asks for
// what the node lacks.
const unschedulable = "pod x not scheduled (Unschedulable): 0/1 nodes are available: 1 Insufficient example.com/gpu."

// stepWaiting records the step as started, on its try, and waiting to run
// for the unschedulable reason.
func stepWaiting(rc func(*observation) *gpuhealthv1alpha1.RecertificationStatus, step string, try int32) func(*observation) {
	return func(o *observation) {
		at := metav1.NewTime(t0.Add(-55 * time.Second))
		r := rc(o)
		parser := gpuhealthv1alpha1.ParserExitCode
		for _, s := range o.policy.Spec.Certification.Steps {
			if s.Name == step {
				parser = s.Parser.Type
			}
		}
		r.Steps = append(r.Steps, gpuhealthv1alpha1.StepResult{Name: step, Parser: parser, Result: gpuhealthv1alpha1.JobPending,
			StartedAt: &at, NotRun: try, Message: "waiting: " + unschedulable,
			Job: job.StepTryName(kindOf(o), step, "n", r.Attempt, r.StartedAt.Time, try)})
	}
}

func kindOf(o *observation) job.Kind {
	if o.nh.Status.Phase == certifying {
		return job.Certification
	}
	return job.Recertification
}

func certStatus(o *observation) *gpuhealthv1alpha1.RecertificationStatus {
	return o.nh.Status.Certification
}
func recertStatus(o *observation) *gpuhealthv1alpha1.RecertificationStatus {
	return o.nh.Status.Recertification
}

// stepJob adds the step's Job of the current attempt, finished as result,
// with what it printed.
func stepJob(kind job.Kind, rc func(*observation) *gpuhealthv1alpha1.RecertificationStatus, step string, result gpuhealthv1alpha1.JobResult, output []byte) func(*observation) {
	return func(o *observation) {
		r := rc(o)
		var try int32 // the step's current try, as recorded
		for _, sr := range r.Steps {
			if sr.Name == step {
				try = sr.NotRun
			}
		}
		j := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: job.StepTryName(kind, step, "n", r.Attempt, r.StartedAt.Time, try), Namespace: o.namespace}}
		done := metav1.NewTime(t0.Add(-10 * time.Second))
		switch result {
		case gpuhealthv1alpha1.JobNotRun: // its deadline, with no pod ever ready
			j.Status.Conditions = []batchv1.JobCondition{{Type: batchv1.JobFailed, Status: corev1.ConditionTrue, Reason: batchv1.JobReasonDeadlineExceeded,
				Message: "Job was active longer than specified deadline", LastTransitionTime: done}}
			j.Status.Failed = 1
		case gpuhealthv1alpha1.JobPending:
			j.Status.Active, j.Status.Ready = 1, ptr.To[int32](0)
		case gpuhealthv1alpha1.JobSucceeded:
			j.Status.Conditions = []batchv1.JobCondition{{Type: batchv1.JobComplete, Status: corev1.ConditionTrue, LastTransitionTime: done}}
		case gpuhealthv1alpha1.JobFailed:
			j.Status.Conditions = []batchv1.JobCondition{{Type: batchv1.JobFailed, Status: corev1.ConditionTrue, Message: "exit 1", LastTransitionTime: done}}
		case gpuhealthv1alpha1.JobRunning:
			j.Status.Active, j.Status.Ready = 1, ptr.To[int32](1)
		}
		o.jobs[j.Name] = j
		if output != nil {
			if o.outputs == nil {
				o.outputs = map[string]jobOutput{}
			}
			o.outputs[j.Name] = jobOutput{text: output}
		}
	}
}

func TestDecideCertification(t *testing.T) {
	rows := []row{
		{"a new node without workloads: held out, certification attempt 1 written first", obs(suitePolicy, newNode), func(g *WithT, p *plan) {
			g.Expect(phasesOf(p)).To(Equal([]gpuhealthv1alpha1.NodeHealthPhase{certifying}))
			g.Expect(p.status.History).To(HaveLen(2), "Managed, then Certifying")
			g.Expect(p.status.Certification.Attempt).To(Equal(int32(1)))
			g.Expect(p.node).To(Equal(nodeUncertified))
			g.Expect(p.immediate).To(BeTrue())
			g.Expect(p.createJobs).To(BeEmpty(), "no Job before the attempt's start is written")
		}},
		{"a new node with workloads: stays in service, not certified", obs(suitePolicy, newNode, func(o *observation) { o.workloads = []string{"ml/trainer-0"} }), func(g *WithT, p *plan) {
			g.Expect(p.status.Phase).To(Equal(healthy))
			g.Expect(p.node).To(Equal(nodeInService))
			c := meta.FindStatusCondition(p.status.Conditions, gpuhealthv1alpha1.NodeHealthCertifiedCondition)
			g.Expect(c).NotTo(BeNil())
			g.Expect(c.Status).To(Equal(metav1.ConditionFalse))
			g.Expect(c.Reason).To(Equal(gpuhealthv1alpha1.ReasonNotCertified))
			g.Expect(c.Message).To(ContainSubstring("ml/trainer-0"))
		}},
		{"a new node, newNodes off: in service", obs(suitePolicy, newNode, func(o *observation) { o.policy.Spec.Certification.NewNodes = false }), func(g *WithT, p *plan) {
			g.Expect(p.status.Phase).To(Equal(healthy))
			g.Expect(p.node).To(Equal(nodeInService))
		}},
		{"a new node whose pods cannot be listed: no decision", obs(suitePolicy, newNode, func(o *observation) { o.workloadsErr = errors.New("boom") }), func(g *WithT, p *plan) {
			g.Expect(p.err).To(MatchError("boom"))
		}},
		{"a node already managed is not certified for being idle", obs(suitePolicy), func(g *WithT, p *plan) {
			g.Expect(p.status.Phase).To(Equal(healthy))
		}},
		{"a human's certify label on a healthy node: certification", obs(suitePolicy, func(o *observation) { o.node.Labels[gpuhealthv1alpha1.CertifyLabel] = "t-7" }), func(g *WithT, p *plan) {
			g.Expect(phasesOf(p)).To(Equal([]gpuhealthv1alpha1.NodeHealthPhase{certifying}))
			g.Expect(p.status.History[len(p.status.History)-1].Reason).To(Equal(gpuhealthv1alpha1.ReasonCertificationRequested))
			g.Expect(p.status.Certification.Request).To(Equal("t-7"))
			g.Expect(p.status.CertifyRequest).To(Equal("t-7"), "acted on once")
		}},
		{"a certify label on a node running workloads: refused once, saying why", obs(suitePolicy, func(o *observation) {
			o.node.Labels[gpuhealthv1alpha1.CertifyLabel] = "t-8"
			o.workloads = []string{"ml/trainer-0", "ml/trainer-1"}
		}), func(g *WithT, p *plan) {
			g.Expect(p.transitions).To(BeEmpty(), "no certification on someone's GPUs")
			g.Expect(p.status.Reason).To(Equal(gpuhealthv1alpha1.ReasonCertificationRefused))
			g.Expect(p.status.Message).To(ContainSubstring("runs 2 workload pods (ml/trainer-0, ml/trainer-1)"))
			g.Expect(p.status.CertifyRequest).To(Equal("t-8"), "refused once: the same value is not asked again")
			g.Expect(reasonsOf(p.announce)).To(ContainElement("Warning " + gpuhealthv1alpha1.ReasonCertificationRefused))
		}},
		{"a certify label acted on before (then cancelled): not again", obs(suitePolicy, func(o *observation) {
			o.node.Labels[gpuhealthv1alpha1.CertifyLabel] = "t-7"
			o.nh.Status.CertifyRequest = "t-7"
		}), func(g *WithT, p *plan) {
			g.Expect(p.transitions).To(BeEmpty())
		}},
		{"a label-requested certification released: Healthy, and it does not start again", obs(suitePolicy, certAttempt(1), asks(gpuhealthv1alpha1.RequestRelease), func(o *observation) {
			o.node.Labels[gpuhealthv1alpha1.CertifyLabel] = "t-7"
			o.nh.Status.CertifyRequest = "t-7"
		}), func(g *WithT, p *plan) {
			g.Expect(phasesOf(p)).To(Equal([]gpuhealthv1alpha1.NodeHealthPhase{healthy}))
			g.Expect(p.err).NotTo(HaveOccurred())
		}},
		{"a label-requested certification's taint removed: cancelled once", obs(suitePolicy, certAttempt(1), func(o *observation) {
			o.node.Labels[gpuhealthv1alpha1.CertifyLabel] = "t-7"
			o.nh.Status.CertifyRequest = "t-7"
			o.node.Spec.Taints = nil
		}), func(g *WithT, p *plan) {
			g.Expect(phasesOf(p)).To(Equal([]gpuhealthv1alpha1.NodeHealthPhase{healthy}))
			g.Expect(p.err).NotTo(HaveOccurred())
		}},
		{"certifying: a step inserted before the passed ones: the attempt starts again", obs(suitePolicy, certAttempt(1), func(o *observation) {
			at := metav1.NewTime(t0.Add(-30 * time.Second))
			o.nh.Status.Certification.Steps = []gpuhealthv1alpha1.StepResult{{Name: "nccl", Parser: gpuhealthv1alpha1.ParserNCCLTests, Result: gpuhealthv1alpha1.JobSucceeded, CompletedAt: &at}}
		}), func(g *WithT, p *plan) {
			c := p.status.Certification
			g.Expect(c.Steps).To(BeEmpty())
			g.Expect(c.StartedAt.Time).To(Equal(t0), "new Job names")
			g.Expect(c.Attempt).To(Equal(int32(1)))
			g.Expect(p.createJobs).To(BeEmpty())
			g.Expect(p.immediate).To(BeTrue())
			g.Expect(p.status.Message).To(ContainSubstring("step 1 is dcgm (dcgm-diag) now, the attempt ran nccl (nccl-tests)"))
		}},
		{"recertifying: the suite changed after the reset: the attempt starts again, the reset is not done again", obs(suitePolicy, resetOn48, attempt(1), func(o *observation) {
			at := metav1.NewTime(t0.Add(-30 * time.Second))
			rc := o.nh.Status.Recertification
			rc.Remediation, rc.RemediatedAt, rc.RemediationJob = gpuhealthv1alpha1.ActionResetGPU, &at, job.Name(job.ResetGPU, "n", 1, rc.StartedAt.Time)
			rc.Steps = []gpuhealthv1alpha1.StepResult{{Name: "nccl", Parser: gpuhealthv1alpha1.ParserNCCLTests, Result: gpuhealthv1alpha1.JobSucceeded, CompletedAt: &at}}
		}, finding(code48)), func(g *WithT, p *plan) {
			rc := p.status.Recertification
			g.Expect(rc.StartedAt.Time).To(Equal(t0), "started again")
			g.Expect(rc.Remediation).To(Equal(gpuhealthv1alpha1.ActionResetGPU))
			g.Expect(rc.RemediatedAt).NotTo(BeNil(), "its reset is done: a new start's name would make a second one")
		}},
		{"certifying: a running step's parser changed: the attempt starts again, its Job goes", obs(suitePolicy, certAttempt(1), func(o *observation) {
			o.nh.Status.Certification.Steps = []gpuhealthv1alpha1.StepResult{{Name: "dcgm", Parser: gpuhealthv1alpha1.ParserExitCode, Result: gpuhealthv1alpha1.JobRunning,
				Job: job.StepName(job.Certification, "dcgm", "n", 1, t0.Add(-time.Minute))}}
			stepJob(job.Certification, certStatus, "dcgm", gpuhealthv1alpha1.JobRunning, nil)(o)
		}), func(g *WithT, p *plan) {
			g.Expect(p.status.Certification.Steps).To(BeEmpty())
			g.Expect(p.deleteJobs).To(BeTrue())
		}},
		{"a certify label already answered: nothing", obs(suitePolicy, func(o *observation) {
			o.node.Labels[gpuhealthv1alpha1.CertifyLabel] = "t-7"
			o.nh.Status.Certificate = &gpuhealthv1alpha1.Certificate{Time: metav1.NewTime(t0), Suite: gpuhealthv1alpha1.SuiteCertification, Request: "t-7"}
		}), func(g *WithT, p *plan) {
			g.Expect(p.transitions).To(BeEmpty())
			g.Expect(meta.IsStatusConditionTrue(p.status.Conditions, gpuhealthv1alpha1.NodeHealthCertifiedCondition)).To(BeTrue())
		}},
		{"a new node, dry run: recorded, not certified", obs(suitePolicy, newNode, dryRun), func(g *WithT, p *plan) {
			g.Expect(p.status.Phase).To(Equal(healthy))
			g.Expect(p.status.Reason).To(Equal(gpuhealthv1alpha1.ReasonDryRun))
			g.Expect(p.createJobs).To(BeEmpty())
		}},

		// Certifying.
		{"certifying: the first step's Job is created", obs(suitePolicy, certAttempt(1)), func(g *WithT, p *plan) {
			g.Expect(p.createJobs).To(HaveLen(1))
			j := p.createJobs[0]
			g.Expect(j.Labels).To(HaveKeyWithValue(job.StepLabel, "dcgm"))
			g.Expect(j.Labels).To(HaveKeyWithValue(job.ParserLabel, "dcgm-diag"))
			g.Expect(j.Labels).To(HaveKeyWithValue(job.KindLabel, string(job.Certification)))
			g.Expect(p.status.Certification.Steps).To(HaveLen(1))
			g.Expect(p.status.Certification.Steps[0].Job).To(Equal(j.Name))
			g.Expect(p.status.Reason).To(Equal(gpuhealthv1alpha1.ReasonCertifying))
			g.Expect(p.node).To(Equal(nodeUncertified))
		}},
		{"certifying: a step passed, the next one starts", obs(suitePolicy, certAttempt(1), stepJob(job.Certification, certStatus, "dcgm", gpuhealthv1alpha1.JobSucceeded, dcgmPass)), func(g *WithT, p *plan) {
			steps := p.status.Certification.Steps
			g.Expect(steps).To(HaveLen(2))
			g.Expect(steps[0].Result).To(Equal(gpuhealthv1alpha1.JobSucceeded))
			g.Expect(steps[0].Measurements).To(ContainElement(gpuhealthv1alpha1.Measurement{Name: "testsPassed", Value: "3"}))
			g.Expect(steps[0].Duration).NotTo(BeNil())
			g.Expect(p.createJobs).To(HaveLen(1))
			g.Expect(p.createJobs[0].Labels).To(HaveKeyWithValue(job.StepLabel, "nccl"))
			g.Expect(p.steps).To(HaveLen(1))
			g.Expect(reasonsOf(p.announce)).To(ContainElement("Normal " + gpuhealthv1alpha1.ReasonStepPassed))
		}},
		{"certifying: a step's output not read yet is no verdict", obs(suitePolicy, certAttempt(1), stepJob(job.Certification, certStatus, "dcgm", gpuhealthv1alpha1.JobSucceeded, nil)), func(g *WithT, p *plan) {
			g.Expect(p.err).To(HaveOccurred())
			g.Expect(p.status.Certification.Steps[0].Result).NotTo(Equal(gpuhealthv1alpha1.JobSucceeded))
		}},
		{"certifying: reading a step's output failed for now: retried, no verdict", obs(suitePolicy, certAttempt(1), func(o *observation) {
			stepJob(job.Certification, certStatus, "dcgm", gpuhealthv1alpha1.JobSucceeded, nil)(o)
			o.outputs = map[string]jobOutput{job.StepName(job.Certification, "dcgm", "n", 1, t0.Add(-time.Minute)): {err: errors.New("kubelet unreachable")}}
		}), func(g *WithT, p *plan) {
			g.Expect(p.err).To(MatchError("kubelet unreachable"))
			g.Expect(p.status.Certification.Steps[0].Result).To(Equal(gpuhealthv1alpha1.JobPending))
		}},
		{"certifying: the output is gone: the step fails", obs(suitePolicy, certAttempt(1), func(o *observation) {
			stepJob(job.Certification, certStatus, "dcgm", gpuhealthv1alpha1.JobSucceeded, nil)(o)
			o.outputs = map[string]jobOutput{job.StepName(job.Certification, "dcgm", "n", 1, t0.Add(-time.Minute)): {err: fmt.Errorf("pod gone: %w", job.ErrNoOutput)}}
		}), func(g *WithT, p *plan) {
			g.Expect(p.status.Certification.Result).To(Equal(gpuhealthv1alpha1.JobFailed))
			g.Expect(p.status.Certification.Steps[0].Message).To(ContainSubstring("pod gone"))
		}},
		{"certifying: low NCCL bandwidth fails the attempt; backoff", obs(suitePolicy, certAttempt(1), stepDone(certStatus, "dcgm"),
			stepJob(job.Certification, certStatus, "nccl", gpuhealthv1alpha1.JobSucceeded, ncclReport(42.5))), func(g *WithT, p *plan) {
			c := p.status.Certification
			g.Expect(p.status.Phase).To(Equal(certifying))
			g.Expect(c.Result).To(Equal(gpuhealthv1alpha1.JobFailed))
			g.Expect(c.Steps[1].Result).To(Equal(gpuhealthv1alpha1.JobFailed))
			g.Expect(c.Steps[1].Message).To(ContainSubstring("42.5 GB/s at 4294967296 B is below the 100 GB/s threshold for NVIDIA-H100-80GB-HBM3"))
			g.Expect(c.Steps[1].Measurements).To(ContainElement(gpuhealthv1alpha1.Measurement{Name: "busBandwidth", Value: "42.5", Unit: "GB/s"}))
			g.Expect(p.status.Reason).To(Equal(gpuhealthv1alpha1.ReasonCertificationFailed))
			g.Expect(p.requeue).To(Equal(time.Minute))
			g.Expect(p.node).To(Equal(nodeUncertified), "still held out")
			g.Expect(meta.IsStatusConditionFalse(p.status.Conditions, gpuhealthv1alpha1.NodeHealthCertifiedCondition)).To(BeTrue())
		}},
		{"certifying: in the backoff nothing runs", obs(suitePolicy, certAttempt(1), func(o *observation) {
			at := metav1.NewTime(t0.Add(-30 * time.Second))
			o.nh.Status.Certification.Result, o.nh.Status.Certification.CompletedAt = gpuhealthv1alpha1.JobFailed, &at
		}), func(g *WithT, p *plan) {
			g.Expect(p.status.Reason).To(Equal(gpuhealthv1alpha1.ReasonBackoff))
			g.Expect(p.createJobs).To(BeEmpty())
			g.Expect(p.requeue).To(Equal(30 * time.Second))
		}},
		{"certifying: past the backoff, attempt 2 is written first", obs(suitePolicy, certAttempt(1), func(o *observation) {
			at := metav1.NewTime(t0.Add(-2 * time.Minute))
			o.nh.Status.Certification.Result, o.nh.Status.Certification.CompletedAt = gpuhealthv1alpha1.JobFailed, &at
		}), func(g *WithT, p *plan) {
			g.Expect(p.status.Certification.Attempt).To(Equal(int32(2)))
			g.Expect(p.status.Certification.Steps).To(BeEmpty())
			g.Expect(p.immediate).To(BeTrue())
			g.Expect(p.createJobs).To(BeEmpty())
		}},
		{"certifying: the last attempt fails: Failed", obs(suitePolicy, certAttempt(2), stepJob(job.Certification, certStatus, "dcgm", gpuhealthv1alpha1.JobFailed,
			[]byte(`{"DCGM GPU Diagnostic": {"test_categories": [{"category": "Hardware", "tests": [{"name": "Memory", "results": [{"gpu_ids": "3", "status": "Fail", "warnings": [{"warning": "Error using CUDA API cudaMalloc", "error_id": 82}]}]}]}]}}`))), func(g *WithT, p *plan) {
			g.Expect(phasesOf(p)).To(Equal([]gpuhealthv1alpha1.NodeHealthPhase{gpuhealthv1alpha1.PhaseFailed}))
			g.Expect(p.status.History[len(p.status.History)-1].Reason).To(Equal(gpuhealthv1alpha1.ReasonCertificationExhausted))
			g.Expect(p.status.Certification.Steps[0].Message).To(ContainSubstring("Memory on GPU 3: Error using CUDA API cudaMalloc"))
		}},
		{"certifying: every step passed: certified, back in service", obs(suitePolicy, certAttempt(1), stepDone(certStatus, "dcgm"),
			stepJob(job.Certification, certStatus, "nccl", gpuhealthv1alpha1.JobSucceeded, ncclReport(405.79))), func(g *WithT, p *plan) {
			g.Expect(phasesOf(p)).To(Equal([]gpuhealthv1alpha1.NodeHealthPhase{healthy}))
			g.Expect(p.status.History[len(p.status.History)-1].Reason).To(Equal(gpuhealthv1alpha1.ReasonCertified))
			g.Expect(p.status.Certification).To(BeNil())
			cert := p.status.Certificate
			g.Expect(cert).NotTo(BeNil())
			g.Expect(cert.Suite).To(Equal(gpuhealthv1alpha1.SuiteCertification))
			g.Expect(cert.Time).To(Equal(metav1.NewTime(t0)))
			g.Expect(cert.Steps).To(HaveLen(2))
			g.Expect(cert.Steps[1].Measurements).To(ContainElement(gpuhealthv1alpha1.Measurement{Name: "busBandwidth", Value: "405.79", Unit: "GB/s"}))
			g.Expect(meta.IsStatusConditionTrue(p.status.Conditions, gpuhealthv1alpha1.NodeHealthCertifiedCondition)).To(BeTrue())
			g.Expect(p.node).To(Equal(nodeInService), "the taint goes after the write")
		}},
		{"certifying, an empty suite: certified at once", obs(suitePolicy, certAttempt(1), func(o *observation) { o.policy.Spec.Certification.Steps = nil }), func(g *WithT, p *plan) {
			g.Expect(phasesOf(p)).To(Equal([]gpuhealthv1alpha1.NodeHealthPhase{healthy}))
			g.Expect(p.status.Certificate).NotTo(BeNil())
		}},
		{"certifying: a fault fences the node", obs(suitePolicy, certAttempt(1), finding(), breakerClosed), func(g *WithT, p *plan) {
			g.Expect(p.node).To(Equal(nodeFence))
			g.Expect(p.fenceOnly).To(BeTrue())
		}},
		{"certifying, fenced: quarantined, certification ends, its Jobs go", obs(suitePolicy, certAttempt(1), finding(), fenced, room,
			stepJob(job.Certification, certStatus, "dcgm", gpuhealthv1alpha1.JobRunning, nil)), func(g *WithT, p *plan) {
			g.Expect(phasesOf(p)).To(Equal([]gpuhealthv1alpha1.NodeHealthPhase{quarantined, draining}))
			g.Expect(p.status.Certification).To(BeNil())
			g.Expect(p.deleteJobs).To(BeTrue())
		}},
		{"certifying: someone removed the uncertified taint: cancelled, not certified", obs(suitePolicy, certAttempt(1), func(o *observation) { o.node.Spec.Taints = nil }), func(g *WithT, p *plan) {
			g.Expect(phasesOf(p)).To(Equal([]gpuhealthv1alpha1.NodeHealthPhase{healthy}))
			g.Expect(p.status.History[len(p.status.History)-1].Reason).To(Equal(gpuhealthv1alpha1.ReasonUncertifiedTaintRemoved))
			g.Expect(meta.IsStatusConditionFalse(p.status.Conditions, gpuhealthv1alpha1.NodeHealthCertifiedCondition)).To(BeTrue())
		}},
		{"certifying, held: paused", obs(suitePolicy, certAttempt(1), held), func(g *WithT, p *plan) {
			g.Expect(p.status.Reason).To(Equal(gpuhealthv1alpha1.ReasonHeld))
			g.Expect(p.createJobs).To(BeEmpty())
			g.Expect(p.node).To(Equal(nodeUncertified))
		}},
		{"certifying: a Release request returns the node uncertified", obs(suitePolicy, certAttempt(1), asks(gpuhealthv1alpha1.RequestRelease)), func(g *WithT, p *plan) {
			g.Expect(phasesOf(p)).To(Equal([]gpuhealthv1alpha1.NodeHealthPhase{healthy}))
			g.Expect(p.status.Certificate).To(BeNil())
			g.Expect(p.node).To(Equal(nodeInService))
		}},

		// A step that never ran.
		{"certifying: a step's pod waits: why, in status and kept in the step", obs(suitePolicy, certAttempt(1), stepWaiting(certStatus, "dcgm", 0),
			stepJob(job.Certification, certStatus, "dcgm", gpuhealthv1alpha1.JobPending, nil), func(o *observation) {
				o.waits = map[string]string{job.StepName(job.Certification, "dcgm", "n", 1, t0.Add(-time.Minute)): unschedulable}
			}), func(g *WithT, p *plan) {
			g.Expect(p.status.Message).To(ContainSubstring(unschedulable))
			g.Expect(p.status.Certification.Steps[0].Message).To(Equal("waiting: " + unschedulable))
			g.Expect(p.transitions).To(BeEmpty())
		}},
		{"certifying: a step's Job reached its deadline without running: tried again, no attempt spent", obs(suitePolicy, certAttempt(1), stepWaiting(certStatus, "dcgm", 0),
			stepJob(job.Certification, certStatus, "dcgm", gpuhealthv1alpha1.JobNotRun, nil)), func(g *WithT, p *plan) {
			c := p.status.Certification
			g.Expect(p.transitions).To(BeEmpty())
			g.Expect(c.Attempt).To(Equal(int32(1)), "no attempt spent")
			g.Expect(c.Result).To(Equal(gpuhealthv1alpha1.JobPending))
			g.Expect(c.Steps[0].NotRun).To(Equal(int32(1)))
			g.Expect(c.Steps[0].Result).To(Equal(gpuhealthv1alpha1.JobPending))
			g.Expect(c.Steps[0].Message).To(And(ContainSubstring("try 1 of 3"), ContainSubstring("never ran within its 30m0s deadline"), ContainSubstring("Insufficient example.com/gpu")))
			g.Expect(reasonsOf(p.announce)).To(ContainElement("Warning " + gpuhealthv1alpha1.ReasonStepNotRun))
			g.Expect(p.createJobs).To(BeEmpty(), "the next try's Job follows in the next pass")
			g.Expect(p.immediate).To(BeTrue())
			g.Expect(p.steps).To(BeEmpty(), "no verdict counted")
		}},
		{"certifying: the next try gets a Job of its own", obs(suitePolicy, certAttempt(1), stepWaiting(certStatus, "dcgm", 1), func(o *observation) {
			// The first try's Job stays, finished, for its TTL.
			name := job.StepName(job.Certification, "dcgm", "n", 1, t0.Add(-time.Minute))
			o.jobs[name] = &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: o.namespace}, Status: batchv1.JobStatus{
				Conditions: []batchv1.JobCondition{{Type: batchv1.JobFailed, Status: corev1.ConditionTrue, Reason: batchv1.JobReasonDeadlineExceeded}}}}
		}), func(g *WithT, p *plan) {
			g.Expect(p.createJobs).To(HaveLen(1))
			g.Expect(p.createJobs[0].Name).To(Equal(job.StepTryName(job.Certification, "dcgm", "n", 1, t0.Add(-time.Minute), 1)))
			g.Expect(p.createJobs[0].Name).To(ContainSubstring("-1t1-"))
		}},
		{"certifying: a step that ran and then hit its deadline failed its test", obs(suitePolicy, certAttempt(1), stepWaiting(certStatus, "dcgm", 0), func(o *observation) {
			at := metav1.NewTime(t0.Add(-50 * time.Second))
			o.nh.Status.Certification.Steps[0].RunningAt = &at
		}, stepJob(job.Certification, certStatus, "dcgm", gpuhealthv1alpha1.JobNotRun, []byte("Running test Memory...\n"))), func(g *WithT, p *plan) {
			g.Expect(p.status.Certification.Result).To(Equal(gpuhealthv1alpha1.JobFailed))
			g.Expect(p.status.Certification.Steps[0].Result).To(Equal(gpuhealthv1alpha1.JobFailed))
			g.Expect(p.status.Reason).To(Equal(gpuhealthv1alpha1.ReasonCertificationFailed))
		}},
		{"certifying: a step never seen waiting nor running that hit its deadline failed: no evidence it never ran", obs(suitePolicy, certAttempt(1), stepWaiting(certStatus, "dcgm", 0), func(o *observation) {
			o.nh.Status.Certification.Steps[0].Message = ""
		}, stepJob(job.Certification, certStatus, "dcgm", gpuhealthv1alpha1.JobNotRun, []byte("Running test Memory...\n"))), func(g *WithT, p *plan) {
			g.Expect(p.status.Certification.Steps[0].Result).To(Equal(gpuhealthv1alpha1.JobFailed))
			g.Expect(p.status.Certification.Steps[0].NotRun).To(BeZero())
		}},
		{"certifying: a pod seen ready marks the step as running", obs(suitePolicy, certAttempt(1), stepWaiting(certStatus, "dcgm", 0),
			stepJob(job.Certification, certStatus, "dcgm", gpuhealthv1alpha1.JobRunning, nil)), func(g *WithT, p *plan) {
			g.Expect(p.status.Certification.Steps[0].RunningAt).NotTo(BeNil())
			g.Expect(p.status.Certification.Steps[0].Message).To(BeEmpty(), "no longer waiting")
		}},
		{"certifying: the last try never ran: Failed with SuiteNotRun, not handed off", obs(suitePolicy, certAttempt(1), stepWaiting(certStatus, "dcgm", 2),
			stepJob(job.Certification, certStatus, "dcgm", gpuhealthv1alpha1.JobNotRun, nil)), func(g *WithT, p *plan) {
			c := p.status.Certification
			g.Expect(phasesOf(p)).To(Equal([]gpuhealthv1alpha1.NodeHealthPhase{gpuhealthv1alpha1.PhaseFailed}))
			last := p.status.History[len(p.status.History)-1]
			g.Expect(last.Reason).To(Equal(gpuhealthv1alpha1.ReasonSuiteNotRun))
			g.Expect(last.Message).To(ContainSubstring("could not run its suite: step dcgm: never ran in 3 tries"))
			g.Expect(c.Result).To(Equal(gpuhealthv1alpha1.JobNotRun))
			g.Expect(c.Steps[0].Result).To(Equal(gpuhealthv1alpha1.JobNotRun))
			g.Expect(c.Attempt).To(Equal(int32(1)))
			g.Expect(handOffReason(last.Reason, p.status.Outage)).To(BeEmpty(), "the cluster kept the test from running, not the GPU")
			g.Expect(meta.IsStatusConditionFalse(p.status.Conditions, gpuhealthv1alpha1.NodeHealthCertifiedCondition)).To(BeTrue())
		}},
		{"recertifying: a step never ran: tried again, the attempt not spent", obs(suitePolicy, attempt(1), stepWaiting(recertStatus, "dcgm", 0),
			stepJob(job.Recertification, recertStatus, "dcgm", gpuhealthv1alpha1.JobNotRun, nil)), func(g *WithT, p *plan) {
			g.Expect(p.transitions).To(BeEmpty())
			g.Expect(p.status.Recertification.Attempt).To(Equal(int32(1)))
			g.Expect(p.status.Recertification.Steps[0].NotRun).To(Equal(int32(1)))
			g.Expect(p.status.Reason).To(Equal(gpuhealthv1alpha1.ReasonRecertifying))
		}},
		{"recertifying: a policy's maxNotRun of 1: the first try that never ran ends it", obs(suitePolicy, attempt(1), stepWaiting(recertStatus, "dcgm", 0),
			func(o *observation) { o.policy.Spec.Recertification.MaxNotRun = 1 },
			stepJob(job.Recertification, recertStatus, "dcgm", gpuhealthv1alpha1.JobNotRun, nil)), func(g *WithT, p *plan) {
			g.Expect(phasesOf(p)).To(Equal([]gpuhealthv1alpha1.NodeHealthPhase{gpuhealthv1alpha1.PhaseFailed}))
			g.Expect(p.status.History[len(p.status.History)-1].Reason).To(Equal(gpuhealthv1alpha1.ReasonSuiteNotRun))
		}},

		{"recertifying: a release cancels the attempt, naming each step's outcome", obs(suitePolicy, attempt(1), stepDone(recertStatus, "dcgm"), stepWaiting(recertStatus, "nccl", 0),
			stepJob(job.Recertification, recertStatus, "nccl", gpuhealthv1alpha1.JobRunning, nil), asks(gpuhealthv1alpha1.RequestRelease)), func(g *WithT, p *plan) {
			g.Expect(phasesOf(p)).To(Equal([]gpuhealthv1alpha1.NodeHealthPhase{healthy}))
			g.Expect(p.status.History[len(p.status.History)-1].Message).To(ContainSubstring("recertification attempt 1 cancelled (dcgm succeeded, nccl cancelled)"))
			g.Expect(p.deleteJobs).To(BeTrue())
		}},

		// Recertification suites.
		{"recertifying: a suite step fails on low bandwidth: attempt failed", obs(suitePolicy, attempt(1), stepDone(recertStatus, "dcgm"),
			stepJob(job.Recertification, recertStatus, "nccl", gpuhealthv1alpha1.JobSucceeded, ncclReport(80))), func(g *WithT, p *plan) {
			g.Expect(phasesOf(p)).To(Equal([]gpuhealthv1alpha1.NodeHealthPhase{quarantined}))
			g.Expect(p.status.Recertification.Message).To(ContainSubstring("step nccl: bus bandwidth 80 GB/s"))
			g.Expect(p.status.Recertification.Steps[1].Result).To(Equal(gpuhealthv1alpha1.JobFailed))
		}},
		{"recertifying: the suite passed: Healthy with a recertification certificate", obs(suitePolicy, attempt(2), stepDone(recertStatus, "dcgm"),
			stepJob(job.Recertification, recertStatus, "nccl", gpuhealthv1alpha1.JobSucceeded, ncclReport(120))), func(g *WithT, p *plan) {
			g.Expect(phasesOf(p)).To(Equal([]gpuhealthv1alpha1.NodeHealthPhase{healthy}))
			g.Expect(p.status.Certificate.Suite).To(Equal(gpuhealthv1alpha1.SuiteRecertification))
			g.Expect(p.status.Certificate.Attempt).To(Equal(int32(2)))
			g.Expect(p.status.Certificate.Steps).To(HaveLen(2))
			g.Expect(p.status.History[len(p.status.History)-1].Message).To(ContainSubstring("dcgm succeeded, nccl succeeded"))
		}},
		{"recertifying, no suite: no certificate", obs(attempt(1), func(o *observation) { o.policy.Spec.Recertification.SoakWindow = dur("0s") }), func(g *WithT, p *plan) {
			g.Expect(phasesOf(p)).To(Equal([]gpuhealthv1alpha1.NodeHealthPhase{healthy}))
			g.Expect(p.status.Certificate).To(BeNil())
		}},
	}
	for _, r := range rows {
		t.Run(r.name, func(t *testing.T) {
			r.check(NewWithT(t), decide(r.obs))
		})
	}
}

// TestCertificationBudget: certifying nodes use a budget only where the
// policy says so.
// A certify label's request is decided on the node's workloads: observe
// reads them for it.
func TestCertifyLabelReadsWorkloads(t *testing.T) {
	g := NewWithT(t)
	labelled := obs(suitePolicy, func(o *observation) { o.node.Labels[gpuhealthv1alpha1.CertifyLabel] = "t-8" })
	g.Expect(inputsFor(labelled).workloads).To(BeTrue())
	labelled.nh.Status.CertifyRequest = "t-8"
	g.Expect(inputsFor(labelled).workloads).To(BeFalse(), "a request acted on needs nothing more")
}

func TestCertificationBudget(t *testing.T) {
	g := NewWithT(t)
	spec := &gpuhealthv1alpha1.RemediationPolicySpec{}
	g.Expect(spec.ConsumesBudget(certifying)).To(BeFalse())
	g.Expect(spec.ConsumesBudget(gpuhealthv1alpha1.PhaseDraining)).To(BeTrue())
	spec.Certification.CountAgainstBudget = true
	g.Expect(spec.ConsumesBudget(certifying)).To(BeTrue())
	g.Expect(spec.ConsumesBudget(healthy)).To(BeFalse())
}

// TestOutputUnreadableForLong: a step whose output cannot be read is
// retried for a while after its Job finished, then fails with the error.
func TestOutputUnreadableForLong(t *testing.T) {
	g := NewWithT(t)
	unreadable := func(finished time.Time) *observation {
		return obs(suitePolicy, certAttempt(1), func(o *observation) {
			stepJob(job.Certification, certStatus, "dcgm", gpuhealthv1alpha1.JobSucceeded, nil)(o)
			name := job.StepName(job.Certification, "dcgm", "n", 1, t0.Add(-time.Minute))
			o.jobs[name].Status.CompletionTime = &metav1.Time{Time: finished}
			o.outputs = map[string]jobOutput{name: {err: errors.New("the server rejected our request for an unknown reason")}}
		})
	}
	p := decide(unreadable(t0.Add(-time.Minute)))
	g.Expect(p.err).To(HaveOccurred(), "retried")
	g.Expect(p.status.Certification.Result).NotTo(Equal(gpuhealthv1alpha1.JobFailed))

	p = decide(unreadable(t0.Add(-outputRetry - time.Second)))
	g.Expect(p.err).NotTo(HaveOccurred())
	g.Expect(p.status.Certification.Result).To(Equal(gpuhealthv1alpha1.JobFailed))
	g.Expect(p.status.Certification.Steps[0].Message).To(ContainSubstring("rejected our request"))
}
