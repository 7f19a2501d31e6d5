package nodehealth

import (
	"context"
	"fmt"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/discovery"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/controllers/computedomain"
	"github.com/gpuhealth/gpuhealth/controllers/index"
	"github.com/gpuhealth/gpuhealth/internal/test/testenv"
	"github.com/gpuhealth/gpuhealth/remediation/breaker"
	"github.com/gpuhealth/gpuhealth/remediation/drain"
	"github.com/gpuhealth/gpuhealth/remediation/job"
)

// startManager runs the reconciler in a real manager (cache, watches,
// workqueue) until the returned stop function is called.
func startManager(t *testing.T) (stop func()) {
	t.Helper()
	g := NewWithT(t)
	mgr, err := ctrl.NewManager(testEnv.Config, ctrl.Options{
		Scheme:  testScheme,
		Metrics: metricsserver.Options{BindAddress: "0"},
		// Each test process starts several managers with the same controller.
		Controller: config.Controller{SkipNameValidation: ptr.To(true)},
	})
	g.Expect(err).NotTo(HaveOccurred())
	clk := clock.RealClock{}
	r := &Reconciler{
		Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), HandOff: k8sClient, Clock: clk,
		Recorder: mgr.GetEventRecorder("gpuhealth-test"), Drainer: drain.New(mgr.GetClient(), k8sClient, clk, jobNamespace),
		Breaker: breaker.New(), Namespace: jobNamespace, DriverNamespace: driverNamespace, JobRules: testJobRules, MaxConcurrentReconciles: 4,
	}
	ctx, cancel := context.WithCancel(context.Background())
	g.Expect(index.Register(ctx, mgr.GetFieldIndexer())).To(Succeed())
	g.Expect(r.SetupWithManager(ctx, mgr)).To(Succeed())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	return func() {
		cancel()
		g.Expect(<-done).To(Succeed())
	}
}

// TestOperatorRestartMidDrainResumes stops the operator while a PDB blocks
// the drain, starts a new one, stops that one again while the
// recertification Job runs, and checks that the node finishes the cycle
// with exactly one recertification Job.
func TestOperatorRestartMidDrainResumes(t *testing.T) {
	h := newHarness(t)
	g := h.g
	h.policy(func(s *gpuhealthv1alpha1.RemediationPolicySpec) {
		s.Recertification.Job = jobTemplate()
		s.Recertification.SoakWindow = dur("0s")
	})
	n := h.node("a", nil)
	pod := h.pod(n.Name, h.label+"-trainer", map[string]string{"app": h.label})
	pod.Status.Phase = corev1.PodRunning
	pod.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
	g.Expect(k8sClient.Status().Update(h.ctx, pod)).To(Succeed())
	pdb := &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Name: h.label, Namespace: "default"},
		Spec: policyv1.PodDisruptionBudgetSpec{
			MinAvailable: ptr.To(intstr.FromInt32(1)),
			Selector:     &metav1.LabelSelector{MatchLabels: map[string]string{"app": h.label}},
		},
	}
	g.Expect(k8sClient.Create(h.ctx, pdb)).To(Succeed())
	t.Cleanup(func() { _ = k8sClient.Delete(context.Background(), pdb) })
	setDisruptionsAllowed := func(n int32) {
		// envtest runs no disruption controller: the test plays it.
		g.Expect(k8sClient.Get(h.ctx, client.ObjectKeyFromObject(pdb), pdb)).To(Succeed())
		pdb.Status = policyv1.PodDisruptionBudgetStatus{
			ObservedGeneration: pdb.Generation, DisruptionsAllowed: n,
			CurrentHealthy: 1, DesiredHealthy: 1 - n, ExpectedPods: 1,
		}
		g.Expect(k8sClient.Status().Update(h.ctx, pdb)).To(Succeed())
	}
	setDisruptionsAllowed(0)

	stop := startManager(t)
	h.fault(n.Name, gpuhealthv1alpha1.CheckXID, "79")
	g.Eventually(func() string {
		nh := &gpuhealthv1alpha1.NodeHealth{}
		if err := k8sClient.Get(h.ctx, types.NamespacedName{Name: n.Name}, nh); err != nil {
			return err.Error()
		}
		return string(nh.Status.Phase) + "/" + nh.Status.Reason
	}, 20*time.Second, 100*time.Millisecond).Should(Equal("Draining/BlockedByPDB"))
	nh := h.nodeHealth(n.Name)
	g.Expect(nh.Status.Drain.Blocked).To(HaveLen(1))
	g.Expect(nh.Status.Drain.Blocked[0].PodDisruptionBudget).To(Equal(pdb.Name))

	// Kill the operator mid-drain; the PDB relents while it is down.
	stop()
	setDisruptionsAllowed(1)
	stop = startManager(t)
	defer func() { stop() }()

	var recert string
	g.Eventually(func() bool {
		h.playKubelet(n.Name)
		nh := h.nodeHealth(n.Name)
		if nh.Status.Drain != nil && len(nh.Status.Drain.Blocked) > 0 {
			cur := &policyv1.PodDisruptionBudget{}
			_ = k8sClient.Get(h.ctx, client.ObjectKeyFromObject(pdb), cur)
			p := &corev1.Pod{}
			_ = k8sClient.Get(h.ctx, client.ObjectKeyFromObject(pod), p)
			t.Logf("phase %s blocked %s; pdb gen %d status %+v; pod phase %s deletion %v", nh.Status.Phase, nh.Status.Drain.Blocked[0].Message, cur.Generation, cur.Status, p.Status.Phase, p.DeletionTimestamp)
		}
		recert = h.jobName(job.Recertification, n.Name, 1)
		return h.jobExists(recert)
	}, 30*time.Second, 100*time.Millisecond).Should(BeTrue(), "the new operator finishes the drain and starts recertification")

	// Kill it again while the recertification Job runs: the next operator
	// takes up that Job instead of making another.
	stop()
	stop = startManager(t)
	h.finishJob(recert, true)
	g.Eventually(func() gpuhealthv1alpha1.NodeHealthPhase { return h.phase(n.Name) }, 20*time.Second, 100*time.Millisecond).Should(Equal(healthy))

	jobs := &batchv1.JobList{}
	g.Expect(k8sClient.List(h.ctx, jobs, client.InNamespace(jobNamespace), client.MatchingLabels{job.NodeLabel: n.Name})).To(Succeed())
	g.Expect(jobs.Items).To(HaveLen(1), "no duplicate Job after either restart")
	g.Expect(historyPhases(h.nodeHealth(n.Name))).To(Equal([]gpuhealthv1alpha1.NodeHealthPhase{healthy, quarantined, draining, recertifying, healthy}))
	// Healthy is written before the release (a crash between the two
	// must not re-cordon), so the uncordon follows in the next pass.
	g.Eventually(func() bool { return h.getNode(n.Name).Spec.Unschedulable }, 10*time.Second, 100*time.Millisecond).Should(BeFalse())
}

