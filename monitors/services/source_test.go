package services

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	. "github.com/onsi/gomega"
	clocktesting "k8s.io/utils/clock/testing"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/monitors"
)

var t0 = time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)

// recorder collects reported findings.
type recorder struct {
	mu       sync.Mutex
	findings []monitors.Finding
}

func (r *recorder) report(f monitors.Finding) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.findings = append(r.findings, f)
}

// take returns the findings reported since the last take.
func (r *recorder) take() []monitors.Finding {
	r.mu.Lock()
	defer r.mu.Unlock()
	f := r.findings
	r.findings = nil
	return f
}

// fabricFinding is Fabric Manager's finding with code and message.
func fabricFinding(code, msg string, at time.Time) monitors.Finding {
	return monitors.Finding{
		Source:    gpuhealthv1alpha1.SourceServices,
		Check:     gpuhealthv1alpha1.CheckFabric,
		Component: gpuhealthv1alpha1.Component{Kind: gpuhealthv1alpha1.ComponentService, ID: FabricManager},
		Code:      code,
		Severity:  gpuhealthv1alpha1.SeverityFatal,
		Action:    gpuhealthv1alpha1.ActionRebootNode,
		Message:   msg,
		Time:      at,
	}
}

// serviceFinding is another service's finding.
func serviceFinding(unit, code, msg string, at time.Time) monitors.Finding {
	return monitors.Finding{
		Source:    gpuhealthv1alpha1.SourceServices,
		Check:     gpuhealthv1alpha1.CheckService,
		Component: gpuhealthv1alpha1.Component{Kind: gpuhealthv1alpha1.ComponentService, ID: unit},
		Code:      code,
		Severity:  gpuhealthv1alpha1.SeverityDegraded,
		Action:    gpuhealthv1alpha1.ActionNone,
		Message:   msg,
		Time:      at,
	}
}

func resolved(f monitors.Finding, at time.Time) monitors.Finding {
	f.Resolved, f.Time = true, at
	return f
}

