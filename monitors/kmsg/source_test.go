package kmsg

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus/testutil"
	clocktesting "k8s.io/utils/clock/testing"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/monitors"
)

// Fixture records, in /dev/kmsg's format.
const (
	lineBoot     = "6,1,0,-;Linux version 6.8.0 (buildd@lcy02) #1 SMP"
	lineXID79    = "3,2,5000000,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus."
	lineOther    = "6,3,5000100,-;e1000e 0000:00:1f.6 eno1: NIC Link is Up 1000 Mbps Full Duplex"
	lineXID48    = "3,4,6000000,-;NVRM: Xid (PCI:0000:86:00): 48, pid=99, name=train, An uncorrectable double bit error"
	lineSXid     = "3,5,7000000,-;nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 20034, Fatal, Link 30 LTSSM Fault Up"
	lineSXidOK   = "4,6,7000001,-;nvidia-nvswitch2: SXid (PCI:0000:07:00.0): 12028, Non-fatal, Link 58 egress non-posted PRIV error (First)"
	lineMalform  = "3,7,7000002,-;NVRM: Xid (PCI:0000:3b:00): abc, GPU has fallen off the bus."
	lineContinue = " SUBSYSTEM=pci"
	// lineForged is an XID line a process wrote to /dev/kmsg: the kernel
	// gave it facility 1 (LOG_USER), priority 1*8+3.
	lineForged = "11,8,7000003,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus."
	// lineQuoted carries the XID marker in the middle of another line.
	lineQuoted = "6,9,7000004,-;audit: cmdline=\"logger NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.\""
)

// fixture is a kernel log file, boot id file and state directory for one test.
type fixture struct {
	dir     string
	logPath string
	bootID  string
	state   string
	uptime  string
}

func newFixture(t *testing.T, lines ...string) *fixture {
	t.Helper()
	dir := t.TempDir()
	fx := &fixture{
		dir:     dir,
		logPath: filepath.Join(dir, "kmsg"),
		bootID:  filepath.Join(dir, "boot_id"),
		state:   filepath.Join(dir, "state"),
		uptime:  filepath.Join(dir, "uptime"),
	}
	fx.setBootID(t, "5f0e9c1a-0d6b-4a53-9a43-6bd0c1b0f001")
	writeFile(t, fx.uptime, "1000.00 3900.00\n")
	writeFile(t, fx.logPath, "")
	fx.append(t, lines...)
	return fx
}

func (fx *fixture) setBootID(t *testing.T, id string) {
	t.Helper()
	writeFile(t, fx.bootID, id+"\n")
}

