package job

import (
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/utils/ptr"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
)

func TestName(t *testing.T) {
	g := NewWithT(t)
	started := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	g.Expect(Name(Recertification, "gpu-node-1", 2, started)).To(MatchRegexp(`^gpuhealth-recert-gpu-node-1-2-[0-9a-f]{5}$`))
	long := strings.Repeat("rack-17.tray-09.", 8) + "node"
	a, b := Name(RebootNode, long, 1, started), Name(RebootNode, long+"x", 1, started)
	for _, n := range []string{a, b} {
		g.Expect(len(n)).To(BeNumerically("<=", 63))
		g.Expect(validation.IsDNS1123Subdomain(n)).To(BeEmpty(), n)
		g.Expect(validation.IsValidLabelValue(n)).To(BeEmpty(), "the Job controller labels pods with the Job's name: %s", n)
	}
	g.Expect(a).NotTo(Equal(b), "shortened names stay unique per node")
	g.Expect(Name(RebootNode, long, 1, started)).To(Equal(a), "deterministic")
	g.Expect(Name(RebootNode, long, 2, started)).NotTo(Equal(a), "one Job per attempt")
	g.Expect(Name(RebootNode, long, 1, started.Add(time.Hour))).NotTo(Equal(a), "one Job per cycle: attempt 1 of the next cycle starts later")
	g.Expect(Name(RebootNode, long, 1, started.Add(time.Millisecond))).To(Equal(a), "the start as stored (whole seconds) decides")
}

// TestBuildToleratesTheNodesOwnTaints: a GPU pool's dedicated-node taint,
// there when the Job is made, is tolerated exactly; one gpuhealth already
// tolerates is not added twice.
func TestBuildToleratesTheNodesOwnTaints(t *testing.T) {
	g := NewWithT(t)
	taints := []corev1.Taint{
		{Key: "nvidia.com/gpu", Value: "present", Effect: corev1.TaintEffectNoSchedule},
		{Key: corev1.TaintNodeUnschedulable, Effect: corev1.TaintEffectNoSchedule},
	}
	j := Build(ResetGPU, "gpu-node-1", "gpuhealth-system", 1, time.Time{}, gpuhealthv1alpha1.JobTemplate{Image: "nvcr.io/nvidia/cuda:12"}, time.Minute,
		Env{ServiceAccount: DefaultServiceAccount, NodeTaints: taints})
	tols := j.Spec.Template.Spec.Tolerations
	g.Expect(tols).To(ContainElement(corev1.Toleration{Key: "nvidia.com/gpu", Operator: corev1.TolerationOpEqual, Value: "present", Effect: corev1.TaintEffectNoSchedule}))
	n := 0
	for _, tol := range tols {
		g.Expect(tol.Key).NotTo(BeEmpty(), "no toleration of every taint: %+v", tol)
		if tol.Key == corev1.TaintNodeUnschedulable {
			n++
		}
	}
	g.Expect(n).To(Equal(1))
}

func TestBuild(t *testing.T) {
	g := NewWithT(t)
	tmpl := gpuhealthv1alpha1.JobTemplate{
		Image: "dcgm", Command: []string{"dcgmi", "diag", "-r", "2"}, Privileged: true, HostPID: true,
		Labels:    map[string]string{"team": "infra", NodeLabel: "spoofed"},
		Resources: &corev1.ResourceRequirements{Limits: corev1.ResourceList{"nvidia.com/gpu": resourceQuantity("8")}},
	}
	quarantine := &gpuhealthv1alpha1.TaintSpec{Key: "example.com/gpu-quarantine", Effect: corev1.TaintEffectNoExecute}
	j := Build(Recertification, "gpu-node-1", "gpuhealth-system", 3, time.Time{}, tmpl, 20*time.Minute, Env{ServiceAccount: DefaultServiceAccount, Quarantine: quarantine})
	g.Expect(j.Name).To(Equal(Name(Recertification, "gpu-node-1", 3, time.Time{})))
	g.Expect(j.Namespace).To(Equal("gpuhealth-system"))
	g.Expect(*j.Spec.BackoffLimit).To(BeEquivalentTo(0), "gpuhealth counts attempts, not the Job")
	g.Expect(*j.Spec.ActiveDeadlineSeconds).To(BeEquivalentTo(1200))
	pod := j.Spec.Template
	g.Expect(pod.Labels).To(HaveKeyWithValue(NodeLabel, "gpu-node-1"), "our labels win over the template's")
	g.Expect(pod.Labels).To(HaveKeyWithValue("team", "infra"))
	g.Expect(pod.Labels).To(HaveKeyWithValue(AttemptLabel, "3"))
	g.Expect(pod.Spec.RestartPolicy).To(Equal(corev1.RestartPolicyNever))
	g.Expect(pod.Spec.HostPID).To(BeTrue())
	g.Expect(pod.Spec.ServiceAccountName).To(Equal(DefaultServiceAccount), "the install's Job account, without RBAC")
	g.Expect(pod.Spec.AutomountServiceAccountToken).To(Equal(ptr.To(false)), "no token to steal")
	for _, tol := range pod.Spec.Tolerations {
		g.Expect(tol.Key).NotTo(BeEmpty(), "no toleration of every taint: %+v", tol)
		g.Expect(tol.Operator).To(Equal(corev1.TolerationOpExists))
		g.Expect(tol.Effect).NotTo(BeEmpty(), "each by key and effect: %+v", tol)
	}
	keys := func(ts []corev1.Toleration) []string {
		var out []string
		for _, t := range ts {
			out = append(out, t.Key+":"+string(t.Effect))
		}
		return out
	}
	g.Expect(keys(pod.Spec.Tolerations)).To(ConsistOf(
		"example.com/gpu-quarantine:NoExecute", // the policy's quarantine taint
		gpuhealthv1alpha1.UncertifiedTaintKey+":NoSchedule",
		gpuhealthv1alpha1.FabricDegradedTaintKey+":NoSchedule",
		corev1.TaintNodeUnschedulable+":NoSchedule",
		corev1.TaintNodeNotReady+":NoExecute",
		corev1.TaintNodeUnreachable+":NoExecute",
	))
	g.Expect(keys(pod.Spec.Tolerations)).NotTo(ContainElement(HavePrefix("node-role.kubernetes.io/control-plane")))
	term := pod.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms[0]
	g.Expect(term.MatchFields[0].Values).To(Equal([]string{"gpu-node-1"}))
	c := pod.Spec.Containers[0]
	g.Expect(*c.SecurityContext.Privileged).To(BeTrue())
	g.Expect(c.Resources.Limits).To(HaveKey(corev1.ResourceName("nvidia.com/gpu")))
}

