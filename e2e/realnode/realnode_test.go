//go:build e2enode

package realnode

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/e2e/framework"
	"github.com/gpuhealth/gpuhealth/monitors/spool"
	"github.com/gpuhealth/gpuhealth/remediation/job"
)

// These cases run against one installation (TestMain), in the order of
// the tier's list (cases, cases_test.go); each leaves the real node
// Healthy and both operator replicas Ready.

// testInstalled: the chart's pods really run. Both operator replicas are
// Running and Ready on the real node and one holds the Lease; the monitor
// DaemonSet's pod is Running and Ready there with no restart, its probes
// passing; and the token the kubelet projected into it names its node to
// the admission policy: it may write findings about gpu-real-0 and not
// about another node.
func testInstalled(t *testing.T) {
	g := NewWithT(t)
	operators := operatorPods(g)
	g.Expect(operators).To(HaveLen(2))
	for _, p := range operators {
		g.Expect(p.Spec.NodeName).To(Equal(env.Node))
		g.Expect(running(&p)).To(BeTrue(), "operator pod %s Running and Ready", p.Name)
	}
	g.Eventually(leader).Should(BeElementOf(names(operators)), "one replica holds the Lease")
	t.Logf("the leader is %s", leader(g))

	mon := monitorPod(g)
	g.Expect(running(mon)).To(BeTrue(), "the monitor pod on %s is Running and Ready (its readiness probe passes)", env.Node)
	g.Expect(mon.Status.ContainerStatuses[0].RestartCount).To(BeZero(), "its liveness probe never failed")
	t.Logf("kubectl get pods -o wide:\n%s", kubectl(t, "get", "pods", "-n", framework.Namespace, "-o", "wide"))

	// The token the kubelet mounted into the monitor's container.
	matches, err := filepath.Glob(filepath.Join(env.Run, "kubelet", "pods", string(mon.UID), "volumes", "kubernetes.io~projected", "*", "token"))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(matches).To(HaveLen(1), "one projected service-account token in the monitor pod")
	token, err := os.ReadFile(matches[0])
	g.Expect(err).NotTo(HaveOccurred())
	cfg := rest.AnonymousClientConfig(env.Cluster.Config)
	cfg.BearerToken = string(token)
	c, err := client.New(cfg, client.Options{Scheme: env.Cluster.Scheme})
	g.Expect(err).NotTo(HaveOccurred())
	mk := func(nodeName string) *gpuhealthv1alpha1.NodeHealthEvent {
		spec := gpuhealthv1alpha1.NodeHealthEventSpec{
			NodeName: nodeName, Source: gpuhealthv1alpha1.SourceManual, Check: gpuhealthv1alpha1.CheckXID,
			Component: gpuhealthv1alpha1.Component{Kind: gpuhealthv1alpha1.ComponentGPU, ID: framework.GPUUUID(realIndex, 7)},
			Code:      "43", Severity: gpuhealthv1alpha1.SeverityInfo, RecommendedAction: gpuhealthv1alpha1.ActionNone,
		}
		return &gpuhealthv1alpha1.NodeHealthEvent{ObjectMeta: metav1.ObjectMeta{Name: spec.EventName()}, Spec: spec}
	}
	err = c.Create(ctx, mk("gpu-node-0"))
	g.Expect(err).To(HaveOccurred(), "the monitor's token may not write about another node")
	g.Expect(err.Error()).To(ContainSubstring("may only write NodeHealthEvents about its own node"))
	own := mk(env.Node)
	g.Expect(c.Create(ctx, own)).To(Succeed(), "its own node is fine")
	g.Expect(env.Cluster.Client.Delete(ctx, own)).To(Succeed())
}

// testKernelLogXID: a driver's XID line in the kernel log (a file here, in
// /dev/kmsg's record format) is read by the privileged monitor container
// and becomes a finding of the kmsg source. XID 13 (a graphics engine
// exception, usually the application's) quarantines only when repeated.
func testKernelLogXID(t *testing.T) {
	g := NewWithT(t)
	b, err := os.ReadFile("/proc/uptime")
	g.Expect(err).NotTo(HaveOccurred())
	up, err := strconv.ParseFloat(strings.Fields(string(b))[0], 64)
	g.Expect(err).NotTo(HaveOccurred())
	// GPU 3 of framework.Scenario is at PCI 0000:48:00.0.
	g.Expect(framework.AppendScenario(filepath.Join(env.FakeGPU, "kmsg"), fmt.Sprintf(
		"3,1,%d,-;NVRM: Xid (PCI:0000:48:00): 13, pid=4242, name=python3, Graphics Exception: ESR 0x515848=0x1000e 0x515850=0x0", int64(up*1e6)))).To(Succeed())
	g.Eventually(func(g Gomega) []string {
		var list gpuhealthv1alpha1.NodeHealthEventList
		g.Expect(env.Cluster.Client.List(ctx, &list)).To(Succeed())
		var found []string
		for _, e := range list.Items {
			if e.Spec.NodeName == env.Node && e.Spec.Source == gpuhealthv1alpha1.SourceKmsg && e.Spec.Code == "13" {
				found = append(found, fmt.Sprintf("%s %s count=%d", e.Spec.Component.Kind, e.Spec.Component.ID, e.Status.Count))
			}
		}
		return found
	}).Should(ConsistOf("GPU "+framework.GPUUUID(realIndex, 3)+" count=1"), "the kernel log's XID, about GPU 3")
	g.Eventually(phase(env.Node)).Should(Equal(gpuhealthv1alpha1.PhaseHealthy))
	g.Consistently(func(g Gomega) bool { return node(g, env.Node).Spec.Unschedulable }, 2*time.Second).Should(BeFalse(), "one XID 13 does not quarantine")
}

