package imex

import (
	"context"
	"errors"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/monitors"
)

// notConfiguredOut is what nvidia-imex-ctl prints, exiting 255, on a node
// whose IMEX is not configured.
const notConfiguredOut = "Failed to read node configuration file\n"

// stateIs reads gpuhealth_monitor_imex_state for st.
func stateIs(st State) func() float64 {
	return func() float64 { return testutil.ToFloat64(stateGauge.WithLabelValues(string(st))) }
}

func TestTargetArguments(t *testing.T) {
	cases := []struct {
		name       string
		target     Target
		wantDaemon []string
		wantDomain []string // nil: no domain probe
		wantErr    bool
	}{
		{
			name:       "An address is -i with the default command port.",
			target:     Target{Address: "10.0.0.1"},
			wantDaemon: []string{"-q", "-i", "10.0.0.1", "50005"},
		},
		{
			name:       "An address takes its port.",
			target:     Target{Address: "10.0.0.1", Port: 6000},
			wantDaemon: []string{"-q", "-i", "10.0.0.1", "6000"},
		},
		{
			name:       "An IPv6 address is passed as it is.",
			target:     Target{Address: "fd00:10:244::5"},
			wantDaemon: []string{"-q", "-i", "fd00:10:244::5", "50005"},
		},
		{
			name:       "A config file is -c, and the domain status needs it.",
			target:     Target{ConfigFile: "/etc/nvidia-imex/config.cfg"},
			wantDaemon: []string{"-q", "-c", "/etc/nvidia-imex/config.cfg"},
			wantDomain: []string{"-N", "-j", "-c", "/etc/nvidia-imex/config.cfg"},
		},
		{
			name:    "No target is an error.",
			target:  Target{},
			wantErr: true,
		},
		{
			name:    "An address and a config file are an error: the tool takes one of -i, -u and -c.",
			target:  Target{Address: "10.0.0.1", ConfigFile: "/etc/nvidia-imex/config.cfg"},
			wantErr: true,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			daemon, err := DaemonStatusArgs(tc.target)
			domain, ok := DomainStatusArgs(tc.target)
			if tc.wantErr {
				g.Expect(err).To(MatchError(errTarget))
				g.Expect(ok).To(BeFalse())
				return
			}
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(daemon).To(Equal(tc.wantDaemon))
			g.Expect(ok).To(Equal(tc.wantDomain != nil))
			g.Expect(domain).To(Equal(tc.wantDomain))
		})
	}
}

func TestDaemonPodSelection(t *testing.T) {
	deleting := func(p *corev1.Pod) { p.DeletionTimestamp = &metav1.Time{Time: time.Now()} }
	newer := func(p *corev1.Pod) { p.CreationTimestamp = metav1.NewTime(time.Now()) }
	cases := []struct {
		name string
		pods []corev1.Pod
		want string // pod name; empty: none
	}{
		{name: "No pods is no daemon pod.", want: ""},
		{name: "The domain's pod on the node is the daemon pod.", pods: []corev1.Pod{daemonPodOf("a", "10.0.0.1")}, want: "a"},
		{
			name: "A pod of another domain is not.",
			pods: []corev1.Pod{daemonPodOf("a", "10.0.0.1", func(p *corev1.Pod) { p.Labels[ComputeDomainLabel] = "other" })},
		},
		{
			name: "A pod bound to another node is not.",
			pods: []corev1.Pod{daemonPodOf("a", "10.0.0.1", func(p *corev1.Pod) { p.Spec.NodeName = "gpu-b" })},
		},
		{
			name: "A terminating pod of the previous domain gives way to the new one.",
			pods: []corev1.Pod{
				daemonPodOf("old", "10.0.0.1", deleting, func(p *corev1.Pod) { p.Labels[ComputeDomainLabel] = "previous" }),
				daemonPodOf("new", "10.0.0.2", newer),
			},
			want: "new",
		},
		{name: "A pod being deleted is not.", pods: []corev1.Pod{daemonPodOf("a", "10.0.0.1", deleting)}},
		{
			name: "A pod that ended is not.",
			pods: []corev1.Pod{daemonPodOf("a", "10.0.0.1", func(p *corev1.Pod) { p.Status.Phase = corev1.PodFailed })},
		},
		{
			name: "Of two pods, the newer is.",
			pods: []corev1.Pod{daemonPodOf("older", "10.0.0.1"), daemonPodOf("newer", "10.0.0.2", newer)},
			want: "newer",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			p := daemonPod(tc.pods, testNode, testDomain)
			if tc.want == "" {
				g.Expect(p).To(BeNil())
				return
			}
			g.Expect(p).NotTo(BeNil())
			g.Expect(p.Name).To(Equal(tc.want))
		})
	}
}

