package computedomain

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/remediation/job"
	nodepkg "github.com/gpuhealth/gpuhealth/remediation/node"
)

var t0 = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

func cliqueJob(attempt int32, result gpuhealthv1alpha1.JobResult, verdict string, finished time.Time) *batchv1.Job {
	j := job.BuildClique("c.1", "2026-12-01T11:00:00Z", "ns", attempt, []string{"a", "b"}, gpuhealthv1alpha1.JobTemplate{Image: "nccl"}, gpuhealthv1alpha1.ParserNCCLTests, time.Hour, job.Env{})
	switch result {
	case gpuhealthv1alpha1.JobSucceeded:
		j.Status.Conditions = []batchv1.JobCondition{{Type: batchv1.JobComplete, Status: corev1.ConditionTrue, LastTransitionTime: metav1.NewTime(finished)}}
	case gpuhealthv1alpha1.JobFailed:
		j.Status.Conditions = []batchv1.JobCondition{{Type: batchv1.JobFailed, Status: corev1.ConditionTrue, LastTransitionTime: metav1.NewTime(finished)}}
	case gpuhealthv1alpha1.JobRunning:
		j.Status.Active = 2
	}
	if verdict != "" {
		j.Annotations[job.VerdictAnnotation] = verdict
	}
	return j
}

func TestDecideCliqueCert(t *testing.T) {
	spec := &gpuhealthv1alpha1.CliqueCertificationSpec{Job: gpuhealthv1alpha1.JobTemplate{Image: "nccl"}, MaxAttempts: 2, Backoff: ptr.To(gpuhealthv1alpha1.Duration("1m"))}
	base := cliqueCert{spec: spec, since: "2026-12-01T11:00:00Z", healthy: []string{"a", "b", "c", "d"}, now: t0, cliqueID: "c.1"}
	with := func(mutate func(*cliqueCert)) cliqueCert {
		c := base
		mutate(&c)
		return c
	}
	cases := []struct {
		name  string
		c     cliqueCert
		check func(g *WithT, s certStep)
	}{
		{"no attempt yet: attempt 1 on every healthy node, Indexed", base, func(g *WithT, s certStep) {
			g.Expect(s.create).NotTo(BeNil())
			g.Expect(s.create.Name).To(Equal(job.CliqueName("c.1", base.since, 1)))
			g.Expect(*s.create.Spec.Completions).To(Equal(int32(4)))
			g.Expect(*s.create.Spec.CompletionMode).To(Equal(batchv1.IndexedCompletion))
			g.Expect(jobNodes(s.create)).To(Equal([]string{"a", "b", "c", "d"}))
			g.Expect(s.create.Spec.Template.Spec.Affinity.PodAntiAffinity).NotTo(BeNil(), "one pod per node")
			g.Expect(s.create.Labels).To(HaveKeyWithValue(job.ParserLabel, "nccl-tests"), "nccl-tests is the default parser")
			g.Expect(s.lift).To(BeFalse())
		}},
		{"nodes 50%: half the healthy nodes take part", with(func(c *cliqueCert) {
			s := *spec
			s.Nodes = ptr.To(intstr.FromString("50%"))
			c.spec = &s
		}), func(g *WithT, s certStep) {
			g.Expect(jobNodes(s.create)).To(Equal([]string{"a", "b"}))
		}},
		{"no healthy node: wait", with(func(c *cliqueCert) { c.healthy = nil }), func(g *WithT, s certStep) {
			g.Expect(s.create).To(BeNil())
			g.Expect(s.requeue).To(Equal(cliqueRecheck))
		}},
		{"running: wait", with(func(c *cliqueCert) { c.jobs = []*batchv1.Job{cliqueJob(1, gpuhealthv1alpha1.JobRunning, "", t0)} }), func(g *WithT, s certStep) {
			g.Expect(s.create).To(BeNil())
			g.Expect(s.judge).To(BeNil())
			g.Expect(s.lift).To(BeFalse())
		}},
		{"finished without a verdict: judge it", with(func(c *cliqueCert) { c.jobs = []*batchv1.Job{cliqueJob(1, gpuhealthv1alpha1.JobSucceeded, "", t0)} }), func(g *WithT, s certStep) {
			g.Expect(s.judge).NotTo(BeNil())
		}},
		{"passed: lift", with(func(c *cliqueCert) {
			c.jobs = []*batchv1.Job{cliqueJob(1, gpuhealthv1alpha1.JobSucceeded, "passed", t0)}
		}), func(g *WithT, s certStep) {
			g.Expect(s.lift).To(BeTrue())
		}},
		{"failed, in the backoff: wait", with(func(c *cliqueCert) {
			c.jobs = []*batchv1.Job{cliqueJob(1, gpuhealthv1alpha1.JobSucceeded, "failed: low", t0.Add(-30*time.Second))}
		}), func(g *WithT, s certStep) {
			g.Expect(s.create).To(BeNil())
			g.Expect(s.requeue).To(Equal(30 * time.Second))
		}},
		{"failed, past the backoff: attempt 2", with(func(c *cliqueCert) {
			c.jobs = []*batchv1.Job{cliqueJob(1, gpuhealthv1alpha1.JobFailed, "failed: low", t0.Add(-2*time.Minute))}
		}), func(g *WithT, s certStep) {
			g.Expect(s.create.Name).To(Equal(job.CliqueName("c.1", base.since, 2)))
		}},
		{"the last attempt failed: the taint stays", with(func(c *cliqueCert) {
			c.jobs = []*batchv1.Job{cliqueJob(1, gpuhealthv1alpha1.JobFailed, "failed: low", t0.Add(-time.Hour)), cliqueJob(2, gpuhealthv1alpha1.JobSucceeded, "failed: low", t0.Add(-time.Hour))}
		}), func(g *WithT, s certStep) {
			g.Expect(s.exhausted).To(BeTrue())
			g.Expect(s.create).To(BeNil())
			g.Expect(s.lift).To(BeFalse())
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tc.check(NewWithT(t), decideCliqueCert(tc.c, "ns"))
		})
	}
}