// testXIDCycle: an XID 119 (GSP RPC timeout; NVIDIA: reset the GPU) raised
// in the real node's GPU reaches the monitor pod through go-nvml, becomes a
// NodeHealthEvent, and the operator pods cordon and taint gpu-real-0,
// evict the real workload pods on it one at a time under their PDB (the
// replacements run on a fake node), run the GPU reset and the
// recertification as real containers that exit 0, and return the node to
// service.
func testXIDCycle(t *testing.T) {
	g := NewWithT(t)
	g.Expect(framework.CreateWorkload(ctx, env.Cluster, framework.Workload{
		Namespace: "ml", Name: "trainer", Replicas: 2, GPUs: -1,
		Allowed: []string{env.Node, "gpu-node-0"}, Preferred: []string{env.Node},
		MinAvailable: ptr.To[int32](1),
		Image:        testJobImage, Command: []string{"/testjob", "--serve", "trainer"},
	})).To(Succeed())
	var before []corev1.Pod
	g.Eventually(func(g Gomega) {
		pods, err := framework.PodsOf(ctx, env.Cluster, "ml", "trainer")
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(pods[env.Node]).To(HaveLen(2))
		for _, p := range pods[env.Node] {
			g.Expect(running(&p)).To(BeTrue(), "trainer pod %s runs on the real node", p.Name)
		}
		before = pods[env.Node]
	}).Should(Succeed())

	// The PDB holds: at least one trainer pod is ready at every moment of the drain.
	ready := sample(t, readyPods("ml", "trainer"))

	start := time.Now()
	g.Expect(env.injectXID(0, 119, 200*time.Millisecond)).To(Succeed())
	e := eventOf(framework.GPUUUID(realIndex, 0), "119")
	g.Eventually(e).Should(WithTransform(func(e *gpuhealthv1alpha1.NodeHealthEvent) int64 { return e.Status.Count }, Equal(int64(1))))
	g.Expect(e(g).Spec.RecommendedAction).To(Equal(gpuhealthv1alpha1.ActionResetGPU))
	t.Logf("finding after %s; kubectl get nodehealthevents:\n%s", time.Since(start).Round(time.Millisecond), kubectl(t, "get", "nodehealthevents"))
	g.Eventually(func(g Gomega) bool { return quarantined(g, env.Node) }).Should(BeTrue(), "cordoned and tainted")
	t.Logf("cordoned and tainted after %s", time.Since(start).Round(time.Millisecond))

	g.Eventually(func(g Gomega) {
		pods, err := framework.PodsOf(ctx, env.Cluster, "ml", "trainer")
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(pods).NotTo(HaveKey(env.Node))
		g.Expect(pods["gpu-node-0"]).To(HaveLen(2))
	}).Should(Succeed(), "both trainer pods evicted from the real node, replaced on gpu-node-0")
	for _, p := range before {
		g.Eventually(func() bool {
			err := env.Cluster.Client.Get(ctx, client.ObjectKeyFromObject(&p), &corev1.Pod{})
			return apierrors.IsNotFound(err)
		}).Should(BeTrue(), "pod %s gone: the kubelet stopped its container", p.Name)
	}
	g.Expect(ready.Min()).To(BeNumerically(">=", 1), "the PDB (minAvailable 1) held throughout the drain")

	g.Eventually(phase(env.Node), 3*time.Minute).Should(Equal(gpuhealthv1alpha1.PhaseHealthy))
	g.Eventually(func(g Gomega) bool { return quarantined(g, env.Node) || node(g, env.Node).Spec.Unschedulable }).Should(BeFalse(), "uncordoned, untainted")
	t.Logf("Healthy again after %s; kubectl get nodehealth %s:\n%s", time.Since(start).Round(time.Millisecond), env.Node, kubectl(t, "get", "nodehealth", env.Node))

	want := map[job.Kind][]string{job.Diagnostics: {"testjob"}, job.ResetGPU: {"testjob"}, job.Recertification: {`"DCGM Diagnostic"`, "# Avg bus bandwidth"}}
	for _, kind := range []job.Kind{job.Diagnostics, job.ResetGPU, job.Recertification} {
		js := jobsSince(g, kind, start)
		g.Expect(js).To(HaveLen(len(want[kind])), "one %s Job per step", kind)
		for _, j := range js {
			pod := jobPod(g, j.Name)
			g.Expect(pod.Spec.NodeName).To(Equal(env.Node))
			g.Expect(pod.Status.Phase).To(Equal(corev1.PodSucceeded))
			term := pod.Status.ContainerStatuses[0].State.Terminated
			g.Expect(term).NotTo(BeNil())
			g.Expect(term.ExitCode).To(BeZero())
			g.Expect(term.ContainerID).To(HavePrefix("containerd://"), "a real container ran it")
			logs := kubectl(t, "logs", "-n", framework.Namespace, "job/"+j.Name)
			g.Expect(logs).To(Or(ContainSubstring(want[kind][0]), ContainSubstring(want[kind][len(want[kind])-1])))
			t.Logf("kubectl logs job/%s (first lines):\n%s", j.Name, firstLines(logs, 6))
		}
	}
	// The evidence was collected before the reset, and is kept.
	diag, reset := jobsSince(g, job.Diagnostics, start)[0], jobsSince(g, job.ResetGPU, start)[0]
	g.Expect(diag.CreationTimestamp.Time).NotTo(BeTemporally(">", reset.CreationTimestamp.Time), "diagnostics before the reset")
	g.Expect(diag.Spec.TTLSecondsAfterFinished).To(HaveValue(BeEquivalentTo(7200)), "kept for the policy's retain")
	dg := nodeHealthOf(g, env.Node).Status.Diagnostics
	g.Expect(dg).NotTo(BeNil())
	g.Expect(dg.Job).To(Equal(diag.Name))
	g.Expect(dg.Before).To(Equal(gpuhealthv1alpha1.ActionResetGPU))
	g.Expect(dg.Result).To(Equal(gpuhealthv1alpha1.JobSucceeded))
	g.Expect(dg.KeptUntil).NotTo(BeNil())
	t.Logf("status.diagnostics: job %s %s, kept until %s", dg.Job, dg.Result, dg.KeptUntil.UTC().Format(time.RFC3339))

	cert := nodeHealthOf(g, env.Node).Status.Certificate
	g.Expect(cert).NotTo(BeNil(), "the recertification suite passed: a certificate")
	g.Expect(cert.Suite).To(Equal(gpuhealthv1alpha1.SuiteRecertification))
	g.Expect(env.Cluster.Client.Delete(ctx, &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: "trainer"}})).To(Succeed())
}

