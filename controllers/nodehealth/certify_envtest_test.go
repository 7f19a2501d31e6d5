package nodehealth

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/remediation/job"
	nodepkg "github.com/gpuhealth/gpuhealth/remediation/node"
)

// fakeOutputs stands in for the kubelet's logs: what each Job printed.
type fakeOutputs struct {
	mu    sync.Mutex
	out   map[string][]byte
	reads int
}

func (f *fakeOutputs) Output(_ context.Context, _, name string) ([]byte, int64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reads++
	b, ok := f.out[name]
	if !ok {
		return nil, 0, fmt.Errorf("job %s: %w", name, job.ErrNoOutput)
	}
	return b, int64(len(b)), nil
}

func (f *fakeOutputs) set(name string, b []byte) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.out[name] = b
}

func hasUncertifiedTaint(n *corev1.Node) bool {
	return slices.ContainsFunc(n.Spec.Taints, func(t corev1.Taint) bool { return t.Key == gpuhealthv1alpha1.UncertifiedTaintKey })
}

// TestNewNodeCertifiedBeforeService: a node that joins without workloads is
// tainted uncertified (not cordoned), runs the suite's steps one Job at a
// time, fails an attempt on low NCCL bandwidth, passes the next, and
// returns with a certificate; a node with a workload when first managed is
// left in service, not certified.
func TestNewNodeCertifiedBeforeService(t *testing.T) {
	h := newHarness(t)
	outputs := &fakeOutputs{out: map[string][]byte{}}
	h.r.Outputs = outputs
	steps := []gpuhealthv1alpha1.SuiteStep{
		{Name: "dcgm", Job: gpuhealthv1alpha1.JobTemplate{Image: "dcgm"}, Parser: gpuhealthv1alpha1.ResultParser{Type: gpuhealthv1alpha1.ParserDCGMDiag}},
		{Name: "nccl", Job: gpuhealthv1alpha1.JobTemplate{Image: "nccl"}, Parser: gpuhealthv1alpha1.ResultParser{Type: gpuhealthv1alpha1.ParserNCCLTests,
			NCCL: &gpuhealthv1alpha1.NCCLThresholds{Products: []gpuhealthv1alpha1.ProductThreshold{{Product: "NVIDIA-H200", MinBusBandwidthGBps: 300}}}}},
	}
	h.policy(func(s *gpuhealthv1alpha1.RemediationPolicySpec) {
		s.Certification = gpuhealthv1alpha1.CertificationSpec{NewNodes: true, Steps: steps, MaxAttempts: 3, Backoff: dur("1m")}
		s.Quarantine.Taint = &gpuhealthv1alpha1.TaintSpec{Key: quarantineTaint, Effect: corev1.TaintEffectNoSchedule}
	})
	busy := h.node("busy", nil)
	h.pod(busy.Name, h.label+"-trainer", nil)
	n := h.node("new", func(n *corev1.Node) { n.Labels["nvidia.com/gpu.product"] = "NVIDIA-H200" })

	h.reconcile(busy.Name)
	nh := h.nodeHealth(busy.Name)
	h.g.Expect(nh.Status.Phase).To(Equal(healthy))
	h.g.Expect(meta.FindStatusCondition(nh.Status.Conditions, gpuhealthv1alpha1.NodeHealthCertifiedCondition).Reason).To(Equal(gpuhealthv1alpha1.ReasonNotCertified))
	h.g.Expect(hasUncertifiedTaint(h.getNode(busy.Name))).To(BeFalse(), "a node with workloads is not taken out")

	h.reconcile(n.Name)
	h.g.Expect(h.phase(n.Name)).To(Equal(certifying))
	live := h.getNode(n.Name)
	h.g.Expect(hasUncertifiedTaint(live)).To(BeTrue())
	h.g.Expect(live.Spec.Unschedulable).To(BeFalse(), "not cordoned: DaemonSets and the suite still run")
	h.g.Expect(live.Annotations).To(HaveKey(nodepkg.UncertifiedAnnotation))

	stepJobName := func(step string) string {
		c := h.nodeHealth(n.Name).Status.Certification
		return job.StepName(job.Certification, step, n.Name, c.Attempt, c.StartedAt.Time)
	}
	runStep := func(step string, output []byte) {
		t.Helper()
		name := stepJobName(step)
		h.g.Expect(h.jobExists(name)).To(BeTrue(), "job %s", name)
		outputs.set(name, output)
		h.finishJob(name, true)
		h.reconcile(n.Name)
	}
	h.reconcile(n.Name)
	runStep("dcgm", dcgmPass)
	h.g.Expect(h.nodeHealth(n.Name).Status.Certification.Steps[0].Result).To(Equal(gpuhealthv1alpha1.JobSucceeded))
	runStep("nccl", ncclReport(120))
	nh = h.nodeHealth(n.Name)
	h.g.Expect(nh.Status.Phase).To(Equal(certifying))
	h.g.Expect(nh.Status.Reason).To(Equal(gpuhealthv1alpha1.ReasonCertificationFailed))
	h.g.Expect(nh.Status.Certification.Steps[1].Message).To(ContainSubstring("below the 300 GB/s threshold for NVIDIA-H200"))
	h.g.Expect(hasUncertifiedTaint(h.getNode(n.Name))).To(BeTrue(), "still held out")
	reads := outputs.reads
	h.reconcile(n.Name)
	h.g.Expect(outputs.reads).To(Equal(reads), "a judged step's output is not read again")

	h.clock.Step(2 * time.Minute)
	h.reconcile(n.Name)
	h.g.Expect(h.nodeHealth(n.Name).Status.Certification.Attempt).To(Equal(int32(2)))
	h.reconcile(n.Name)
	runStep("dcgm", dcgmPass)
	runStep("nccl", ncclReport(405.5))

	nh = h.nodeHealth(n.Name)
	h.g.Expect(nh.Status.Phase).To(Equal(healthy))
	h.g.Expect(nh.Status.Certificate).NotTo(BeNil())
	h.g.Expect(nh.Status.Certificate.Attempt).To(Equal(int32(2)))
	h.g.Expect(nh.Status.Certificate.Steps).To(HaveLen(2))
	h.g.Expect(nh.Status.Certificate.Steps[1].Measurements).To(ContainElement(gpuhealthv1alpha1.Measurement{Name: "busBandwidth", Value: "405.5", Unit: "GB/s"}))
	h.g.Expect(meta.IsStatusConditionTrue(nh.Status.Conditions, gpuhealthv1alpha1.NodeHealthCertifiedCondition)).To(BeTrue())
	live = h.getNode(n.Name)
	h.g.Expect(hasUncertifiedTaint(live)).To(BeFalse(), "the taint goes once certified")
	h.g.Expect(live.Annotations).NotTo(HaveKey(nodepkg.UncertifiedAnnotation))
	h.g.Expect(strings.Join(h.events(), "\n")).To(ContainSubstring(gpuhealthv1alpha1.ReasonCertified))

	var jobs batchv1.JobList
	h.g.Expect(k8sClient.List(h.ctx, &jobs, client.InNamespace(jobNamespace), client.MatchingLabels{job.NodeLabel: n.Name})).To(Succeed())
	h.g.Expect(jobs.Items).To(HaveLen(4), "two steps, two attempts, no duplicate")
}