type fakeOutputs struct {
	mu  sync.Mutex
	out map[string][]byte
}

func (f *fakeOutputs) Output(_ context.Context, _, name string) ([]byte, int64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if b, ok := f.out[name]; ok {
		return b, int64(len(b)), nil
	}
	return nil, 0, fmt.Errorf("job %s: %w", name, job.ErrNoOutput)
}

func ncclReport(busbw float64) []byte {
	return fmt.Appendf(nil, "#       size         count      type   redop    root     time   algbw   busbw  #wrong     time   algbw   busbw  #wrong\n"+
		"  8589934592    2147483648     float     sum      -1  47550.0  180.65  %6.2f       0  47750.0  179.90  %6.2f       0\n"+
		"# Out of bounds values : 0 OK\n# Avg bus bandwidth    : 70.742\n", busbw, busbw)
}

// cliqueJobRules allow the tests' clique image.
var cliqueJobRules = job.Rules{ServiceAccount: job.DefaultServiceAccount, ImagePrefixes: []string{"nccl"}}

// TestCliqueCertificationGatesTheFabricTaint: after a fabric fault on a
// clique resolves, the taint stays while a multi-node NCCL test runs on the
// clique's healthy nodes that the test's policy manages; a report below
// the threshold keeps it, the next attempt's pass lifts it.
func TestCliqueCertificationGatesTheFabricTaint(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	label := "cliquecert-test"
	p := &gpuhealthv1alpha1.RemediationPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: label},
		Spec: gpuhealthv1alpha1.RemediationPolicySpec{
			NodeSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"test": label}},
			// One member's report, known from its label, taints the clique.
			ComputeDomain: gpuhealthv1alpha1.ComputeDomainSpec{SingleReportTaintsClique: true, CliqueCertification: &gpuhealthv1alpha1.CliqueCertificationSpec{
				Job: gpuhealthv1alpha1.JobTemplate{Image: "nccl"}, Backoff: ptr.To(gpuhealthv1alpha1.Duration("0s")), MaxAttempts: 3,
				Parser: gpuhealthv1alpha1.ResultParser{Type: gpuhealthv1alpha1.ParserNCCLTests, NCCL: &gpuhealthv1alpha1.NCCLThresholds{DefaultMinBusBandwidthGBps: ptr.To[int32](300)}},
			}},
		},
	}
	g.Expect(k8sClient.Create(ctx, p)).To(Succeed())
	t.Cleanup(func() { _ = k8sClient.Delete(context.Background(), p) })
	clique := "cluster-y.1"
	var nodes []string
	for i := range 3 {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("cc-%d", i), Labels: map[string]string{"test": label, CliqueNodeLabel: clique}}}
		if i == 0 {
			n.Labels[NodeLabel] = "domain-uid" // a ComputeDomain member runs IMEX
		}
		g.Expect(k8sClient.Create(ctx, n)).To(Succeed())
		n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}
		g.Expect(k8sClient.Status().Update(ctx, n)).To(Succeed())
		nh := &gpuhealthv1alpha1.NodeHealth{ObjectMeta: metav1.ObjectMeta{Name: n.Name}}
		g.Expect(k8sClient.Create(ctx, nh)).To(Succeed())
		phase := gpuhealthv1alpha1.PhaseHealthy
		if i == 0 {
			phase = gpuhealthv1alpha1.PhaseRecertifying // the node that reported the fault
		}
		nh.Status.Phase = phase
		g.Expect(k8sClient.Status().Update(ctx, nh)).To(Succeed())
		t.Cleanup(func() {
			_ = k8sClient.Delete(context.Background(), n)
			_ = k8sClient.Delete(context.Background(), nh)
		})
		nodes = append(nodes, n.Name)
	}
	// A healthy node of the clique that another policy manages: the
	// first policy's Job never runs there.
	other := &gpuhealthv1alpha1.RemediationPolicy{ObjectMeta: metav1.ObjectMeta{Name: label + "-other"}, Spec: gpuhealthv1alpha1.RemediationPolicySpec{
		NodeSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"test": label + "-other"}},
	}}
	g.Expect(k8sClient.Create(ctx, other)).To(Succeed())
	t.Cleanup(func() { _ = k8sClient.Delete(context.Background(), other) })
	foreign := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "cc-other", Labels: map[string]string{"test": label + "-other", CliqueNodeLabel: clique}}}
	g.Expect(k8sClient.Create(ctx, foreign)).To(Succeed())
	foreign.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}
	g.Expect(k8sClient.Status().Update(ctx, foreign)).To(Succeed())
	foreignNH := &gpuhealthv1alpha1.NodeHealth{ObjectMeta: metav1.ObjectMeta{Name: foreign.Name}}
	g.Expect(k8sClient.Create(ctx, foreignNH)).To(Succeed())
	foreignNH.Status.Phase = gpuhealthv1alpha1.PhaseHealthy
	g.Expect(k8sClient.Status().Update(ctx, foreignNH)).To(Succeed())
	t.Cleanup(func() {
		_ = k8sClient.Delete(context.Background(), foreign)
		_ = k8sClient.Delete(context.Background(), foreignNH)
	})
	outputs := &fakeOutputs{out: map[string][]byte{}}
	startFabricWith(t, g, &FabricReconciler{Namespace: "default", Outputs: outputs, JobRules: cliqueJobRules})

	tainted := func() []string {
		var out []string
		for _, name := range nodes {
			n := &corev1.Node{}
			g.Expect(k8sClient.Get(ctx, types.NamespacedName{Name: name}, n)).To(Succeed())
			if n.Annotations[nodepkg.FabricAnnotation] == clique {
				out = append(out, name)
			}
		}
		return out
	}
	jobs := func() []batchv1.Job {
		var list batchv1.JobList
		g.Expect(k8sClient.List(ctx, &list, client.InNamespace("default"), client.MatchingLabels{job.CliqueLabel: clique})).To(Succeed())
		return list.Items
	}
	down := newFinding(ctx, t, g, nodes[0], gpuhealthv1alpha1.CheckIMEXDomain, "DOWN", gpuhealthv1alpha1.SeverityFatal)
	g.Eventually(tainted, 20*time.Second, 50*time.Millisecond).Should(HaveLen(3))
	g.Expect(jobs()).To(BeEmpty(), "no test while the fault lasts")

	down.Status.Resolved, down.Status.ResolvedAt = true, ptr.To(metav1.Now())
	g.Expect(k8sClient.Status().Update(ctx, down)).To(Succeed())
	g.Eventually(func() int { return len(jobs()) }, 20*time.Second, 50*time.Millisecond).Should(Equal(1))
	first := jobs()[0]
	g.Expect(jobNodes(&first)).To(Equal(nodes[1:]), "the clique's healthy nodes the policy manages take part, not cc-other")
	g.Consistently(tainted, time.Second, 100*time.Millisecond).Should(HaveLen(3), "the taint stays while the test runs")

	finish := func(j *batchv1.Job, report []byte) {
		outputs.mu.Lock()
		outputs.out[j.Name] = report
		outputs.mu.Unlock()
		now := metav1.Now()
		j.Status.StartTime = &now
		j.Status.Succeeded, j.Status.CompletionTime = *j.Spec.Completions, &now
		j.Status.CompletedIndexes = fmt.Sprintf("0-%d", *j.Spec.Completions-1)
		j.Status.Conditions = []batchv1.JobCondition{
			{Type: batchv1.JobSuccessCriteriaMet, Status: corev1.ConditionTrue, LastProbeTime: now, LastTransitionTime: now},
			{Type: batchv1.JobComplete, Status: corev1.ConditionTrue, LastProbeTime: now, LastTransitionTime: now},
		}
		g.Expect(k8sClient.Status().Update(ctx, j)).To(Succeed())
		t.Cleanup(func() { _ = k8sClient.Delete(context.Background(), j) })
	}
	finish(&first, ncclReport(120))
	g.Eventually(func() int { return len(jobs()) }, 20*time.Second, 50*time.Millisecond).Should(Equal(2), "a second attempt after a failed one")
	g.Expect(tainted()).To(HaveLen(3), "below the threshold: the taint stays")
	var second batchv1.Job
	for _, j := range jobs() {
		if j.Name == first.Name {
			g.Expect(j.Annotations[job.VerdictAnnotation]).To(ContainSubstring("below the 300 GB/s threshold"))
		} else {
			second = j
		}
	}
	finish(&second, ncclReport(338.82))
	g.Eventually(tainted, 20*time.Second, 50*time.Millisecond).Should(BeEmpty(), "the pass lifts the taint")
	g.Expect(jobs()).To(HaveLen(2))
}