// testLeaderFailover: the leader's pod deleted with kubectl while a cycle
// runs its GPU reset; the other replica takes the Lease and finishes the
// cycle, with one reset Job and one recertification Job.
func testLeaderFailover(t *testing.T) {
	g := NewWithT(t)
	first := leader(g)
	g.Expect(first).NotTo(BeEmpty())
	start := time.Now()
	g.Expect(env.injectXID(1, 119, 200*time.Millisecond)).To(Succeed())
	// The reset Job (it runs 6 s) is under way.
	g.Eventually(func(g Gomega) []batchv1.Job { return jobsSince(g, job.ResetGPU, start) }).Should(HaveLen(1))
	g.Expect(leader(g)).To(Equal(first), "no failover yet")
	deleted := time.Now()
	kubectl(t, "delete", "pod", "-n", framework.Namespace, first, "--wait=false")
	var second string
	g.Eventually(func(g Gomega) string { second = leader(g); return second }, time.Minute).ShouldNot(Or(BeEmpty(), Equal(first)))
	t.Logf("%s took the Lease %s after kubectl delete pod %s", second, time.Since(deleted).Round(time.Millisecond), first)
	g.Expect(names(operatorPods(g))).To(ContainElement(second))

	g.Eventually(phase(env.Node), 3*time.Minute).Should(Equal(gpuhealthv1alpha1.PhaseHealthy))
	t.Logf("the cycle finished %s after the XID", time.Since(start).Round(time.Millisecond))
	g.Expect(jobsSince(g, job.ResetGPU, start)).To(HaveLen(1), "no duplicate reset Job")
	g.Expect(jobsSince(g, job.Recertification, start)).To(HaveLen(2), "one recertification Job per step, no duplicate")
	// The deleted replica's successor runs once the node is schedulable.
	g.Eventually(func(g Gomega) {
		pods := operatorPods(g)
		g.Expect(pods).To(HaveLen(2))
		for _, p := range pods {
			g.Expect(running(&p)).To(BeTrue())
		}
	}).Should(Succeed())
}

// testBudgetAcrossRealAndFakeNodes: with maxUnavailable 1, a fault on the
// real node and one on a fake node at once: both cordoned at once, never
// both out of service, both back.
func testBudgetAcrossRealAndFakeNodes(t *testing.T) {
	g := NewWithT(t)
	// A fake node's pods print nothing (kwok runs no container), so for
	// this case the suite is judged by exit codes on both nodes.
	kubectl(t, "patch", "remediationpolicy", "default", "--type", "merge", "-p",
		`{"spec":{"budgets":{"maxUnavailable":1},"recertification":{"steps":[{"name":"recertify","job":{"image":"`+testJobImage+`","command":["/testjob","--sleep=2s","recertify"]},"timeout":"2m","parser":{"type":"exit-code"}}]}}}`)
	defer kubectl(t, "patch", "remediationpolicy", "default", "--type", "merge", "-p",
		`{"spec":{"budgets":{"maxUnavailable":"10%"},"recertification":{"steps":`+realSuite(400)+`}}}`)
	out := sample(t, outOfService)
	fake := "gpu-node-1"
	spec := gpuhealthv1alpha1.NodeHealthEventSpec{
		NodeName: fake, Source: gpuhealthv1alpha1.SourceManual, Check: gpuhealthv1alpha1.CheckXID,
		Component: gpuhealthv1alpha1.Component{Kind: gpuhealthv1alpha1.ComponentGPU, ID: framework.GPUUUID(1, 0)},
		Code:      "119", Severity: gpuhealthv1alpha1.SeverityFatal, RecommendedAction: gpuhealthv1alpha1.ActionResetGPU,
		Message: "GSP RPC timeout (written by the test)",
	}
	g.Expect(env.injectXID(4, 119, 200*time.Millisecond)).To(Succeed())
	g.Expect(env.Cluster.Client.Create(ctx, &gpuhealthv1alpha1.NodeHealthEvent{ObjectMeta: metav1.ObjectMeta{Name: spec.EventName()}, Spec: spec})).To(Succeed())
	g.Eventually(func(g Gomega) bool { return quarantined(g, env.Node) && quarantined(g, fake) }).Should(BeTrue(), "both cordoned at once")
	for _, n := range []string{env.Node, fake} {
		g.Eventually(phase(n), 3*time.Minute).Should(Equal(gpuhealthv1alpha1.PhaseHealthy))
		g.Eventually(func(g Gomega) bool { return node(g, n).Spec.Unschedulable }).Should(BeFalse(), "%s back in service", n)
	}
	g.Expect(out.Max()).To(Equal(1), "one node out of service at a time")
}

