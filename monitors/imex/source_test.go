package imex

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
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

// fakeCtl is a stand-in for nvidia-imex-ctl: a shell script that logs its
// arguments to "calls" and prints what the test put in daemon.out or
// domain.out (and daemon.err or domain.err on standard error, when they
// exist), exiting with daemon.rc or domain.rc, after sleeping daemon.sleep
// or domain.sleep seconds when those files exist.
const fakeCtl = `#!/bin/sh
d=$(dirname "$0")
echo "$*" >> "$d/calls"
case "$1" in
-q) f=daemon ;;
*) f=domain ;;
esac
if [ -f "$d/$f.sleep" ]; then exec sleep "$(cat "$d/$f.sleep")"; fi
cat "$d/$f.out"
if [ -f "$d/$f.err" ]; then cat "$d/$f.err" >&2; fi
exit "$(cat "$d/$f.rc")"
`

// fake is a fake nvidia-imex-ctl and the node labels the source sees.
type fake struct {
	dir string

	mu          sync.Mutex
	labels      map[string]string
	labelCalls  int
	labelsError error
}

func newFake(t *testing.T) *fake {
	t.Helper()
	fk := &fake{dir: t.TempDir(), labels: map[string]string{ComputeDomainLabel: testDomain}}
	// Written before any source runs, so that no fork in this process holds
	// the file open for writing when it is executed (ETXTBSY).
	if err := os.WriteFile(fk.path(), []byte(fakeCtl), 0o755); err != nil {
		t.Fatal(err)
	}
	fk.daemon(t, "READY\n", 0)
	fk.domain(t, domainUp, 0)
	return fk
}

func (fk *fake) path() string { return filepath.Join(fk.dir, "nvidia-imex-ctl") }

// daemon sets what the daemon probe prints and its exit code.
func (fk *fake) daemon(t *testing.T, out string, rc int) {
	t.Helper()
	fk.write(t, "daemon.out", out)
	fk.write(t, "daemon.rc", strconv.Itoa(rc))
}

// domain sets what the domain probe prints and its exit code.
func (fk *fake) domain(t *testing.T, out string, rc int) {
	t.Helper()
	fk.write(t, "domain.out", out)
	fk.write(t, "domain.rc", strconv.Itoa(rc))
}

// write replaces a file atomically, so that the script never reads half of it.
func (fk *fake) write(t *testing.T, name, content string) {
	t.Helper()
	tmp := filepath.Join(fk.dir, name+".tmp")
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(fk.dir, name)); err != nil {
		t.Fatal(err)
	}
}

// calls returns the argument lists the script was run with.
func (fk *fake) calls() []string {
	b, err := os.ReadFile(filepath.Join(fk.dir, "calls"))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return strings.Split(strings.TrimSpace(string(b)), "\n")
}

func (fk *fake) setLabels(l map[string]string) {
	fk.mu.Lock()
	defer fk.mu.Unlock()
	fk.labels = l
}

func (fk *fake) nodeLabels(context.Context) (map[string]string, error) {
	fk.mu.Lock()
	defer fk.mu.Unlock()
	fk.labelCalls++
	return fk.labels, fk.labelsError
}

// ticks returns how many times the source read the labels: one per tick.
func (fk *fake) ticks() int {
	fk.mu.Lock()
	defer fk.mu.Unlock()
	return fk.labelCalls
}

// testConfig is the host-managed daemon's config file the fake sources use;
// the fake script does not read it.
const testConfig = "/imex/config.cfg"

// source is a Source for a host-managed daemon (ConfigFile), so that both
// probes run.
func (fk *fake) source() *Source {
	return &Source{
		Command:        fk.path(),
		ConfigFile:     testConfig,
		Interval:       20 * time.Millisecond,
		Timeout:        2 * time.Second,
		RepeatInterval: time.Hour,
		NodeLabels:     fk.nodeLabels,
	}
}

// podSource is a Source that finds the daemon pods through pods.
func (fk *fake) podSource(pods DaemonPodLister) *Source {
	src := fk.source()
	src.ConfigFile, src.NodeName, src.Pods = "", testNode, pods
	return src
}

// fakePods is a DaemonPodLister with pods the test sets.
type fakePods struct {
	mu   sync.Mutex
	pods []corev1.Pod
	err  error
}

func (f *fakePods) Start(context.Context) {}

func (f *fakePods) DaemonPods(context.Context) ([]corev1.Pod, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]corev1.Pod(nil), f.pods...), f.err
}