func (fx *fixture) append(t *testing.T, lines ...string) {
	t.Helper()
	f, err := os.OpenFile(fx.logPath, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, l := range lines {
		if _, err := f.WriteString(l + "\n"); err != nil {
			t.Fatal(err)
		}
	}
}

func (fx *fixture) source() *Source {
	return &Source{
		Path:          fx.logPath,
		StateDir:      fx.state,
		BootIDPath:    fx.bootID,
		UptimePath:    fx.uptime,
		PollInterval:  10 * time.Millisecond,
		FlushInterval: 10 * time.Millisecond,
	}
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
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
	t.Cleanup(func() { r.stop(t) })
	return r
}

// stop cancels the run and waits for Run to return nil.
func (r *running) stop(t *testing.T) {
	t.Helper()
	r.cancel()
	select {
	case err, ok := <-r.done:
		if ok {
			NewWithT(t).Expect(err).NotTo(HaveOccurred())
			close(r.done)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after its context was cancelled")
	}
}

// next waits for the next finding.
func (r *running) next(g Gomega) monitors.Finding {
	var f monitors.Finding
	g.Eventually(r.findings, 5*time.Second).Should(Receive(&f))
	return f
}

func TestSourceReportsFindings(t *testing.T) {
	cases := []struct {
		name     string
		existing []string
		appended []string
		resolver func(string) (string, bool)
		want     []monitors.Finding
	}{
		{
			name:     "An XID appended after start becomes a GPU finding that the pipeline classifies.",
			existing: []string{lineBoot},
			appended: []string{lineXID79},
			want: []monitors.Finding{{
				Source: gpuhealthv1alpha1.SourceKmsg, Check: gpuhealthv1alpha1.CheckXID,
				Component: gpuhealthv1alpha1.Component{Kind: gpuhealthv1alpha1.ComponentGPU, ID: "0000:3b:00.0"},
				Code:      "79", Message: "pid=1234, name=python, GPU has fallen off the bus.",
			}},
		},
		{
			name:     "The resolver turns a known GPU's bus id into its UUID and leaves an unknown one.",
			appended: []string{lineXID79, lineXID48},
			resolver: func(bus string) (string, bool) {
				if bus == "0000:3b:00.0" {
					return "GPU-8f6c2b1e-0000-4000-8000-000000000001", true
				}
				return "", false
			},
			want: []monitors.Finding{{
				Source: gpuhealthv1alpha1.SourceKmsg, Check: gpuhealthv1alpha1.CheckXID,
				Component: gpuhealthv1alpha1.Component{Kind: gpuhealthv1alpha1.ComponentGPU, ID: "GPU-8f6c2b1e-0000-4000-8000-000000000001"},
				Code:      "79", Message: "pid=1234, name=python, GPU has fallen off the bus.",
			}, {
				Source: gpuhealthv1alpha1.SourceKmsg, Check: gpuhealthv1alpha1.CheckXID,
				Component: gpuhealthv1alpha1.Component{Kind: gpuhealthv1alpha1.ComponentGPU, ID: "0000:86:00.0"},
				Code:      "48", Message: "pid=99, name=train, An uncorrectable double bit error",
			}},
		},
		{
			name:     "A fatal SXid reboots the node; a non-fatal one NVIDIA says stalls the port is recertified.",
			existing: []string{lineSXid},
			appended: []string{lineContinue, lineSXidOK},
			want: []monitors.Finding{{
				Source: gpuhealthv1alpha1.SourceKmsg, Check: gpuhealthv1alpha1.CheckSXID,
				Component: gpuhealthv1alpha1.Component{Kind: gpuhealthv1alpha1.ComponentNVSwitch, ID: "0000:05:00.0"},
				Code:      "20034", Severity: gpuhealthv1alpha1.SeverityFatal, Action: gpuhealthv1alpha1.ActionRebootNode,
				Message: "Link 30 LTSSM Fault Up (Fatal; " + sxidFatal.why + ")",
			}, {
				Source: gpuhealthv1alpha1.SourceKmsg, Check: gpuhealthv1alpha1.CheckSXID,
				Component: gpuhealthv1alpha1.Component{Kind: gpuhealthv1alpha1.ComponentNVSwitch, ID: "0000:07:00.0"},
				Code:      "12028", Severity: gpuhealthv1alpha1.SeverityDegraded, Action: gpuhealthv1alpha1.ActionRecertify,
				Message: "Link 58 egress non-posted PRIV error (First) (Non-fatal; " + sxidStall.why + ")",
			}},
		},
		{
			name:     "A MIG XID is about the GPU and names the instance.",
			appended: []string{"4,80,1,-;NVRM: Xid (PCI:0000:3b:00 GPU-I:01 GPU-CI:02): 13, pid=9, name=a, Graphics Exception"},
			want: []monitors.Finding{{
				Source: gpuhealthv1alpha1.SourceKmsg, Check: gpuhealthv1alpha1.CheckXID,
				Component: gpuhealthv1alpha1.Component{Kind: gpuhealthv1alpha1.ComponentGPU, ID: "0000:3b:00.0", Instance: "GPU-I:01 GPU-CI:02"},
				Code:      "13", Message: "MIG GPU-I:01 GPU-CI:02: pid=9, name=a, Graphics Exception",
			}},
		},
		{
			name:     "The GPU-lost text split over three records is one XID 79 on that GPU.",
			appended: append(append([]string{}, lostSplit...), lineXID48),
			want: []monitors.Finding{{
				Source: gpuhealthv1alpha1.SourceKmsg, Check: gpuhealthv1alpha1.CheckXID,
				Component: gpuhealthv1alpha1.Component{Kind: gpuhealthv1alpha1.ComponentGPU, ID: "0000:b3:00.0"},
				Code:      "79", Message: "NVRM: The NVIDIA GPU 0000:b3:00.0 (PCI ID: 10de:26b5) installed in this system has fallen off the bus and is not responding to commands.",
			}, {
				Source: gpuhealthv1alpha1.SourceKmsg, Check: gpuhealthv1alpha1.CheckXID,
				Component: gpuhealthv1alpha1.Component{Kind: gpuhealthv1alpha1.ComponentGPU, ID: "0000:86:00.0"},
				Code:      "48", Message: "pid=99, name=train, An uncorrectable double bit error",
			}},
		},
		{
			name:     "A correctable SXid is Info; an SOE halt without a flag reboots.",
			appended: []string{"6,81,1,-;nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 12028, Correctable, Link 32 egress non-posted PRIV error (First)", "3,82,1,-;nvidia-nvswitch0: SXid (PCI:0004:00:00.0): 26006, SOE HALTED"},
			want: []monitors.Finding{{
				Source: gpuhealthv1alpha1.SourceKmsg, Check: gpuhealthv1alpha1.CheckSXID,
				Component: gpuhealthv1alpha1.Component{Kind: gpuhealthv1alpha1.ComponentNVSwitch, ID: "0000:05:00.0"},
				Code:      "12028", Severity: gpuhealthv1alpha1.SeverityInfo, Action: gpuhealthv1alpha1.ActionNone,
				Message: "Link 32 egress non-posted PRIV error (First) (Correctable; correctable; the driver corrected it)",
			}, {
				Source: gpuhealthv1alpha1.SourceKmsg, Check: gpuhealthv1alpha1.CheckSXID,
				Component: gpuhealthv1alpha1.Component{Kind: gpuhealthv1alpha1.ComponentNVSwitch, ID: "0004:00:00.0"},
				Code:      "26006", Severity: gpuhealthv1alpha1.SeverityFatal, Action: gpuhealthv1alpha1.ActionRebootNode,
				Message: "SOE HALTED (no severity flag; " + sxidSOE.why + ")",
			}},
		},
		{
			name:     "An XID line a process wrote, or one quoted inside another line, is not reported.",
			existing: []string{lineForged, lineQuoted},
			appended: []string{lineForged, lineQuoted, lineXID48},
			want: []monitors.Finding{{
				Source: gpuhealthv1alpha1.SourceKmsg, Check: gpuhealthv1alpha1.CheckXID,
				Component: gpuhealthv1alpha1.Component{Kind: gpuhealthv1alpha1.ComponentGPU, ID: "0000:86:00.0"},
				Code:      "48", Message: "pid=99, name=train, An uncorrectable double bit error",
			}},
		},
		{
			name:     "Malformed and foreign lines between findings are skipped.",
			existing: []string{lineXID79, lineMalform, lineOther, "garbage"},
			appended: []string{lineXID48},
			want: []monitors.Finding{{
				Source: gpuhealthv1alpha1.SourceKmsg, Check: gpuhealthv1alpha1.CheckXID,
				Component: gpuhealthv1alpha1.Component{Kind: gpuhealthv1alpha1.ComponentGPU, ID: "0000:3b:00.0"},
				Code:      "79", Message: "pid=1234, name=python, GPU has fallen off the bus.",
			}, {
				Source: gpuhealthv1alpha1.SourceKmsg, Check: gpuhealthv1alpha1.CheckXID,
				Component: gpuhealthv1alpha1.Component{Kind: gpuhealthv1alpha1.ComponentGPU, ID: "0000:86:00.0"},
				Code:      "48", Message: "pid=99, name=train, An uncorrectable double bit error",
			}},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			fx := newFixture(t, tc.existing...)
			src := fx.source()
			src.Resolver = tc.resolver
			r := start(t, src)
			fx.append(t, tc.appended...)
			for _, want := range tc.want {
				got := r.next(g)
				g.Expect(got.Time).NotTo(BeZero())
				got.Time = time.Time{}
				g.Expect(got).To(Equal(want))
			}
		})
	}
}

func TestSourceCounts(t *testing.T) {
	g := NewWithT(t)
	finding0 := testutil.ToFloat64(lines.WithLabelValues(resultFinding))
	ignored0 := testutil.ToFloat64(lines.WithLabelValues(resultIgnored))
	malformed0 := testutil.ToFloat64(lines.WithLabelValues(resultMalformed))
	userspace0 := testutil.ToFloat64(lines.WithLabelValues(resultUserspace))

	fx := newFixture(t, lineBoot, lineMalform, "garbage", lineContinue, lineOther, lineForged, lineQuoted, lineXID79)
	r := start(t, fx.source())
	g.Expect(r.next(g).Code).To(Equal("79"))

	g.Expect(testutil.ToFloat64(lines.WithLabelValues(resultFinding)) - finding0).To(Equal(1.0))
	g.Expect(testutil.ToFloat64(lines.WithLabelValues(resultIgnored)) - ignored0).To(Equal(4.0))
	g.Expect(testutil.ToFloat64(lines.WithLabelValues(resultMalformed)) - malformed0).To(Equal(2.0))
	g.Expect(testutil.ToFloat64(lines.WithLabelValues(resultUserspace)) - userspace0).To(Equal(1.0))
}

func TestSourceCursor(t *testing.T) {
	const otherBoot = "a9d3e8f2-6c1b-4b7e-8f00-000000000002"
	cases := []struct {
		name string
		// reboot changes the boot id between the two runs.
		reboot bool
		// dropState deletes the cursor between the two runs.
		dropState bool
		// wantFirst is the code of the first finding of the second run.
		wantFirst string
	}{
		{name: "A restart in the same boot does not replay what the first run reported.", wantFirst: "48"},
		{name: "A restart after a reboot processes the whole buffer again.", reboot: true, wantFirst: "79"},
		{name: "A restart without a cursor processes the whole buffer again.", dropState: true, wantFirst: "79"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			fx := newFixture(t, lineBoot, lineXID79, lineOther)

			first := start(t, fx.source())
			g.Expect(first.next(g).Code).To(Equal("79"))
			// The cursor is saved while running, once the batch that held
			// the finding is processed (the batch may or may not include
			// the line after it).
			g.Eventually(func() (cursor, error) {
				c, _, err := loadCursor(fx.state)
				return c, err
			}).WithTimeout(5 * time.Second).Should(SatisfyAll(
				HaveField("BootID", "5f0e9c1a-0d6b-4a53-9a43-6bd0c1b0f001"),
				HaveField("Seq", BeNumerically(">=", 2)),
			))
			first.stop(t)

			if tc.reboot {
				fx.setBootID(t, otherBoot)
			}
			if tc.dropState {
				g.Expect(os.RemoveAll(fx.state)).To(Succeed())
			}
			fx.append(t, lineXID48)
			second := start(t, fx.source())
			// Records are processed in order, so the first finding tells
			// whether the old XID was replayed.
			g.Expect(second.next(g).Code).To(Equal(tc.wantFirst))
		})
	}
}