// TestManagerViewWakesALeavingNode runs the operator's wiring (manager,
// view as a Runnable, the view's channel source): a drained member waits
// in Draining while its clique entry remains, and the entry's removal alone
// (no node or pod change, and well inside the one-minute leave recheck)
// moves it on.
func TestManagerViewWakesALeavingNode(t *testing.T) {
	for _, shape := range testenv.DriverShapes() {
		t.Run(shape.Name, func(t *testing.T) {
			h := newHarness(t)
			g := h.g
			h.policy(func(s *gpuhealthv1alpha1.RemediationPolicySpec) { s.Recertification.SoakWindow = dur("1h") })
			e := h.withComputeDomains(shape) // the test's own view, to know what the driver did
			d, clique, n := e.member()

			mgr, err := ctrl.NewManager(testEnv.Config, ctrl.Options{
				Scheme: testScheme, Metrics: metricsserver.Options{BindAddress: "0"},
				Controller: config.Controller{SkipNameValidation: ptr.To(true)},
			})
			g.Expect(err).NotTo(HaveOccurred())
			disc, err := discovery.NewDiscoveryClientForConfig(mgr.GetConfig())
			g.Expect(err).NotTo(HaveOccurred())
			view := computedomain.NewView(mgr.GetCache(), disc, clock.RealClock{}, driverNamespace)
			g.Expect(mgr.Add(view)).To(Succeed())
			clk := clock.RealClock{}
			r := &Reconciler{
				Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), HandOff: k8sClient, Clock: clk,
				Recorder: mgr.GetEventRecorder("gpuhealth-test"), Drainer: drain.New(mgr.GetClient(), k8sClient, clk, jobNamespace),
				Breaker: breaker.New(), Namespace: jobNamespace, DriverNamespace: driverNamespace, JobRules: testJobRules, ComputeDomains: view, MaxConcurrentReconciles: 4,
			}
			ctx, cancel := context.WithCancel(context.Background())
			g.Expect(index.Register(ctx, mgr.GetFieldIndexer())).To(Succeed())
			g.Expect(r.SetupWithManager(ctx, mgr)).To(Succeed())
			done := make(chan error, 1)
			go func() { done <- mgr.Start(ctx) }()
			defer func() {
				cancel()
				g.Expect(<-done).To(Succeed())
			}()

			status := func() string {
				nh := &gpuhealthv1alpha1.NodeHealth{}
				if err := k8sClient.Get(h.ctx, types.NamespacedName{Name: n}, nh); err != nil {
					return err.Error()
				}
				traces := ""
				if cd := nh.Status.ComputeDomain; cd != nil {
					traces = fmt.Sprint(cd.Traces)
				}
				return string(nh.Status.Phase) + "/" + nh.Status.Reason + "/" + traces
			}
			h.fault(n, gpuhealthv1alpha1.CheckXID, "79")
			g.Eventually(status, 20*time.Second, 50*time.Millisecond).Should(Equal(fmt.Sprint("Draining/LeavingComputeDomain/", e.traces(gpuhealthv1alpha1.TraceCliqueEntry, gpuhealthv1alpha1.TraceDaemonPod, gpuhealthv1alpha1.TraceNodeLabel))))

			// The driver unprepares the claim and the DaemonSet removes the pod: the
			// node and pod watches wake the node; the clique entry remains.
			e.unlabel(n)
			e.deleteDaemonPod(n)
			g.Eventually(status, 20*time.Second, 50*time.Millisecond).Should(Equal(fmt.Sprint("Draining/LeavingComputeDomain/", e.traces(gpuhealthv1alpha1.TraceCliqueEntry))))

			// Only the clique changes now: the view's channel wakes the node.
			e.removeCliqueEntry(n, d, clique)
			g.Eventually(status, 20*time.Second, 50*time.Millisecond).Should(HavePrefix("Recertifying/"))
		})
	}
}
