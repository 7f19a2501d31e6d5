package imex

import (
	"context"
	"testing"
	"time"

	"github.com/go-logr/logr"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/gpuhealth/gpuhealth/internal/test/testenv"
)

// The daemon pod is found through a real apiserver (envtest), as the agent
// finds it: a watch of the pods bound to its node in the driver's namespace.
// Each step names the lifecycle moment it covers.
func TestPodWatchOnARealAPIServer(t *testing.T) {
	ctrllog.SetLogger(logr.Discard())
	env, err := testenv.Start()
	if err != nil {
		t.Fatalf("starting envtest (set KUBEBUILDER_ASSETS): %v", err)
	}
	t.Cleanup(func() { _ = env.Environment.Stop() })
	ctx := t.Context()
	admin := env.Client
	for _, ns := range []string{DefaultDriverNamespace, "elsewhere"} {
		if err := admin.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			t.Fatal(err)
		}
	}
	// createPod creates a daemon pod and sets its status as a kubelet would.
	createPod := func(g Gomega, p corev1.Pod) *corev1.Pod {
		status := p.Status
		p.ResourceVersion, p.CreationTimestamp, p.Status = "", metav1.Time{}, corev1.PodStatus{}
		p.Spec.Containers = []corev1.Container{{Name: "compute-domain-daemon", Image: "daemon"}}
		g.Expect(admin.Create(ctx, &p)).To(Succeed())
		p.Status = status
		g.Expect(admin.Status().Update(ctx, &p)).To(Succeed())
		return &p
	}
	deletePod := func(g Gomega, p *corev1.Pod) {
		// No kubelet runs here: without a zero grace period the pod would
		// only be marked for deletion.
		g.Expect(admin.Delete(ctx, p, client.GracePeriodSeconds(0))).To(Succeed())
	}

	w, err := NewPodWatch(env.Config, testNode, "")
	if err != nil {
		t.Fatal(err)
	}
	g := NewWithT(t)
	g.Expect(w.Namespace()).To(Equal(DefaultDriverNamespace))
	fk := newFake(t)
	src := fk.podSource(w)
	r := start(t, src)

	// The node carries the label, but its daemon pod does not exist yet
	// (pods of other nodes, namespaces or without the label do not count).
	onOtherNode := daemonPodOf("daemon-b", "10.244.2.5", func(p *corev1.Pod) { p.Spec.NodeName = "gpu-b" })
	createPod(g, onOtherNode)
	inOtherNamespace := daemonPodOf("daemon-elsewhere", "10.244.3.5", func(p *corev1.Pod) { p.Namespace = "elsewhere" })
	createPod(g, inOtherNamespace)
	unlabelled := daemonPodOf("workload", "10.244.1.9", func(p *corev1.Pod) { p.Labels = nil })
	createPod(g, unlabelled)
	g.Eventually(stateIs(StateNoDaemonPod), 10*time.Second).Should(Equal(1.0))
	r.none(g, fk)
	g.Expect(fk.calls()).To(BeEmpty())
	g.Consistently(func(g Gomega) {
		pods, err := w.DaemonPods(ctx)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(pods).To(BeEmpty())
	}, time.Second).Should(Succeed())

	// Join: the domain's daemon pod starts on the node and gets its IP;
	// the daemon is asked at that IP on the command port.
	pod := createPod(g, daemonPodOf("computedomain-daemon-abc12", "10.244.1.5"))
	g.Eventually(fk.calls, 10*time.Second).Should(ContainElement("-q -i 10.244.1.5 50005"))
	g.Expect(stateIs(StateChecking)()).To(Equal(1.0))
	g.Expect(fk.calls()).To(HaveEach("-q -i 10.244.1.5 50005"))

	// A daemon that is not ready is reported.
	fk.daemon(t, "UNAVAILABLE\n", 0)
	unavailable := daemonFinding("UNAVAILABLE", "IMEX daemon is UNAVAILABLE, not READY")
	g.Expect(r.next(g)).To(Equal(unavailable))

	// The pod is gone: IMEX is not judged, the state says why, and
	// nvidia-imex-ctl is no longer run.
	deletePod(g, pod)
	g.Eventually(stateIs(StateNoDaemonPod), 10*time.Second).Should(Equal(1.0))
	calls := len(fk.calls())
	r.none(g, fk)
	g.Expect(fk.calls()).To(HaveLen(calls))

	// A new pod of a node without NVLink fabric (empty clique label): the
	// driver runs no IMEX daemon there, nothing is judged, the open
	// finding resolves.
	createPod(g, daemonPodOf("computedomain-daemon-def34", "10.244.1.6", func(p *corev1.Pod) { p.Labels[CliqueLabel] = "" }))
	f := r.next(g)
	g.Expect(f.Resolved).To(BeTrue())
	g.Expect(f.Code).To(Equal("UNAVAILABLE"))
	g.Expect(stateIs(StateNoClique)()).To(Equal(1.0))
	g.Expect(fk.calls()).To(HaveLen(calls))

	// Leave: the node label goes; IMEX is not judged.
	fk.setLabels(map[string]string{})
	g.Eventually(stateIs(StateNotMember), 10*time.Second).Should(Equal(1.0))
	r.none(g, fk)
	g.Expect(fk.calls()).To(HaveLen(calls))

	// Without get/list/watch on pods in the driver's namespace the watch
	// says so instead of waiting.
	t.Run("A missing Role is reported.", func(t *testing.T) {
		g := NewWithT(t)
		user, err := env.Environment.AddUser(envtest.User{Name: "no-pod-access"}, nil)
		g.Expect(err).NotTo(HaveOccurred())
		w, err := NewPodWatch(user.Config(), testNode, DefaultDriverNamespace)
		g.Expect(err).NotTo(HaveOccurred())
		ctx, cancel := context.WithCancel(t.Context())
		t.Cleanup(cancel)
		_, err = w.DaemonPods(ctx)
		g.Expect(err).To(MatchError(ContainSubstring("not been started")))
		w.Start(ctx)
		w.Start(ctx) // a second start does nothing
		g.Eventually(func() error { _, err := w.DaemonPods(ctx); return err }, 10*time.Second).
			Should(MatchError(ContainSubstring("forbidden")))
	})
}