func TestSourceIgnoresABadCursor(t *testing.T) {
	g := NewWithT(t)
	fx := newFixture(t, lineXID79)
	g.Expect(os.MkdirAll(fx.state, 0o755)).To(Succeed())
	writeFile(t, filepath.Join(fx.state, cursorFile), "{not json")

	r := start(t, fx.source())
	g.Expect(r.next(g).Code).To(Equal("79"))
	r.stop(t)

	b, err := os.ReadFile(filepath.Join(fx.state, cursorFile))
	g.Expect(err).NotTo(HaveOccurred())
	var c cursor
	g.Expect(json.Unmarshal(b, &c)).To(Succeed())
	g.Expect(c).To(Equal(cursor{BootID: "5f0e9c1a-0d6b-4a53-9a43-6bd0c1b0f001", Seq: 2, Gen: 1}))
}

func TestSourceTime(t *testing.T) {
	cases := []struct {
		name   string
		uptime string
		line   string
		want   time.Duration // before the fake clock's now
	}{
		{
			name:   "A record's time is the boot time plus its kernel timestamp.",
			uptime: "1000.00 3900.00\n",
			line:   lineXID79, // 5 s after boot
			want:   995 * time.Second,
		},
		{
			name:   "A record stamped after the uptime is clamped to now.",
			uptime: "1.00 2.00\n",
			line:   lineXID79,
			want:   0,
		},
		{
			name:   "Without an uptime the time of reading is used.",
			uptime: "",
			line:   lineXID79,
			want:   0,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			now := time.Date(2026, 11, 5, 10, 0, 0, 0, time.UTC)
			fx := newFixture(t, tc.line)
			writeFile(t, fx.uptime, tc.uptime)
			src := fx.source()
			src.Clock = clocktesting.NewFakePassiveClock(now)
			r := start(t, src)
			g.Expect(r.next(g).Time).To(Equal(now.Add(-tc.want)))
		})
	}
}