// A ComputeDomain member's daemon pod is asked at its IP; what it says is
// judged as before, and when the pod goes, nothing is judged and the open
// finding stays open (unknown is not recovered) until the node leaves.
func TestSourceJudgesTheDaemonPod(t *testing.T) {
	g := NewWithT(t)
	fk := newFake(t)
	pods := &fakePods{}
	pods.set(nil, daemonPodOf("computedomain-daemon-x", "10.244.1.5"))
	r := start(t, fk.podSource(pods))

	g.Eventually(fk.calls, 5*time.Second).Should(ContainElement("-q -i 10.244.1.5 50005"))
	g.Eventually(stateIs(StateChecking)).Should(Equal(1.0))
	r.none(g, fk)

	fk.daemon(t, "UNAVAILABLE\n", 0)
	unavailable := daemonFinding("UNAVAILABLE", "IMEX daemon is UNAVAILABLE, not READY")
	g.Expect(r.next(g)).To(Equal(unavailable))

	// The daemon pod is gone (the DaemonSet replaces it): not judged, the
	// state says so and the finding stays open.
	pods.set(nil)
	g.Eventually(stateIs(StateNoDaemonPod), 5*time.Second).Should(Equal(1.0))
	calls := len(fk.calls())
	r.none(g, fk)
	g.Expect(fk.calls()).To(HaveLen(calls))

	// The new pod has no IP yet: still not judged.
	pods.set(nil, daemonPodOf("computedomain-daemon-y", ""))
	g.Eventually(stateIs(StateDaemonStarting), 5*time.Second).Should(Equal(1.0))
	r.none(g, fk)
	g.Expect(fk.calls()).To(HaveLen(calls))

	// It has one and the daemon is READY: the finding resolves.
	fk.daemon(t, "READY\n", 0)
	pods.set(nil, daemonPodOf("computedomain-daemon-y", "10.244.1.6"))
	g.Expect(r.next(g)).To(Equal(resolved(unavailable, "IMEX daemon is READY")))
	g.Expect(fk.calls()).To(ContainElement("-q -i 10.244.1.6 50005"))
	g.Expect(fk.calls()).NotTo(ContainElement(HavePrefix("-N")), "no domain probe without a config file")
}

func TestSourceLeavesAStartingDaemonPodAlone(t *testing.T) {
	g := NewWithT(t)
	fk := newFake(t)
	fk.daemon(t, "WAITING_FOR_PEERS\n", 0)
	clk := clocktesting.NewFakePassiveClock(time.Date(2026, 11, 5, 10, 0, 0, 0, time.UTC))
	notReady := func(p *corev1.Pod) {
		p.Status.Conditions[0].Status = corev1.ConditionFalse
		started := metav1.NewTime(clk.Now().Add(-2 * time.Minute))
		p.Status.StartTime = &started
	}
	pods := &fakePods{}
	pods.set(nil, daemonPodOf("computedomain-daemon-x", "10.244.1.5", notReady))
	src := fk.podSource(pods)
	src.Clock, src.StartupGrace = clk, 5*time.Minute
	r := start(t, src)

	// Two minutes after it started and not Ready: a joining daemon.
	g.Eventually(stateIs(StateDaemonStarting), 5*time.Second).Should(Equal(1.0))
	r.none(g, fk)
	g.Expect(fk.calls()).To(BeEmpty())

	// Past the grace it is judged.
	clk.SetTime(clk.Now().Add(4 * time.Minute))
	f := r.next(g)
	g.Expect(f.Code).To(Equal("WAITING_FOR_PEERS"))
}

func TestSourceDoesNotJudgeANodeWithoutClique(t *testing.T) {
	g := NewWithT(t)
	fk := newFake(t)
	fk.daemon(t, "UNAVAILABLE\n", 0)
	pods := &fakePods{}
	pods.set(nil, daemonPodOf("computedomain-daemon-x", "10.244.1.5"))
	r := start(t, fk.podSource(pods))
	unavailable := daemonFinding("UNAVAILABLE", "IMEX daemon is UNAVAILABLE, not READY")
	g.Expect(r.next(g)).To(Equal(unavailable))

	// The daemon labelled its pod with an empty clique: the driver runs no
	// IMEX daemon on a node without NVLink fabric, so there is nothing to
	// judge and the finding resolves.
	pods.set(nil, daemonPodOf("computedomain-daemon-x", "10.244.1.5", func(p *corev1.Pod) { p.Labels[CliqueLabel] = "" }))
	f := r.next(g)
	g.Expect(f.Resolved).To(BeTrue())
	g.Expect(f.Message).To(ContainSubstring("no NVLink clique"))
	g.Expect(stateIs(StateNoClique)()).To(Equal(1.0))
	calls := len(fk.calls())
	r.none(g, fk)
	g.Expect(fk.calls()).To(HaveLen(calls))
}