// testMonitorRestartDuringOutage: with the apiserver down, three XIDs are
// raised and the monitor's container is stopped through the CRI (crictl
// stop); the kubelet restarts it without the apiserver, the restarted agent
// finds the findings in its hostPath spool, and once the apiserver is back
// they arrive: one NodeHealthEvent with count 3.
func testMonitorRestartDuringOutage(t *testing.T) {
	g := NewWithT(t)
	mon := monitorPod(g)
	uuid := framework.GPUUUID(realIndex, 2)
	restart, err := env.Cluster.StopAPIServer(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	restarted := false
	defer func() {
		if !restarted {
			g.Expect(restart()).To(Succeed())
		}
	}()
	// XID 45 (preemptive cleanup): the default policy ignores it, so no
	// cycle follows.
	for i := range 3 {
		g.Expect(env.injectXID(2, 45, time.Duration(200+1000*i)*time.Millisecond)).To(Succeed())
	}
	g.Eventually(func() int64 { return spooledOccurrences(uuid, "45") }, 30*time.Second).Should(Equal(int64(3)),
		"the agent spools what it cannot publish: all three XIDs")
	ids := crictl(t, "ps", "-q", "--name", "^monitor$", "--pod", podID(t, mon))
	g.Expect(strings.Fields(ids)).To(HaveLen(1))
	crictl(t, "stop", strings.TrimSpace(ids))
	stopped := time.Now()
	g.Eventually(func() string {
		return crictl(t, "ps", "-q", "--name", "^monitor$", "--pod", podID(t, mon), "--state", "Running")
	}, time.Minute).ShouldNot(Or(BeEmpty(), Equal(ids)), "the kubelet restarts the container without the apiserver")
	t.Logf("the kubelet restarted the monitor container %s after crictl stop", time.Since(stopped).Round(time.Millisecond))
	g.Expect(restart()).To(Succeed())
	restarted = true

	e := eventOf(uuid, "45")
	g.Eventually(e, time.Minute).Should(WithTransform(func(e *gpuhealthv1alpha1.NodeHealthEvent) int64 { return e.Status.Count }, Equal(int64(3))))
	g.Consistently(e, 3*time.Second).Should(WithTransform(func(e *gpuhealthv1alpha1.NodeHealthEvent) int64 { return e.Status.Count }, Equal(int64(3))), "each XID once")
	g.Eventually(spooled).Should(BeZero())
	g.Eventually(func(g Gomega) int32 { return monitorPod(g).Status.ContainerStatuses[0].RestartCount }).Should(Equal(int32(1)))
	t.Logf("kubectl get nodehealthevents:\n%s", kubectl(t, "get", "nodehealthevents"))
	// The operator may have lost its Lease in the outage and exited, as a
	// leader-elected controller must; the kubelet restarts it.
	g.Eventually(func(g Gomega) {
		for _, p := range operatorPods(g) {
			g.Expect(running(&p)).To(BeTrue())
		}
		g.Expect(leader(g)).NotTo(BeEmpty())
	}, 2*time.Minute).Should(Succeed())
	g.Expect(phase(env.Node)(g)).To(Equal(gpuhealthv1alpha1.PhaseHealthy))
}

// testCertifyOnRequest: a human labels the real node gpuhealth.dev/certify;
// it is tainted gpuhealth.dev/uncertified (not cordoned) while its suite
// runs as real containers, the operator reads the DCGM JSON and the NCCL
// report from their logs through the apiserver and the kubelet, and the
// node returns with a certificate holding both steps' measurements.
func testCertifyOnRequest(t *testing.T) {
	g := NewWithT(t)
	g.Eventually(phase(env.Node), 3*time.Minute).Should(Equal(gpuhealthv1alpha1.PhaseHealthy))
	kubectl(t, "label", "node", env.Node, gpuhealthv1alpha1.CertifyLabel+"=e2e-1", "--overwrite")
	g.Eventually(phase(env.Node)).Should(Equal(gpuhealthv1alpha1.PhaseCertifying))
	n := node(g, env.Node)
	g.Expect(n.Spec.Unschedulable).To(BeFalse(), "not cordoned")
	g.Expect(slices.ContainsFunc(n.Spec.Taints, func(t corev1.Taint) bool { return t.Key == gpuhealthv1alpha1.UncertifiedTaintKey })).To(BeTrue())
	g.Eventually(phase(env.Node), 3*time.Minute).Should(Equal(gpuhealthv1alpha1.PhaseHealthy))
	nh := nodeHealthOf(g, env.Node)
	cert := nh.Status.Certificate
	g.Expect(cert).NotTo(BeNil())
	g.Expect(cert.Suite).To(Equal(gpuhealthv1alpha1.SuiteCertification))
	g.Expect(cert.Request).To(Equal("e2e-1"))
	g.Expect(cert.Steps).To(HaveLen(2))
	g.Expect(cert.Steps[0].Measurements).To(ContainElement(gpuhealthv1alpha1.Measurement{Name: "testsPassed", Value: "24"}), "3 tests on 8 GPUs, read from the pod's log")
	g.Expect(cert.Steps[1].Measurements).To(ContainElement(gpuhealthv1alpha1.Measurement{Name: "busBandwidth", Value: "400", Unit: "GB/s"}))
	g.Eventually(func(g Gomega) bool {
		return slices.ContainsFunc(node(g, env.Node).Spec.Taints, func(t corev1.Taint) bool { return t.Key == gpuhealthv1alpha1.UncertifiedTaintKey })
	}).Should(BeFalse(), "the taint goes")
	t.Logf("kubectl get nodehealth %s:\n%s", env.Node, kubectl(t, "get", "nodehealth", env.Node))
	t.Logf("status.certificate:\n%s", kubectl(t, "get", "nodehealth", env.Node, "-o", "jsonpath={.status.certificate}"))
}

// testStepThatCannotRunIsNotRun: a certification step whose Job asks for a
// resource the real node lacks is never scheduled. Its Job reaches its
// deadline without running: the step is NotRun, with the scheduler's
// words, and is tried again under a Job of its own without spending the
// attempt or failing the node. Once the policy asks for nothing the node
// lacks, the next try runs and the node is certified in attempt 1.
func testStepThatCannotRunIsNotRun(t *testing.T) {
	g := NewWithT(t)
	g.Eventually(phase(env.Node), 3*time.Minute).Should(Equal(gpuhealthv1alpha1.PhaseHealthy))
	suite := func(resources string) string {
		return fmt.Sprintf(`[{"name":"smoke","job":{"image":%q,"command":["/testjob","--sleep=1s","smoke"]%s},"timeout":"20s","parser":{"type":"exit-code"}}]`, testJobImage, resources)
	}
	patch := func(maxNotRun int, steps string) {
		kubectl(t, "patch", "remediationpolicy", "default", "--type", "merge", "-p", fmt.Sprintf(`{"spec":{"certification":{"maxNotRun":%d,"steps":%s}}}`, maxNotRun, steps))
	}
	patch(5, suite(`,"resources":{"limits":{"example.com/absent":"1"}}`))
	defer patch(3, realSuite(400))
	start := time.Now()
	kubectl(t, "label", "node", env.Node, gpuhealthv1alpha1.CertifyLabel+"=e2e-notrun", "--overwrite")
	var step gpuhealthv1alpha1.StepResult
	g.Eventually(func(g Gomega) int32 {
		c := nodeHealthOf(g, env.Node).Status.Certification
		g.Expect(c).NotTo(BeNil())
		g.Expect(c.Steps).NotTo(BeEmpty())
		step = c.Steps[0]
		return step.NotRun
	}, 2*time.Minute).Should(BeNumerically(">=", 1))
	t.Logf("after %s: step %s: %s", time.Since(start).Round(time.Second), step.Result, step.Message)
	g.Expect(phase(env.Node)(g)).To(Equal(gpuhealthv1alpha1.PhaseCertifying), "not failed")
	// The try's report, with the scheduler's words read while it waited
	// (the step's message moves on to the next try's wait).
	notRun := kubectl(t, "get", "events", "-A", "--field-selector", "reason="+gpuhealthv1alpha1.ReasonStepNotRun, "-o", "jsonpath={.items[*].message}")
	t.Logf("StepNotRun: %s", notRun)
	g.Expect(notRun).To(And(ContainSubstring("never ran within its 20s deadline"), ContainSubstring("Insufficient example.com/absent"), ContainSubstring("trying again, no attempt spent")))

	patch(5, suite(""))
	g.Eventually(phase(env.Node), 3*time.Minute).Should(Equal(gpuhealthv1alpha1.PhaseHealthy))
	cert := nodeHealthOf(g, env.Node).Status.Certificate
	g.Expect(cert.Request).To(Equal("e2e-notrun"))
	g.Expect(cert.Attempt).To(Equal(int32(1)), "no attempt spent")
	g.Expect(cert.Steps[0].Result).To(Equal(gpuhealthv1alpha1.JobSucceeded))
	g.Expect(cert.Steps[0].NotRun).To(BeNumerically(">=", 1))
	t.Logf("certified after %s with %d tries that never ran", time.Since(start).Round(time.Second), cert.Steps[0].NotRun)
}

// testRecertificationFailsOnLowBandwidth: the NCCL step's report (a real
// container's log) says 42 GB/s, below the 100 GB/s threshold: the
// recertification attempt fails with the numbers and the node goes back to
// quarantine; with the report back at 400 GB/s the next attempt passes and
// the node returns, recertified.
func testRecertificationFailsOnLowBandwidth(t *testing.T) {
	g := NewWithT(t)
	g.Eventually(phase(env.Node), 3*time.Minute).Should(Equal(gpuhealthv1alpha1.PhaseHealthy))
	patch := func(busbw float64) {
		kubectl(t, "patch", "remediationpolicy", "default", "--type", "merge", "-p",
			fmt.Sprintf(`{"spec":{"recertification":{"maxAttempts":3,"steps":%s}}}`, realSuite(busbw)))
	}
	patch(42)
	defer kubectl(t, "patch", "remediationpolicy", "default", "--type", "merge", "-p",
		fmt.Sprintf(`{"spec":{"recertification":{"maxAttempts":2,"steps":%s}}}`, realSuite(400)))
	start := time.Now()
	g.Expect(env.injectXID(2, 119, 200*time.Millisecond)).To(Succeed())
	var failed string
	g.Eventually(func(g Gomega) string {
		for _, h := range nodeHealthOf(g, env.Node).Status.History {
			if h.Time.After(start.Add(-time.Second)) && h.Reason == gpuhealthv1alpha1.ReasonRecertificationFailed {
				failed = h.Message
			}
		}
		return failed
	}, 3*time.Minute).Should(ContainSubstring("step nccl-allreduce: bus bandwidth 42 GB/s at 4294967296 B is below the 100 GB/s threshold"))
	t.Logf("attempt failed: %s", failed)
	patch(400)
	g.Eventually(phase(env.Node), 3*time.Minute).Should(Equal(gpuhealthv1alpha1.PhaseHealthy))
	nh := nodeHealthOf(g, env.Node)
	g.Expect(nh.Status.History[len(nh.Status.History)-1].Reason).To(Equal(gpuhealthv1alpha1.ReasonRecertified))
	cert := nh.Status.Certificate
	g.Expect(cert.Suite).To(Equal(gpuhealthv1alpha1.SuiteRecertification))
	g.Expect(cert.Attempt).To(BeNumerically(">=", 2))
	g.Expect(cert.Steps[1].Measurements).To(ContainElement(gpuhealthv1alpha1.Measurement{Name: "busBandwidth", Value: "400", Unit: "GB/s"}))
	t.Logf("recertified after %s; history:", time.Since(start).Round(time.Second))
	for _, h := range nh.Status.History {
		if h.Time.After(start.Add(-time.Second)) {
			t.Logf("  %s → %s %s: %s", h.From, h.To, h.Reason, h.Message)
		}
	}
}

// testHelmUpgradeAndUninstall runs last: helm upgrade with a changed value
// rolls both workloads (new operator pods, a new monitor pod) and keeps
// every finding and NodeHealth; helm uninstall leaves no pod, RBAC or
// admission policy of gpuhealth's.
func testHelmUpgradeAndUninstall(t *testing.T) {
	g := NewWithT(t)
	c := env.Cluster.Client
	uids := func(g Gomega) (findings, nodeHealths []types.UID) {
		var nhe gpuhealthv1alpha1.NodeHealthEventList
		g.Expect(c.List(ctx, &nhe)).To(Succeed())
		for _, e := range nhe.Items {
			findings = append(findings, e.UID)
		}
		var nh gpuhealthv1alpha1.NodeHealthList
		g.Expect(c.List(ctx, &nh)).To(Succeed())
		for _, n := range nh.Items {
			nodeHealths = append(nodeHealths, n.UID)
		}
		return findings, nodeHealths
	}
	findings, nodeHealths := uids(g)
	g.Expect(findings).NotTo(BeEmpty())
	g.Expect(nodeHealths).NotTo(BeEmpty())
	oldOperators, oldMonitor := names(operatorPods(g)), monitorPod(g).Name

	start := time.Now()
	_, err := env.helmRelease(ctx, "upgrade", "--set", "operator.workers=8", "--set", "monitor.config.publish.window=2s")
	g.Expect(err).NotTo(HaveOccurred())
	t.Logf("helm upgrade --wait took %s", time.Since(start).Round(time.Millisecond))
	g.Eventually(func(g Gomega) {
		pods := operatorPods(g)
		g.Expect(pods).To(HaveLen(2))
		for _, p := range pods {
			g.Expect(oldOperators).NotTo(ContainElement(p.Name), "a new operator pod")
			g.Expect(running(&p)).To(BeTrue())
			g.Expect(p.Spec.Containers[0].Args).To(ContainElement("--workers=8"))
		}
		m := monitorPod(g)
		g.Expect(m.Name).NotTo(Equal(oldMonitor), "a new monitor pod (the configuration's hash changed)")
		g.Expect(running(m)).To(BeTrue())
	}).Should(Succeed())
	g.Eventually(leader).Should(BeElementOf(names(operatorPods(g))))
	f2, nh2 := uids(g)
	g.Expect(f2).To(ContainElements(findings), "every finding stays")
	g.Expect(nh2).To(ContainElements(nodeHealths), "every NodeHealth stays")

	start = time.Now()
	_, err = env.Cluster.Helm(ctx, "uninstall", framework.ReleaseName, "--namespace", framework.Namespace, "--wait", "--timeout", "2m")
	g.Expect(err).NotTo(HaveOccurred())
	t.Logf("helm uninstall --wait took %s", time.Since(start).Round(time.Millisecond))
	// No pod of ours runs. Finished Jobs stay with their pods (their logs)
	// until their TTL, like the NodeHealths that name them.
	g.Eventually(func(g Gomega) []string {
		var pods corev1.PodList
		g.Expect(c.List(ctx, &pods, client.InNamespace(framework.Namespace))).To(Succeed())
		var left []string
		for _, p := range pods.Items {
			if _, isJob := p.Labels[job.KindLabel]; isJob && (p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed) {
				continue
			}
			left = append(left, p.Name)
		}
		return left
	}, time.Minute).Should(BeEmpty())
	g.Expect(crictl(t, "ps", "-q", "--namespace", framework.Namespace)).To(BeEmpty(), "no container of ours runs on the node")
	left, err := framework.Leftovers(ctx, c)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(left).To(BeEmpty())
	var webhooks admissionregistrationv1.ValidatingWebhookConfigurationList
	g.Expect(c.List(ctx, &webhooks)).To(Succeed())
	for _, w := range webhooks.Items {
		g.Expect(w.Name).NotTo(ContainSubstring("gpuhealth"))
	}
	f3, nh3 := uids(g)
	g.Expect(f3).To(ContainElements(findings), "the findings stay (the CRDs are kept)")
	g.Expect(nh3).To(ContainElements(nodeHealths), "the NodeHealths stay")
}

func kubectl(t *testing.T, args ...string) string {
	t.Helper()
	out, err := env.Cluster.Kubectl(ctx, args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func crictl(t *testing.T, args ...string) string {
	t.Helper()
	bin := filepath.Join(env.Vars["REALNODE_BIN"], "crictl")
	out, err := execOutput(bin, append([]string{"--runtime-endpoint", env.Vars["REALNODE_CRI"]}, args...)...)
	if err != nil {
		t.Fatalf("crictl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(out)
}

// podID is the CRI sandbox of a pod.
func podID(t *testing.T, p *corev1.Pod) string {
	t.Helper()
	ids := strings.Fields(crictl(t, "pods", "-q", "--name", "^"+p.Name+"$", "--namespace", p.Namespace, "--state", "Ready"))
	if len(ids) != 1 {
		t.Fatalf("want one ready sandbox of pod %s/%s, have %v", p.Namespace, p.Name, ids)
	}
	return ids[0]
}

func operatorPods(g Gomega) []corev1.Pod {
	return podsOf(g, "gpuhealth-operator", "")
}

// monitorPod is the monitor DaemonSet's pod on the real node.
func monitorPod(g Gomega) *corev1.Pod {
	pods := podsOf(g, "gpuhealth-monitor", env.Node)
	g.Expect(pods).To(HaveLen(1), "one monitor pod on %s", env.Node)
	return &pods[0]
}

func podsOf(g Gomega, app, nodeName string) []corev1.Pod {
	var list corev1.PodList
	g.Expect(env.Cluster.Client.List(ctx, &list, client.InNamespace(framework.Namespace),
		client.MatchingLabels{"app.kubernetes.io/name": app})).To(Succeed())
	var out []corev1.Pod
	for _, p := range list.Items {
		if p.DeletionTimestamp == nil && (nodeName == "" || p.Spec.NodeName == nodeName) {
			out = append(out, p)
		}
	}
	return out
}

func names(pods []corev1.Pod) []string {
	var out []string
	for _, p := range pods {
		out = append(out, p.Name)
	}
	return out
}

// running: Running with every container ready.
func running(p *corev1.Pod) bool {
	if p.Status.Phase != corev1.PodRunning {
		return false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// leader is the pod holding the operator's Lease ("" when none).
func leader(g Gomega) string {
	var l coordinationv1.Lease
	err := env.Cluster.Client.Get(ctx, client.ObjectKey{Namespace: framework.Namespace, Name: "gpuhealth-operator.gpuhealth.dev"}, &l)
	if apierrors.IsNotFound(err) || l.Spec.HolderIdentity == nil {
		return ""
	}
	g.Expect(err).NotTo(HaveOccurred())
	// controller-runtime's identity is <hostname>_<uuid>; the hostname is the pod's name.
	pod, _, _ := strings.Cut(*l.Spec.HolderIdentity, "_")
	return pod
}

func node(g Gomega, name string) *corev1.Node {
	var n corev1.Node
	g.Expect(env.Cluster.Client.Get(ctx, client.ObjectKey{Name: name}, &n)).To(Succeed())
	return &n
}

func quarantined(g Gomega, name string) bool { return framework.Quarantined(node(g, name)) }

func nodeHealthOf(g Gomega, name string) *gpuhealthv1alpha1.NodeHealth {
	var nh gpuhealthv1alpha1.NodeHealth
	g.Expect(env.Cluster.Client.Get(ctx, client.ObjectKey{Name: name}, &nh)).To(Succeed())
	return &nh
}

// firstLines is the first n lines of s.
func firstLines(s string, n int) string {
	lines := strings.SplitN(s, "\n", n+1)
	return strings.Join(lines[:min(n, len(lines))], "\n")
}

func phase(name string) func(Gomega) gpuhealthv1alpha1.NodeHealthPhase {
	return func(g Gomega) gpuhealthv1alpha1.NodeHealthPhase {
		var nh gpuhealthv1alpha1.NodeHealth
		g.Expect(env.Cluster.Client.Get(ctx, client.ObjectKey{Name: name}, &nh)).To(Succeed())
		return nh.Status.Phase
	}
}

// eventOf reads the real node's NVML XID finding for a GPU and code (its
// name may carry the verdict too: api/v1alpha1.VerdictEventName).
func eventOf(uuid, code string) func(Gomega) *gpuhealthv1alpha1.NodeHealthEvent {
	return func(g Gomega) *gpuhealthv1alpha1.NodeHealthEvent {
		var list gpuhealthv1alpha1.NodeHealthEventList
		g.Expect(env.Cluster.Client.List(ctx, &list)).To(Succeed())
		var found []gpuhealthv1alpha1.NodeHealthEvent
		for _, e := range list.Items {
			s := e.Spec
			if s.NodeName == env.Node && s.Source == gpuhealthv1alpha1.SourceNVML && s.Check == gpuhealthv1alpha1.CheckXID &&
				s.Component.ID == uuid && s.Code == code {
				found = append(found, e)
			}
		}
		g.Expect(found).To(HaveLen(1), "one NVML finding of XID %s on %s", code, uuid)
		return &found[0]
	}
}

// jobsSince lists gpuhealth's Jobs of a kind for the real node created at
// or after since (the API's times have whole seconds).
func jobsSince(g Gomega, kind job.Kind, since time.Time) []batchv1.Job {
	var list batchv1.JobList
	g.Expect(env.Cluster.Client.List(ctx, &list, client.InNamespace(framework.Namespace),
		client.MatchingLabels{job.NodeLabel: env.Node, job.KindLabel: string(kind)})).To(Succeed())
	var out []batchv1.Job
	for _, j := range list.Items {
		if !j.CreationTimestamp.Time.Before(since.Truncate(time.Second)) {
			out = append(out, j)
		}
	}
	return out
}

// jobPod is the one pod of a Job.
func jobPod(g Gomega, jobName string) *corev1.Pod {
	var list corev1.PodList
	g.Expect(env.Cluster.Client.List(ctx, &list, client.InNamespace(framework.Namespace),
		client.MatchingLabels{"job-name": jobName})).To(Succeed())
	g.Expect(list.Items).To(HaveLen(1), "one pod of job %s", jobName)
	return &list.Items[0]
}

// extent is the least and the most a sampled count has been.
type extent struct {
	mu       sync.Mutex
	min, max int
	seen     bool
}

func (e *extent) Min() int { e.mu.Lock(); defer e.mu.Unlock(); return e.min }
func (e *extent) Max() int { e.mu.Lock(); defer e.mu.Unlock(); return e.max }

// sample calls count every 100 ms until the test ends and keeps its extent
// (a failed count is skipped).
func sample(t *testing.T, count func() (int, error)) *extent {
	t.Helper()
	e := &extent{}
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
			n, err := count()
			if err != nil {
				continue
			}
			e.mu.Lock()
			if !e.seen || n < e.min {
				e.min = n
			}
			if !e.seen || n > e.max {
				e.max = n
			}
			e.seen = true
			e.mu.Unlock()
		}
	}()
	t.Cleanup(func() { close(stop); <-done })
	return e
}

// readyPods counts a workload's ready pods.
func readyPods(namespace, app string) func() (int, error) {
	return func() (int, error) {
		var list corev1.PodList
		if err := env.Cluster.Client.List(ctx, &list, client.InNamespace(namespace), client.MatchingLabels{"app": app}); err != nil {
			return 0, err
		}
		n := 0
		for _, p := range list.Items {
			if p.DeletionTimestamp == nil && running(&p) {
				n++
			}
		}
		return n, nil
	}
}

// outOfService counts the NodeHealths Draining or Recertifying, from one
// List (a consistent snapshot).
func outOfService() (int, error) {
	var list gpuhealthv1alpha1.NodeHealthList
	if err := env.Cluster.Client.List(ctx, &list); err != nil {
		return 0, err
	}
	n := 0
	for _, nh := range list.Items {
		if p := nh.Status.Phase; p == gpuhealthv1alpha1.PhaseDraining || p == gpuhealthv1alpha1.PhaseRecertifying {
			n++
		}
	}
	return n, nil
}

// spooledOccurrences sums the occurrences the monitor's hostPath spool
// holds for an NVML XID finding about a GPU.
func spooledOccurrences(uuid, code string) int64 {
	var n int64
	// A file that goes or cannot be read mid-walk (the monitor rewrites its
	// spool) counts nothing; the callers poll.
	_ = filepath.WalkDir(env.Spool, func(path string, d os.DirEntry, walkErr error) error {
		if walkErr == nil && !d.IsDir() && strings.HasSuffix(d.Name(), ".json") {
			var r spool.Record
			if b, err := os.ReadFile(path); err == nil && json.Unmarshal(b, &r) == nil &&
				r.Spec.Source == gpuhealthv1alpha1.SourceNVML && r.Spec.Component.ID == uuid && r.Spec.Code == code {
				n += max(r.Base, 0) + r.Pending
			}
		}
		return nil
	})
	return n
}

// spooled counts the records in the monitor's hostPath spool.
func spooled() int {
	n := 0
	_ = filepath.WalkDir(env.Spool, func(_ string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(d.Name(), ".json") {
			n++
		}
		return nil
	})
	return n
}