func TestBuildServiceAccount(t *testing.T) {
	cases := []struct {
		name      string
		named     string
		wantSA    string
		wantToken bool
	}{
		{name: "a template that names none runs as the install's Job account without its token", wantSA: DefaultServiceAccount},
		{name: "a template that names the Job account gets no token either", named: DefaultServiceAccount, wantSA: DefaultServiceAccount},
		{name: "a template that names an account the install allowed gets its token", named: "dcgm-exporter", wantSA: "dcgm-exporter", wantToken: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			j := Build(ResetGPU, "n", "ns", 1, time.Time{}, gpuhealthv1alpha1.JobTemplate{Image: "i", ServiceAccountName: tc.named}, time.Minute, Env{ServiceAccount: DefaultServiceAccount})
			g.Expect(j.Spec.Template.Spec.ServiceAccountName).To(Equal(tc.wantSA))
			g.Expect(j.Spec.Template.Spec.AutomountServiceAccountToken).To(Equal(ptr.To(tc.wantToken)))
		})
	}
}

func TestResult(t *testing.T) {
	cases := []struct {
		name   string
		status batchv1.JobStatus
		want   gpuhealthv1alpha1.JobResult
	}{
		{"a new Job is pending", batchv1.JobStatus{}, gpuhealthv1alpha1.JobPending},
		{"an active pod means running", batchv1.JobStatus{Active: 1}, gpuhealthv1alpha1.JobRunning},
		{"Complete means succeeded", batchv1.JobStatus{Conditions: []batchv1.JobCondition{{Type: batchv1.JobComplete, Status: corev1.ConditionTrue}}}, gpuhealthv1alpha1.JobSucceeded},
		{"Failed means failed", batchv1.JobStatus{Conditions: []batchv1.JobCondition{{Type: batchv1.JobFailed, Status: corev1.ConditionTrue, Message: "deadline"}}}, gpuhealthv1alpha1.JobFailed},
		{"a failure target already counts as failed", batchv1.JobStatus{Active: 1, Conditions: []batchv1.JobCondition{{Type: batchv1.JobFailureTarget, Status: corev1.ConditionTrue}}}, gpuhealthv1alpha1.JobFailed},
		{"a failed pod with no condition yet is failed", batchv1.JobStatus{Failed: 1}, gpuhealthv1alpha1.JobFailed},
		{"a condition that is not true does not count", batchv1.JobStatus{Active: 1, Conditions: []batchv1.JobCondition{{Type: batchv1.JobComplete, Status: corev1.ConditionFalse}}}, gpuhealthv1alpha1.JobRunning},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, msg := Result(&batchv1.Job{Status: tc.status})
			NewWithT(t).Expect(got).To(Equal(tc.want), msg)
		})
	}
}

func resourceQuantity(s string) resource.Quantity { return resource.MustParse(s) }

func TestDeadlineSecondsRoundsUpToAtLeastOne(t *testing.T) {
	for in, want := range map[time.Duration]int64{500 * time.Millisecond: 1, 0: 1, time.Second: 1, 1500 * time.Millisecond: 2, time.Hour: 3600} {
		if got := deadlineSeconds(in); got != want {
			t.Errorf("deadlineSeconds(%s) = %d, want %d", in, got, want)
		}
	}
}