func (f *fakePods) set(err error, pods ...corev1.Pod) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.pods, f.err = pods, err
}

const (
	testNode   = "gpu-a"
	testDomain = "4b47fa0f-7dbc-474b-b521-fc3ffc6dc7df"
)

// podOption changes a daemon pod built by daemonPodOf.
type podOption func(*corev1.Pod)

// daemonPodOf is a Ready daemon pod of testDomain on testNode at ip, with a
// clique label, started an hour ago.
func daemonPodOf(name, ip string, opts ...podOption) corev1.Pod {
	started := metav1.NewTime(time.Now().Add(-time.Hour))
	p := corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: DefaultDriverNamespace, CreationTimestamp: started,
			Labels: map[string]string{ComputeDomainLabel: testDomain, CliqueLabel: "a4b1c2d3-uuid.1"},
		},
		Spec: corev1.PodSpec{NodeName: testNode},
		Status: corev1.PodStatus{
			Phase: corev1.PodRunning, PodIP: ip, StartTime: &started,
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}},
		},
	}
	for _, o := range opts {
		o(&p)
	}
	return p
}

// running is a Source started in the background with a channel reporter.
type running struct {
	findings chan monitors.Finding
	cancel   context.CancelFunc
	done     chan error
}

func start(t *testing.T, src *Source) *running {
	t.Helper()
	// The state gauge is the package's: a state left by an earlier test
	// must not satisfy this one's assertions.
	stateGauge.Reset()
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{findings: make(chan monitors.Finding, 100), cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- src.Run(ctx, func(f monitors.Finding) { r.findings <- f }) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-r.done:
			if err != nil {
				t.Errorf("Run returned %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Error("Run did not return after its context was cancelled")
		}
	})
	return r
}

// next waits for the next finding and strips its time.
func (r *running) next(g Gomega) monitors.Finding {
	var f monitors.Finding
	g.Eventually(r.findings, 5*time.Second).Should(Receive(&f))
	g.Expect(f.Time).NotTo(BeZero())
	f.Time = time.Time{}
	return f
}

// none checks that nothing was reported by the end of the tick that is
// running now: after two more ticks start, every report of earlier ticks has
// been made (a tick reports before the next one starts).
func (r *running) none(g Gomega, fk *fake) {
	n := fk.ticks()
	g.Eventually(fk.ticks, 5*time.Second).Should(BeNumerically(">=", n+2))
	g.Expect(r.findings).NotTo(Receive())
}

// Expected findings.
var (
	daemonFinding = func(code, msg string) monitors.Finding {
		return monitors.Finding{
			Source: gpuhealthv1alpha1.SourceIMEX, Check: gpuhealthv1alpha1.CheckIMEXDaemon,
			Component: gpuhealthv1alpha1.Component{Kind: gpuhealthv1alpha1.ComponentIMEX, ID: "daemon"},
			Code:      code, Severity: gpuhealthv1alpha1.SeverityDegraded, Action: gpuhealthv1alpha1.ActionRecertify,
			Message: msg,
		}
	}
	domainFinding = func(code string, sev gpuhealthv1alpha1.Severity, msg string) monitors.Finding {
		return monitors.Finding{
			Source: gpuhealthv1alpha1.SourceIMEX, Check: gpuhealthv1alpha1.CheckIMEXDomain,
			Component: gpuhealthv1alpha1.Component{Kind: gpuhealthv1alpha1.ComponentIMEX, ID: "domain"},
			Code:      code, Severity: sev, Action: gpuhealthv1alpha1.ActionRecertify,
			Message: msg,
		}
	}
	resolved = func(f monitors.Finding, msg string) monitors.Finding {
		f.Resolved, f.Message = true, msg
		return f
	}
)

const (
	msgDown     = "IMEX domain is DOWN: 0 of 2 nodes ready (gpu-a UNAVAILABLE, gpu-b UNAVAILABLE)"
	msgDegraded = "IMEX domain is DEGRADED: 2 of 3 nodes ready (10.76.189.233 UNAVAILABLE)"
	msgUp       = "IMEX domain is UP: 2 of 2 nodes ready"
)