func TestSourceFollowsTruncatedFile(t *testing.T) {
	g := NewWithT(t)
	fx := newFixture(t, lineBoot, lineOther)
	src := fx.source()
	src.StateDir = ""
	r := start(t, src)
	// Truncate, then write a shorter file: the reader starts over.
	writeFile(t, fx.logPath, lineXID79+"\n")
	g.Expect(r.next(g).Code).To(Equal("79"))
}

// TestSourceWithoutACursorSyncsBeforeSealing: with no state directory
// there is no cursor to save, but the counts reported so far are still
// synced before they are sealed, so the pipeline may publish them.
func TestSourceWithoutACursorSyncsBeforeSealing(t *testing.T) {
	g := NewWithT(t)
	fx := newFixture(t, lineXID79)
	src := fx.source()
	src.StateDir = ""
	var mu sync.Mutex
	var calls []string
	src.Sync = func(gen uint64) error {
		mu.Lock()
		defer mu.Unlock()
		calls = append(calls, fmt.Sprintf("sync %d", gen))
		return nil
	}
	src.Seal = func(gen uint64) {
		mu.Lock()
		defer mu.Unlock()
		calls = append(calls, fmt.Sprintf("seal %d", gen))
	}
	r := start(t, src)
	g.Expect(r.next(g).Code).To(Equal("79"))
	all := fmt.Sprint(^uint64(0))
	first := func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(calls[:min(2, len(calls))])
	}
	g.Eventually(first).Should(Equal([]string{"sync " + all, "seal " + all}), "Sync first, then Seal")
}