// TestCliqueCertificationOfABreachingPolicyDoesNotRun: a clique test whose
// template breaks the install's Job rules never runs, and the taint stays
// after the fault resolves (no test passed) until the policy is fixed.
func TestCliqueCertificationOfABreachingPolicyDoesNotRun(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	label := "cliquecert-breach"
	p := &gpuhealthv1alpha1.RemediationPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: label},
		Spec: gpuhealthv1alpha1.RemediationPolicySpec{
			NodeSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"test": label}},
			ComputeDomain: gpuhealthv1alpha1.ComputeDomainSpec{SingleReportTaintsClique: true, CliqueCertification: &gpuhealthv1alpha1.CliqueCertificationSpec{
				Job: gpuhealthv1alpha1.JobTemplate{Image: "docker.io/attacker/nccl:1"}, MaxAttempts: 3,
			}},
		},
	}
	g.Expect(k8sClient.Create(ctx, p)).To(Succeed())
	t.Cleanup(func() { _ = k8sClient.Delete(context.Background(), p) })
	clique := "cluster-z.1"
	var nodes []string
	for i := range 2 {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("cb-%d", i), Labels: map[string]string{"test": label, CliqueNodeLabel: clique, NodeLabel: "domain-uid"}}}
		g.Expect(k8sClient.Create(ctx, n)).To(Succeed())
		n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}
		g.Expect(k8sClient.Status().Update(ctx, n)).To(Succeed())
		nh := &gpuhealthv1alpha1.NodeHealth{ObjectMeta: metav1.ObjectMeta{Name: n.Name}}
		g.Expect(k8sClient.Create(ctx, nh)).To(Succeed())
		nh.Status.Phase = gpuhealthv1alpha1.PhaseHealthy
		g.Expect(k8sClient.Status().Update(ctx, nh)).To(Succeed())
		t.Cleanup(func() {
			_ = k8sClient.Delete(context.Background(), n)
			_ = k8sClient.Delete(context.Background(), nh)
		})
		nodes = append(nodes, n.Name)
	}
	startFabricWith(t, g, &FabricReconciler{Namespace: "default", Outputs: &fakeOutputs{out: map[string][]byte{}}, JobRules: cliqueJobRules})
	tainted := func() int {
		count := 0
		for _, name := range nodes {
			n := &corev1.Node{}
			g.Expect(k8sClient.Get(ctx, types.NamespacedName{Name: name}, n)).To(Succeed())
			if n.Annotations[nodepkg.FabricAnnotation] == clique {
				count++
			}
		}
		return count
	}
	jobs := func() []batchv1.Job {
		var list batchv1.JobList
		g.Expect(k8sClient.List(ctx, &list, client.InNamespace("default"), client.MatchingLabels{job.CliqueLabel: clique})).To(Succeed())
		return list.Items
	}
	down := newFinding(ctx, t, g, nodes[0], gpuhealthv1alpha1.CheckIMEXDomain, "DOWN", gpuhealthv1alpha1.SeverityFatal)
	g.Eventually(tainted, 20*time.Second, 50*time.Millisecond).Should(Equal(2))
	down.Status.Resolved, down.Status.ResolvedAt = true, ptr.To(metav1.Now())
	g.Expect(k8sClient.Status().Update(ctx, down)).To(Succeed())
	g.Consistently(func() int { return len(jobs()) }, 2*time.Second, 100*time.Millisecond).Should(BeZero(), "no Job of a breaching policy")
	g.Expect(tainted()).To(Equal(2), "the taint stays: no test passed")

	// Fixed: the test runs.
	g.Expect(k8sClient.Get(ctx, types.NamespacedName{Name: p.Name}, p)).To(Succeed())
	p.Spec.ComputeDomain.CliqueCertification.Job.Image = "nccl"
	g.Expect(k8sClient.Update(ctx, p)).To(Succeed())
	g.Eventually(func() int { return len(jobs()) }, 20*time.Second, 50*time.Millisecond).Should(Equal(1))
	t.Cleanup(func() {
		for _, j := range jobs() {
			_ = k8sClient.Delete(context.Background(), &j)
		}
	})
}