func TestSourceFirstFindings(t *testing.T) {
	cases := []struct {
		name      string
		daemonOut string
		daemonRC  int
		slowProbe string // "daemon" or "domain" sleeps past the timeout
		domainOut string
		domainRC  int
		want      []monitors.Finding
	}{
		{
			name:      "A READY daemon and an UP domain report nothing.",
			daemonOut: "READY\n", domainOut: domainUp,
		},
		{
			name:      "A daemon that is not READY is a degraded finding with its state.",
			daemonOut: "UNAVAILABLE\n", domainOut: domainUp,
			want: []monitors.Finding{daemonFinding("UNAVAILABLE", "IMEX daemon is UNAVAILABLE, not READY")},
		},
		{
			name:      "A daemon probe that exits non-zero without a state is EXEC_ERROR.",
			daemonOut: "", daemonRC: 1, domainOut: domainUp,
			want: []monitors.Finding{daemonFinding("EXEC_ERROR", "IMEX daemon probe failed: running nvidia-imex-ctl -q -c /imex/config.cfg: exit status 1")},
		},
		{
			name:      "A daemon probe that exits non-zero with a state reports the state.",
			daemonOut: "SHUTTING_DOWN\n", daemonRC: 3, domainOut: domainUp,
			want: []monitors.Finding{daemonFinding("SHUTTING_DOWN", "IMEX daemon is SHUTTING_DOWN (running nvidia-imex-ctl -q -c /imex/config.cfg: exit status 3)")},
		},
		{
			name:      "A daemon probe that does not answer is TIMEOUT.",
			slowProbe: "daemon", domainOut: domainUp,
			want: []monitors.Finding{daemonFinding("TIMEOUT", "nvidia-imex-ctl -q -c /imex/config.cfg did not answer within 1s")},
		},
		{
			name:      "A DOWN domain is a fatal finding.",
			daemonOut: "READY\n", domainOut: domainDown,
			want: []monitors.Finding{domainFinding("DOWN", gpuhealthv1alpha1.SeverityFatal, msgDown)},
		},
		{
			name:      "A DEGRADED domain is a degraded finding.",
			daemonOut: "READY\n", domainOut: domainDegraded,
			want: []monitors.Finding{domainFinding("DEGRADED", gpuhealthv1alpha1.SeverityDegraded, msgDegraded)},
		},
		{
			name:      "A daemon down and a domain down are two findings.",
			daemonOut: "UNAVAILABLE\n", domainOut: domainDown,
			want: []monitors.Finding{
				daemonFinding("UNAVAILABLE", "IMEX daemon is UNAVAILABLE, not READY"),
				domainFinding("DOWN", gpuhealthv1alpha1.SeverityFatal, msgDown),
			},
		},
		{
			name:      "Malformed output of both probes reports nothing.",
			daemonOut: "READY READY\n", domainOut: `{"nodes":{"0":{"status":"READY"`,
		},
		{
			name:      "A domain probe that fails reports nothing about the domain.",
			daemonOut: "READY\n", domainOut: domainDown, domainRC: 255,
		},
		{
			name:      "A domain probe that does not answer reports nothing about the domain.",
			daemonOut: "READY\n", slowProbe: "domain",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			fk := newFake(t)
			fk.daemon(t, tc.daemonOut, tc.daemonRC)
			fk.domain(t, tc.domainOut, tc.domainRC)
			if tc.slowProbe != "" {
				fk.write(t, tc.slowProbe+".sleep", "5")
			}
			src := fk.source()
			if tc.slowProbe != "" {
				// Past this the sleeping probe is cut off; a probe that does
				// not sleep answers well within it even on a loaded machine.
				src.Timeout = time.Second
			}
			r := start(t, src)
			for _, want := range tc.want {
				g.Expect(r.next(g)).To(Equal(want))
			}
			r.none(g, fk)
		})
	}
}

func TestSourceWithoutComputeDomainRunsNothing(t *testing.T) {
	g := NewWithT(t)
	fk := newFake(t)
	fk.setLabels(map[string]string{"kubernetes.io/hostname": "gpu-a"})
	fk.domain(t, domainDown, 0)
	r := start(t, fk.source())
	r.none(g, fk)
	g.Expect(fk.calls()).To(BeEmpty())
}

func TestSourceLabelReadFailureChangesNothing(t *testing.T) {
	g := NewWithT(t)
	fk := newFake(t)
	fk.domain(t, domainDown, 0)
	r := start(t, fk.source())
	g.Expect(r.next(g)).To(Equal(domainFinding("DOWN", gpuhealthv1alpha1.SeverityFatal, msgDown)))

	// The label read fails: no probe runs and the finding is not resolved.
	fk.mu.Lock()
	fk.labelsError = errors.New("apiserver unavailable")
	fk.mu.Unlock()
	n := fk.ticks()
	g.Eventually(fk.ticks, 5*time.Second).Should(BeNumerically(">=", n+1))
	calls := len(fk.calls())
	r.none(g, fk)
	g.Expect(fk.calls()).To(HaveLen(calls))
}