func TestScanFindings(t *testing.T) {
	cases := []struct {
		name  string
		setup func(h *host)
		// want builds the findings of one scan at t0 (Grace off).
		want func(h *host) []monitors.Finding
	}{
		{
			name: "Fabric Manager running on an NVSwitch system is no finding",
			setup: func(h *host) {
				h.hgx(8, 4)
				h.install("nv-fabricmanager")
				h.start(2100, "nv-fabricmanage", 900)
			},
		},
		{
			name: "Fabric Manager missing on an NVSwitch system is a fatal fabric finding",
			setup: func(h *host) {
				h.hgx(8, 4)
				h.install("nv-fabricmanager")
			},
			want: func(h *host) []monitors.Finding {
				return []monitors.Finding{fabricFinding(CodeFabricManagerNotRunning,
					"no nv-fabricmanager process in "+h.proc+" for 0s; 4 NVSwitches on the PCI bus", t0)}
			},
		},
		{
			name:  "Fabric Manager not even installed on an NVSwitch system is the same finding",
			setup: func(h *host) { h.hgx(8, 6) },
			want: func(h *host) []monitors.Finding {
				return []monitors.Finding{fabricFinding(CodeFabricManagerNotRunning,
					"no nv-fabricmanager process in "+h.proc+" for 0s; 6 NVSwitches on the PCI bus", t0)}
			},
		},
		{
			name: "Fabric Manager missing without NVSwitches is no finding",
			setup: func(h *host) {
				h.hgx(8, 0)
				h.install("nv-fabricmanager")
			},
		},
		{
			name: "a zombie Fabric Manager does not run",
			setup: func(h *host) {
				h.hgx(8, 4)
				h.process(2100, "nv-fabricmanage", 'Z', 900)
			},
			want: func(h *host) []monitors.Finding {
				return []monitors.Finding{fabricFinding(CodeFabricManagerNotRunning,
					"no nv-fabricmanager process in "+h.proc+" for 0s; 4 NVSwitches on the PCI bus", t0)}
			},
		},
		{
			name: "a process whose untruncated name is the binary's is not the kernel's comm",
			setup: func(h *host) {
				h.hgx(8, 4)
				h.start(2100, "nv-fabricmanager", 900)
			},
			want: func(h *host) []monitors.Finding {
				return []monitors.Finding{fabricFinding(CodeFabricManagerNotRunning,
					"no nv-fabricmanager process in "+h.proc+" for 0s; 4 NVSwitches on the PCI bus", t0)}
			},
		},
		{
			name:  "the persistence daemon installed and not running is a degraded service finding",
			setup: func(h *host) { h.install("nvidia-persistenced") },
			want: func(h *host) []monitors.Finding {
				return []monitors.Finding{serviceFinding(Persistenced, CodeNotRunning,
					"no nvidia-persistenced process in "+h.proc+" for 0s; "+filepath.Join(h.bin, "nvidia-persistenced")+" is installed", t0)}
			},
		},
		{
			name:  "the persistence daemon not installed is no finding",
			setup: func(*host) {},
		},
		{
			name: "the persistence daemon of a driver container runs without a binary in the host's /usr/bin",
			setup: func(h *host) {
				h.start(880, "nvidia-persiste", 400)
			},
		},
		{
			name: "a host IMEX daemon installed and configured but not running is a degraded service finding",
			setup: func(h *host) {
				h.install("nvidia-imex")
				h.configureIMEX()
				h.start(990, "nvidia-imex-ctl", 500) // another program
			},
			want: func(h *host) []monitors.Finding {
				return []monitors.Finding{serviceFinding(IMEX, CodeNotRunning,
					"no nvidia-imex process in "+h.proc+" for 0s; "+filepath.Join(h.bin, "nvidia-imex")+" is installed and "+h.imexNodes+" configures it", t0)}
			},
		},
		{
			name:  "a host IMEX daemon installed but not configured is no finding",
			setup: func(h *host) { h.install("nvidia-imex") },
		},
		{
			name:  "IMEX configured but not installed is no finding",
			setup: func(h *host) { h.configureIMEX() },
		},
		{
			name: "every service running is no finding",
			setup: func(h *host) {
				h.hgx(8, 4)
				for _, b := range []string{"nv-fabricmanager", "nvidia-persistenced", "nvidia-imex"} {
					h.install(b)
				}
				h.configureIMEX()
				h.start(2100, "nv-fabricmanage", 900)
				h.start(880, "nvidia-persiste", 400)
				h.start(990, "nvidia-imex", 500)
			},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			h := newHost(t)
			tc.setup(h)
			src := h.source()
			src.Grace = -1
			src.Clock = clocktesting.NewFakeClock(t0)
			var rec recorder
			g.Expect(src.newScanner(logr.Discard()).scan(rec.report)).To(Succeed())
			var want []monitors.Finding
			if tc.want != nil {
				want = tc.want(h)
			}
			g.Expect(rec.take()).To(Equal(want))
		})
	}
}

func TestFabricManagerGraceAndResolution(t *testing.T) {
	g := NewWithT(t)
	h := newHost(t)
	h.hgx(8, 4)
	h.install("nv-fabricmanager")
	clk := clocktesting.NewFakeClock(t0)
	src := h.source()
	src.Clock = clk
	sc := src.newScanner(logr.Discard())
	var rec recorder

	// Not running at the first scan: within Grace, nothing yet.
	g.Expect(sc.scan(rec.report)).To(Succeed())
	g.Expect(rec.take()).To(BeEmpty())
	clk.Step(30 * time.Second)
	g.Expect(sc.scan(rec.report)).To(Succeed())
	g.Expect(rec.take()).To(BeEmpty())

	// Down for Grace: reported.
	clk.Step(30 * time.Second)
	g.Expect(sc.scan(rec.report)).To(Succeed())
	down := fabricFinding(CodeFabricManagerNotRunning, "no nv-fabricmanager process in "+h.proc+" for 1m0s; 4 NVSwitches on the PCI bus", t0.Add(time.Minute))
	g.Expect(rec.take()).To(Equal([]monitors.Finding{down}))

	// Still down: not reported again before monitors.DefaultRepeat.
	clk.Step(30 * time.Second)
	g.Expect(sc.scan(rec.report)).To(Succeed())
	g.Expect(rec.take()).To(BeEmpty())

	// Running again: resolved.
	h.start(2100, "nv-fabricmanage", 9000)
	clk.Step(30 * time.Second)
	g.Expect(sc.scan(rec.report)).To(Succeed())
	g.Expect(rec.take()).To(Equal([]monitors.Finding{resolved(down, t0.Add(2*time.Minute))}))

	g.Expect(src.Status()[0]).To(Equal(ServiceStatus{
		Name: FabricManager, Installed: true, Required: true, Running: true, PID: 2100, Starts: 1,
		Since: time.Unix(testBoot+90, 0),
	}))
}

