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
	clocktesting "k8s.io/utils/clock/testing"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/monitors"
)

// fakeCtl is a stand-in for nvidia-imex-ctl: a shell script that logs its
// arguments to "calls" and prints what the test put in daemon.out or
// domain.out, exiting with daemon.rc or domain.rc, after sleeping
// daemon.sleep or domain.sleep seconds when those files exist.
const fakeCtl = `#!/bin/sh
d=$(dirname "$0")
echo "$*" >> "$d/calls"
case "$1" in
-q) f=daemon ;;
*) f=domain ;;
esac
if [ -f "$d/$f.sleep" ]; then exec sleep "$(cat "$d/$f.sleep")"; fi
cat "$d/$f.out"
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
	fk := &fake{dir: t.TempDir(), labels: map[string]string{ComputeDomainLabel: "4b47fa0f-7dbc-474b-b521-fc3ffc6dc7df"}}
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

func (fk *fake) source() *Source {
	return &Source{
		Command:        fk.path(),
		Interval:       20 * time.Millisecond,
		Timeout:        2 * time.Second,
		RepeatInterval: time.Hour,
		NodeLabels:     fk.nodeLabels,
	}
}

// running is a Source started in the background with a channel reporter.
type running struct {
	findings chan monitors.Finding
	cancel   context.CancelFunc
	done     chan error
}

func start(t *testing.T, src *Source) *running {
	t.Helper()
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
			want: []monitors.Finding{daemonFinding("EXEC_ERROR", "IMEX daemon probe failed: running nvidia-imex-ctl -q: exit status 1")},
		},
		{
			name:      "A daemon probe that exits non-zero with a state reports the state.",
			daemonOut: "SHUTTING_DOWN\n", daemonRC: 3, domainOut: domainUp,
			want: []monitors.Finding{daemonFinding("SHUTTING_DOWN", "IMEX daemon is SHUTTING_DOWN (running nvidia-imex-ctl -q: exit status 3)")},
		},
		{
			name:      "A daemon probe that does not answer is TIMEOUT.",
			slowProbe: "daemon", domainOut: domainUp,
			want: []monitors.Finding{daemonFinding("TIMEOUT", "nvidia-imex-ctl -q did not answer within 200ms")},
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
			daemonOut: "Failed to read node configuration file\n", domainOut: `{"nodes":{"0":{"status":"READY"`,
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
			src.Timeout = 200 * time.Millisecond
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
	g.Eventually(fk.calls, 5*time.Second).Should(ContainElements("-q", "-N -j"))
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
	execErr := daemonFinding("EXEC_ERROR", "IMEX daemon probe failed: running nvidia-imex-ctl -q: exit status 1")
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
		name       string
		configure  func(*Source)
		wantDaemon string
		wantDomain string
	}{
		{
			name:       "The default probes are -q and -N -j.",
			configure:  func(*Source) {},
			wantDaemon: "-q", wantDomain: "-N -j",
		},
		{
			name:       "An address targets the daemon's command port on both probes.",
			configure:  func(s *Source) { s.Address = "10.0.0.7" },
			wantDaemon: "-q -i 10.0.0.7 50005", wantDomain: "-N -j -i 10.0.0.7 50005",
		},
		{
			name: "Configured arguments and port replace the defaults.",
			configure: func(s *Source) {
				s.DomainArgs = []string{"-N", "-j", "-H", "-c", "/imexd/imexd.cfg"}
				s.Address, s.Port = "10.0.0.8", 50006
			},
			wantDaemon: "-q -i 10.0.0.8 50006", wantDomain: "-N -j -H -c /imexd/imexd.cfg -i 10.0.0.8 50006",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			fk := newFake(t)
			src := fk.source()
			tc.configure(src)
			// The fake script picks its output by the first argument.
			start(t, src)
			g.Eventually(fk.calls, 5*time.Second).Should(ContainElements(tc.wantDaemon, tc.wantDomain))
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