func TestSourceReadsAFIFO(t *testing.T) {
	g := NewWithT(t)
	fx := newFixture(t)
	fifo := filepath.Join(fx.dir, "fifo")
	g.Expect(syscall.Mkfifo(fifo, 0o600)).To(Succeed())
	src := fx.source()
	src.Path = fifo
	r := start(t, src)

	w, err := os.OpenFile(fifo, os.O_WRONLY, 0)
	g.Expect(err).NotTo(HaveOccurred())
	_, err = w.WriteString(lineSXid + "\n")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(r.next(g).Code).To(Equal("20034"))
	g.Expect(w.Close()).To(Succeed())
	// With no writer left, cancelling still ends Run (checked by stop).
}

func TestSourceUnavailable(t *testing.T) {
	g := NewWithT(t)
	src := &Source{Path: filepath.Join(t.TempDir(), "no-kmsg")}
	err := src.Run(context.Background(), func(monitors.Finding) {})
	g.Expect(err).To(MatchError(monitors.ErrUnavailable))
	g.Expect(src.Name()).To(Equal("kmsg"))
}

func TestSourceReadsDevKmsg(t *testing.T) {
	f, err := os.Open(DefaultPath)
	if err != nil {
		t.Skipf("cannot read %s here: %v", DefaultPath, err)
	}
	f.Close()
	g := NewWithT(t)
	total := func() float64 {
		return testutil.ToFloat64(lines.WithLabelValues(resultFinding)) +
			testutil.ToFloat64(lines.WithLabelValues(resultIgnored)) +
			testutil.ToFloat64(lines.WithLabelValues(resultMalformed)) +
			testutil.ToFloat64(lines.WithLabelValues(resultUserspace))
	}
	before := total()
	state := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	// Only reads: a test must not write fake XIDs into the host's kernel log.
	go func() { done <- (&Source{StateDir: state}).Run(ctx, func(monitors.Finding) {}) }()

	// The ring buffer always holds the boot messages.
	g.Eventually(total, 5*time.Second).Should(BeNumerically(">", before))
	cancel()
	g.Eventually(done, 5*time.Second).Should(Receive(BeNil()))

	bootID, err := readBootID(DefaultBootIDPath)
	g.Expect(err).NotTo(HaveOccurred())
	c, ok, err := loadCursor(state)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(ok).To(BeTrue())
	g.Expect(c.BootID).To(Equal(bootID))
}

func TestSourceSaysWhileItReads(t *testing.T) {
	g := NewWithT(t)
	fx := newFixture(t, lineXID79)
	var states []bool
	var mu sync.Mutex
	src := fx.source()
	src.Reading = func(b bool) { mu.Lock(); states = append(states, b); mu.Unlock() }
	r := start(t, src)
	g.Expect(r.next(g).Code).To(Equal("79"))
	r.stop(t)
	mu.Lock()
	defer mu.Unlock()
	g.Expect(states).To(Equal([]bool{true, false}))

	// A log that cannot be opened never says it reads.
	states = nil
	missing := fx.source()
	missing.Path = filepath.Join(fx.dir, "no-such-log")
	missing.Reading = func(b bool) { states = append(states, b) }
	err := missing.Run(context.Background(), func(monitors.Finding) {})
	g.Expect(errors.Is(err, monitors.ErrUnavailable)).To(BeTrue())
	g.Expect(states).To(BeEmpty())
}