func TestFabricManagerRestarting(t *testing.T) {
	g := NewWithT(t)
	h := newHost(t)
	h.hgx(8, 4)
	h.install("nv-fabricmanager")
	h.start(2100, "nv-fabricmanage", 900)
	clk := clocktesting.NewFakeClock(t0)
	src := h.source()
	src.Clock = clk
	src.Repeat = time.Hour // no repeats to step over
	sc := src.newScanner(logr.Discard())
	var rec recorder
	scanAt := func(d time.Duration) []monitors.Finding {
		t.Helper()
		clk.SetTime(t0.Add(d))
		g.Expect(sc.scan(rec.report)).To(Succeed())
		return rec.take()
	}
	starts := func() int { return src.Status()[0].Starts }

	// Running when the agent starts: not a start it saw.
	g.Expect(scanAt(0)).To(BeEmpty())
	g.Expect(starts()).To(Equal(0))

	// A new process: start 1.
	h.stop(2100)
	h.start(2200, "nv-fabricmanage", 4000)
	g.Expect(scanAt(30 * time.Second)).To(BeEmpty())
	g.Expect(starts()).To(Equal(1))

	// Gone for one scan (within Grace), then back: start 2.
	h.stop(2200)
	g.Expect(scanAt(60 * time.Second)).To(BeEmpty())
	h.start(2300, "nv-fabricmanage", 10000)
	g.Expect(scanAt(90 * time.Second)).To(BeEmpty())
	g.Expect(starts()).To(Equal(2))

	// The pid reused by a new process (another start time): start 3,
	// restarting.
	h.stop(2300)
	h.start(2300, "nv-fabricmanage", 13000)
	restarting := fabricFinding(CodeFabricManagerRestarting,
		"nv-fabricmanager started 3 times within 10m0s, 3 or more is restarting; 4 NVSwitches on the PCI bus", t0.Add(2*time.Minute))
	g.Expect(scanAt(2 * time.Minute)).To(Equal([]monitors.Finding{restarting}))

	// Stable since: the first start leaves the window 10m after it was
	// seen, and the condition resolves.
	g.Expect(scanAt(10 * time.Minute)).To(BeEmpty())
	g.Expect(starts()).To(Equal(3))
	g.Expect(scanAt(10*time.Minute + 30*time.Second)).To(Equal([]monitors.Finding{resolved(restarting, t0.Add(10*time.Minute+30*time.Second))}))
	g.Expect(starts()).To(Equal(2))
}

func TestPersistencedRestarting(t *testing.T) {
	g := NewWithT(t)
	h := newHost(t)
	h.install("nvidia-persistenced")
	h.start(880, "nvidia-persiste", 400)
	clk := clocktesting.NewFakeClock(t0)
	src := h.source()
	src.Clock, src.MaxRestarts, src.Window = clk, 2, 5*time.Minute
	sc := src.newScanner(logr.Discard())
	var rec recorder

	g.Expect(sc.scan(rec.report)).To(Succeed())
	for i, pid := range []int{881, 882} {
		h.stop(pid - 1)
		h.start(pid, "nvidia-persiste", uint64(500+i))
		clk.Step(30 * time.Second)
		g.Expect(sc.scan(rec.report)).To(Succeed())
	}
	g.Expect(rec.take()).To(Equal([]monitors.Finding{serviceFinding(Persistenced, CodeRestarting,
		"nvidia-persistenced started 2 times within 5m0s, 2 or more is restarting; "+filepath.Join(h.bin, "nvidia-persistenced")+" is installed", t0.Add(time.Minute))}))
}