func TestSourceLifecycle(t *testing.T) {
	g := NewWithT(t)
	fk := newFake(t)
	r := start(t, fk.source())

	// READY and UP: the probes run and report nothing.
	g.Eventually(fk.calls, 5*time.Second).Should(ContainElements("-q -c "+testConfig, "-N -j -c "+testConfig))
	r.none(g, fk)

	// The domain goes DOWN: one fatal finding, not repeated while it lasts.
	fk.domain(t, domainDown, 0)
	down := domainFinding("DOWN", gpuhealthv1alpha1.SeverityFatal, msgDown)
	g.Expect(r.next(g)).To(Equal(down))
	r.none(g, fk)

	// DOWN becomes DEGRADED: the DOWN finding resolves and DEGRADED is raised.
	fk.domain(t, domainDegraded, 0)
	g.Expect(r.next(g)).To(Equal(resolved(down, "now DEGRADED")))
	degraded := domainFinding("DEGRADED", gpuhealthv1alpha1.SeverityDegraded, msgDegraded)
	g.Expect(r.next(g)).To(Equal(degraded))

	// Back UP: DEGRADED resolves once.
	fk.domain(t, domainUp, 0)
	g.Expect(r.next(g)).To(Equal(resolved(degraded, msgUp)))
	r.none(g, fk)

	// The daemon probe fails, then the daemon is READY again.
	fk.daemon(t, "", 1)
	execErr := daemonFinding("EXEC_ERROR", "IMEX daemon probe failed: running nvidia-imex-ctl -q -c /imex/config.cfg: exit status 1")
	g.Expect(r.next(g)).To(Equal(execErr))
	fk.daemon(t, "READY\n", 0)
	g.Expect(r.next(g)).To(Equal(resolved(execErr, "IMEX daemon is READY")))
	r.none(g, fk)

	// DOWN again, then the node leaves its ComputeDomain: the finding
	// resolves and the probes stop.
	fk.domain(t, domainDown, 0)
	g.Expect(r.next(g)).To(Equal(down))
	fk.setLabels(map[string]string{})
	g.Expect(r.next(g)).To(Equal(resolved(down, "node left its ComputeDomain")))
	calls := len(fk.calls())
	r.none(g, fk)
	g.Expect(fk.calls()).To(HaveLen(calls))

	// The node joins again while the domain is still DOWN: raised again.
	fk.setLabels(map[string]string{ComputeDomainLabel: "second"})
	g.Expect(r.next(g)).To(Equal(down))
}

func TestSourceRepeatsALastingCondition(t *testing.T) {
	g := NewWithT(t)
	fk := newFake(t)
	fk.domain(t, domainDown, 0)
	clk := clocktesting.NewFakePassiveClock(time.Date(2026, 11, 5, 10, 0, 0, 0, time.UTC))
	src := fk.source()
	src.Clock = clk
	src.RepeatInterval = 5 * time.Minute
	r := start(t, src)

	var f monitors.Finding
	g.Eventually(r.findings, 5*time.Second).Should(Receive(&f))
	g.Expect(f.Code).To(Equal("DOWN"))
	g.Expect(f.Time).To(Equal(clk.Now()))

	// Ticks within the repeat interval report nothing.
	clk.SetTime(clk.Now().Add(4 * time.Minute))
	r.none(g, fk)

	// Past it, the same finding is reported again with the new time.
	clk.SetTime(clk.Now().Add(time.Minute))
	g.Eventually(r.findings, 5*time.Second).Should(Receive(&f))
	g.Expect(f.Code).To(Equal("DOWN"))
	g.Expect(f.Resolved).To(BeFalse())
	g.Expect(f.Time).To(Equal(clk.Now()))
	r.none(g, fk)
}