func TestSourceWithUnreadablePodsJudgesNothing(t *testing.T) {
	g := NewWithT(t)
	fk := newFake(t)
	pods := &fakePods{}
	pods.set(errors.New(`pods is forbidden: User "system:serviceaccount:gpuhealth-system:gpuhealth-monitor" cannot list resource "pods"`))
	r := start(t, fk.podSource(pods))
	g.Eventually(stateIs(StatePodsUnreadable), 5*time.Second).Should(Equal(1.0))
	r.none(g, fk)
	g.Expect(fk.calls()).To(BeEmpty())
}

func TestSourceWithoutDaemonJudgesNothing(t *testing.T) {
	g := NewWithT(t)
	fk := newFake(t)
	src := fk.source()
	src.ConfigFile = "" // no pods looked up, no host-managed daemon
	r := start(t, src)
	g.Eventually(stateIs(StateNoDaemonPod), 5*time.Second).Should(Equal(1.0))
	r.none(g, fk)
	g.Expect(fk.calls()).To(BeEmpty())
}

// "Failed to read node configuration file" (exit 255) is a state: no
// finding, the open ones resolve, and Run returns unavailable so that the
// agent shows the source down and tries it again later.
func TestSourceNotConfigured(t *testing.T) {
	cases := []struct {
		name     string
		setup    func(t *testing.T, fk *fake)
		wantArgs string
	}{
		{
			name: "The daemon probe prints it on standard output.",
			setup: func(t *testing.T, fk *fake) {
				t.Helper()
				fk.daemon(t, notConfiguredOut, 255)
			},
			wantArgs: "nvidia-imex-ctl -q -c /imex/config.cfg",
		},
		{
			name: "The daemon probe prints it on standard error.",
			setup: func(t *testing.T, fk *fake) {
				t.Helper()
				fk.daemon(t, "", 255)
				fk.write(t, "daemon.err", "nvidia-imex-ctl: Failed to read node configuration file /etc/nvidia-imex/nodes_config.cfg\n")
			},
			wantArgs: "nvidia-imex-ctl -q -c /imex/config.cfg",
		},
		{
			name: "The domain probe prints it.",
			setup: func(t *testing.T, fk *fake) {
				t.Helper()
				fk.domain(t, notConfiguredOut, 255)
			},
			wantArgs: "nvidia-imex-ctl -N -j -c /imex/config.cfg",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			fk := newFake(t)
			tc.setup(t, fk)
			var got []monitors.Finding
			err := fk.source().Run(context.Background(), func(f monitors.Finding) { got = append(got, f) })
			g.Expect(err).To(MatchError(monitors.ErrUnavailable))
			g.Expect(err.Error()).To(ContainSubstring("IMEX is not configured on this node"))
			g.Expect(err.Error()).To(ContainSubstring(tc.wantArgs))
			g.Expect(got).To(BeEmpty())
			g.Expect(stateIs(StateNotConfigured)()).To(Equal(1.0))
		})
	}

	t.Run("What was raised before resolves.", func(t *testing.T) {
		g := NewWithT(t)
		fk := newFake(t)
		fk.domain(t, domainDown, 0)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		findings := make(chan monitors.Finding, 10)
		done := make(chan error, 1)
		go func() { done <- fk.source().Run(ctx, func(f monitors.Finding) { findings <- f }) }()
		down := domainFinding("DOWN", gpuhealthv1alpha1.SeverityFatal, msgDown)
		var f monitors.Finding
		g.Eventually(findings, 5*time.Second).Should(Receive(&f))
		f.Time = time.Time{}
		g.Expect(f).To(Equal(down))

		// Exit status 0: the fake replaces its output and its exit status
		// one after the other, and a tick between the two must not see
		// READY with 255. The message decides, whatever the status.
		fk.daemon(t, notConfiguredOut, 0)
		var err error
		g.Eventually(done, 5*time.Second).Should(Receive(&err))
		g.Expect(err).To(MatchError(monitors.ErrUnavailable))
		g.Eventually(findings).Should(Receive(&f))
		f.Time = time.Time{}
		g.Expect(f).To(Equal(resolved(down, "IMEX is not configured on this node")))
	})
}

func TestSourceFindsTheCommandOnTheDriverRoot(t *testing.T) {
	g := NewWithT(t)
	fk := newFake(t)
	t.Setenv("PATH", t.TempDir())
	saved := DefaultCommandPaths
	t.Cleanup(func() { DefaultCommandPaths = saved })
	DefaultCommandPaths = []string{"/nonexistent/usr/bin/nvidia-imex-ctl", fk.path()}

	path, err := findCommand("")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(path).To(Equal(fk.path()))

	DefaultCommandPaths = []string{"/nonexistent/usr/bin/nvidia-imex-ctl"}
	src := fk.source()
	src.Command = ""
	err = src.Run(context.Background(), func(monitors.Finding) {})
	g.Expect(err).To(MatchError(monitors.ErrUnavailable))
	g.Expect(err.Error()).To(ContainSubstring("neither in PATH nor at /nonexistent/usr/bin/nvidia-imex-ctl"))
	g.Expect(stateIs(StateNoCommand)()).To(Equal(1.0))
}