func TestStatusAndDevices(t *testing.T) {
	g := NewWithT(t)
	h := newHost(t)
	h.hgx(2, 1)
	h.install("nv-fabricmanager")
	h.install("nvidia-imex")
	// The daemon and a child it forked later.
	h.start(2100, "nv-fabricmanage", 900)
	h.start(2150, "nv-fabricmanage", 1500)
	src := h.source()
	src.Clock = clocktesting.NewFakeClock(t0)
	g.Expect(src.Status()).To(BeNil())

	g.Expect(src.newScanner(logr.Discard()).scan(func(monitors.Finding) {})).To(Succeed())
	g.Expect(src.Status()).To(Equal([]ServiceStatus{
		{Name: FabricManager, Installed: true, Required: true, Running: true, PID: 2100, Since: time.Unix(testBoot+9, 0)},
		{Name: Persistenced, Since: t0},
		{Name: IMEX, Installed: true, Since: t0},
	}))
	g.Expect(src.Devices()).To(Equal(PCI{GPUs: []string{"0000:18:00.0", "0000:28:00.0"}, NVSwitches: []string{"0000:05:00.0"}}))
}

func TestNVSwitchSystemOutlivesTheBus(t *testing.T) {
	g := NewWithT(t)
	h := newHost(t)
	h.hgx(8, 4)
	clk := clocktesting.NewFakeClock(t0)
	src := h.source()
	src.Clock, src.Grace = clk, -1
	sc := src.newScanner(logr.Discard())
	var rec recorder
	g.Expect(sc.scan(rec.report)).To(Succeed())
	g.Expect(rec.take()).To(HaveLen(1))

	// sysfs gone: the node is still an NVSwitch system, and the condition
	// stays open.
	g.Expect(os.RemoveAll(h.sys)).To(Succeed())
	clk.Step(time.Minute)
	g.Expect(sc.scan(rec.report)).To(Succeed())
	g.Expect(rec.take()).To(BeEmpty())
	g.Expect(src.Devices()).To(Equal(PCI{}))
	g.Expect(src.Status()[0].Required).To(BeTrue())
}

func TestRunUnavailable(t *testing.T) {
	cases := []struct {
		name  string
		setup func(h *host) string
		want  string
	}{
		{
			name:  "host /proc not mounted",
			setup: func(h *host) string { return filepath.Join(h.proc, "missing") },
			want:  "host /proc not mounted at ",
		},
		{
			name: "an empty directory where /proc should be",
			setup: func(h *host) string {
				dir := filepath.Join(h.proc, "empty")
				h.mkdir(dir)
				return dir
			},
			want: "it lists no processes",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			h := newHost(t)
			src := h.source()
			src.ProcRoot = tc.setup(h)
			err := src.Run(context.Background(), func(monitors.Finding) { t.Fatal("reported a finding") })
			g.Expect(errors.Is(err, monitors.ErrUnavailable)).To(BeTrue(), "%v", err)
			g.Expect(err.Error()).To(ContainSubstring(tc.want))
			g.Expect(err.Error()).To(ContainSubstring(src.ProcRoot))
		})
	}
}

func TestRun(t *testing.T) {
	g := NewWithT(t)
	h := newHost(t)
	h.hgx(8, 4)
	clk := clocktesting.NewFakeClock(t0)
	src := h.source()
	src.Clock, src.Grace = clk, -1
	g.Expect(src.Name()).To(Equal("services"))
	found := make(chan monitors.Finding, 10)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- src.Run(ctx, func(f monitors.Finding) { found <- f }) }()

	down := fabricFinding(CodeFabricManagerNotRunning, "no nv-fabricmanager process in "+h.proc+" for 0s; 4 NVSwitches on the PCI bus", t0)
	g.Eventually(found).Should(Receive(Equal(down)))

	// Fabric Manager starts; the next tick resolves the finding.
	h.start(2100, "nv-fabricmanage", 900)
	g.Eventually(clk.HasWaiters).Should(BeTrue())
	clk.Step(DefaultInterval)
	g.Eventually(found).Should(Receive(Equal(resolved(down, t0.Add(DefaultInterval)))))

	cancel()
	g.Eventually(done).Should(Receive(BeNil()))
	g.Expect(found).NotTo(Receive())
}