func TestSourceArguments(t *testing.T) {
	cases := []struct {
		name      string
		configure func(*Source)
		want      []string
	}{
		{
			name:      "A host-managed daemon's config file is used by both probes.",
			configure: func(*Source) {},
			want:      []string{"-q -c /imex/config.cfg", "-N -j -c /imex/config.cfg"},
		},
		{
			name:      "A host-managed daemon's address is asked for the daemon only: -N cannot take -i.",
			configure: func(s *Source) { s.ConfigFile, s.Address = "", "10.0.0.7" },
			want:      []string{"-q -i 10.0.0.7 50005"},
		},
		{
			name:      "A configured port goes with the address.",
			configure: func(s *Source) { s.ConfigFile, s.Address, s.Port = "", "fd00::7", 50006 },
			want:      []string{"-q -i fd00::7 50006"},
		},
		{
			name: "A daemon pod is asked at its IP on the command port, for the daemon only.",
			configure: func(s *Source) {
				pods := &fakePods{}
				pods.set(nil, daemonPodOf("cd-daemon-a", "10.244.1.5"))
				s.ConfigFile, s.NodeName, s.Pods = "", testNode, pods
			},
			want: []string{"-q -i 10.244.1.5 50005"},
		},
		{
			name: "A daemon pod wins over a host-managed daemon.",
			configure: func(s *Source) {
				pods := &fakePods{}
				pods.set(nil, daemonPodOf("cd-daemon-a", "10.244.1.5"))
				s.NodeName, s.Pods = testNode, pods
			},
			want: []string{"-q -i 10.244.1.5 50005"},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			fk := newFake(t)
			src := fk.source()
			tc.configure(src)
			r := start(t, src)
			g.Eventually(fk.calls, 5*time.Second).Should(ContainElements(tc.want))
			r.none(g, fk)
			// Only these argument lists, every tick.
			g.Expect(fk.calls()).To(HaveEach(BeElementOf(tc.want)))
		})
	}
}

func TestSourceCountsRuns(t *testing.T) {
	g := NewWithT(t)
	ok0 := testutil.ToFloat64(runs.WithLabelValues(resultOK))
	malformed0 := testutil.ToFloat64(runs.WithLabelValues(resultMalformed))
	error0 := testutil.ToFloat64(runs.WithLabelValues(resultError))

	fk := newFake(t)
	fk.daemon(t, "READY\n", 0)
	fk.domain(t, "garbage", 0)
	r := start(t, fk.source())
	g.Eventually(func() float64 { return testutil.ToFloat64(runs.WithLabelValues(resultMalformed)) - malformed0 }, 5*time.Second).
		Should(BeNumerically(">=", 1))
	g.Expect(testutil.ToFloat64(runs.WithLabelValues(resultOK)) - ok0).To(BeNumerically(">=", 1))

	fk.domain(t, domainUp, 255)
	g.Eventually(func() float64 { return testutil.ToFloat64(runs.WithLabelValues(resultError)) - error0 }, 5*time.Second).
		Should(BeNumerically(">=", 1))
	r.none(g, fk)
}

func TestSourceStartErrors(t *testing.T) {
	cases := []struct {
		name        string
		src         *Source
		unavailable bool
	}{
		{
			name: "A missing nvidia-imex-ctl makes the source unavailable.",
			src: &Source{
				Command:    filepath.Join(t.TempDir(), "nvidia-imex-ctl"),
				NodeLabels: func(context.Context) (map[string]string, error) { return nil, nil },
			},
			unavailable: true,
		},
		{
			name: "A command name not in PATH makes the source unavailable.",
			src: &Source{
				Command:    "nvidia-imex-ctl-not-installed",
				NodeLabels: func(context.Context) (map[string]string, error) { return nil, nil },
			},
			unavailable: true,
		},
		{
			name: "A source without NodeLabels does not start.",
			src:  &Source{Command: "/bin/sh"},
		},
		{
			name: "A source with Pods but no NodeName does not start.",
			src: &Source{
				Command: "/bin/sh", Pods: &fakePods{},
				NodeLabels: func(context.Context) (map[string]string, error) { return nil, nil },
			},
		},
		{
			name: "A source with both an address and a config file does not start.",
			src: &Source{
				Command: "/bin/sh", Address: "10.0.0.1", ConfigFile: testConfig,
				NodeLabels: func(context.Context) (map[string]string, error) { return nil, nil },
			},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			err := tc.src.Run(context.Background(), func(monitors.Finding) {})
			g.Expect(err).To(HaveOccurred())
			if tc.unavailable {
				g.Expect(err).To(MatchError(monitors.ErrUnavailable))
			} else {
				g.Expect(err).NotTo(MatchError(monitors.ErrUnavailable))
			}
			g.Expect(tc.src.Name()).To(Equal("imex"))
		})
	}
}
