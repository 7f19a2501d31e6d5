package kmsg

import (
	"bufio"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus/testutil"
	clocktesting "k8s.io/utils/clock/testing"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/monitors"
)

// nicLine is one row of testdata/mlx5/lines.tsv (see SOURCES.md there).
type nicLine struct {
	source, kind, code  string
	severity            gpuhealthv1alpha1.Severity
	action              gpuhealthv1alpha1.Action
	pci, netdev, record string
}

// loadNICLines reads testdata/mlx5/lines.tsv.
func loadNICLines(t *testing.T) []nicLine {
	t.Helper()
	f, err := os.Open(filepath.Join("testdata", "mlx5", "lines.tsv"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	dash := func(s string) string {
		if s == "-" {
			return ""
		}
		return s
	}
	var out []nicLine
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if sc.Text() == "" || strings.HasPrefix(sc.Text(), "#") {
			continue
		}
		c := strings.Split(sc.Text(), "\t")
		if len(c) != 8 {
			t.Fatalf("lines.tsv: %d columns in %q", len(c), sc.Text())
		}
		out = append(out, nicLine{
			source: c[0], kind: c[1], code: dash(c[2]),
			severity: gpuhealthv1alpha1.Severity(dash(c[3])), action: gpuhealthv1alpha1.Action(dash(c[4])),
			pci: dash(c[5]), netdev: dash(c[6]), record: c[7],
		})
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// nicRun is a run for calling finding directly.
func nicRun(resolver func(pci, netdev string) (string, bool, bool)) *run {
	return &run{
		src:   &Source{NICResolver: resolver},
		log:   logr.Discard(),
		clock: clocktesting.NewFakePassiveClock(time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)),
	}
}

// computeNIC vouches for every adapter as the compute fabric, named mlx5_7.
func computeNIC(string, string) (string, bool, bool) { return "mlx5_7", true, true }

// TestNICLines runs every line of testdata/mlx5/lines.tsv, real and built,
// through Parse and finding: the kind, address, interface and code Parse
// gives, the table's severity and action for a compute-fabric NIC, and the
// capped verdict when nothing vouches for the NIC.
func TestNICLines(t *testing.T) {
	rows := loadNICLines(t)
	if len(rows) < 40 {
		t.Fatalf("lines.tsv has %d rows", len(rows))
	}
	for _, tc := range rows {
		t.Run(tc.source+": "+tc.record, func(t *testing.T) {
			g := NewWithT(t)
			e, err := Parse(tc.record)
			g.Expect(err).NotTo(HaveOccurred())
			switch tc.kind {
			case "none", "userspace":
				g.Expect(e.Kind).To(Equal(KindNone))
				g.Expect(e.Userspace).To(Equal(tc.kind == "userspace"))
				g.Expect(e.PCIBusID + e.Netdev + e.NICCode + e.Text).To(BeEmpty())
				return
			case "NIC":
			default:
				t.Fatalf("unknown kind %q", tc.kind)
			}
			g.Expect(e.Kind).To(Equal(KindNIC))
			g.Expect(e.PCIBusID).To(Equal(tc.pci))
			g.Expect(e.Netdev).To(Equal(tc.netdev))
			g.Expect(e.NICCode).To(Equal(tc.code))
			g.Expect(e.Text).NotTo(BeEmpty())
			g.Expect(tc.record).To(HaveSuffix(e.Text))

			f, ok := nicRun(computeNIC).finding(e)
			g.Expect(ok).To(BeTrue())
			g.Expect(f.Source).To(Equal(gpuhealthv1alpha1.SourceKmsg))
			g.Expect(f.Check).To(Equal(gpuhealthv1alpha1.CheckNIC))
			g.Expect(f.Component).To(Equal(gpuhealthv1alpha1.Component{Kind: gpuhealthv1alpha1.ComponentNIC, ID: "mlx5_7"}))
			g.Expect(f.Code).To(Equal(tc.code))
			g.Expect(f.Severity).To(Equal(tc.severity))
			g.Expect(f.Action).To(Equal(tc.action))
			g.Expect(f.Message).To(HavePrefix(e.Text + " ("))

			f, ok = nicRun(nil).finding(e)
			g.Expect(ok).To(BeTrue())
			id := tc.pci
			if id == "" {
				id = tc.netdev
			}
			g.Expect(f.Component.ID).To(Equal(id))
			g.Expect(f.Severity).NotTo(Equal(gpuhealthv1alpha1.SeverityFatal))
			if tc.severity == gpuhealthv1alpha1.SeverityFatal {
				g.Expect(f.Severity).To(Equal(gpuhealthv1alpha1.SeverityDegraded))
				g.Expect(f.Action).To(Equal(gpuhealthv1alpha1.ActionNone))
				g.Expect(f.Message).To(ContainSubstring("not known to be a compute-fabric NIC"))
			} else {
				g.Expect(f.Severity).To(Equal(tc.severity))
				g.Expect(f.Action).To(Equal(tc.action))
			}
		})
	}
}

// TestNICLinesCoverTheTable checks that lines.tsv has a line for every row
// of the NIC table, so that no pattern goes untested.
func TestNICLinesCoverTheTable(t *testing.T) {
	rows := loadNICLines(t)
	for i, r := range nicRows {
		covered := false
		for _, l := range rows {
			e, _ := Parse(l.record)
			if e.Kind == KindNIC && r.pattern.MatchString(e.Text) {
				covered = true
				break
			}
		}
		if !covered {
			t.Errorf("NIC table row %d (%s, %s) has no line in lines.tsv", i, r.code, r.pattern)
		}
	}
}

// TestNICVerdicts checks that every code of the table is judged and is a
// valid NodeHealthEvent code of at most 32 characters, and that only the
// codes that mean the adapter or its port stopped are Fatal.
func TestNICVerdicts(t *testing.T) {
	g := NewWithT(t)
	code := regexp.MustCompile(`^[A-Z][A-Za-z]{1,31}$`)
	fatal := map[string]bool{NICHealthCompromised: true, NICModuleError: true}
	for _, r := range nicRows {
		v, ok := nicVerdicts[r.code]
		g.Expect(ok).To(BeTrue(), "code %s has no verdict", r.code)
		g.Expect(code.MatchString(r.code)).To(BeTrue(), "code %q", r.code)
		g.Expect(v.why).NotTo(BeEmpty())
		g.Expect(v.severity == gpuhealthv1alpha1.SeverityFatal).To(Equal(fatal[r.code]), "code %s", r.code)
	}
	g.Expect(nicVerdicts).To(HaveLen(7))
}

// TestNICResolver covers who a NIC line is about: the resolver's answer
// decides the component id, whether the line is reported at all, and
// whether the table's severity stands.
func TestNICResolver(t *testing.T) {
	const (
		healthLine   = "3,10,1,-;mlx5_core 0000:c1:00.0: poll_health:840:(pid 0): device's health compromised - reached miss count"
		txLine       = "3,11,1,-;mlx5_core 0000:c1:00.0 ens1f0np0: TX timeout detected"
		watchdogLine = "4,12,1,-;NETDEV WATCHDOG: ens1f0np0 (mlx5_core): transmit queue 3 timed out"
	)
	type call struct{ pci, netdev string }
	cases := []struct {
		name     string
		record   string
		resolver func(pci, netdev string) (string, bool, bool)
		// wantReported false means no finding.
		wantReported bool
		wantID       string
		wantSeverity gpuhealthv1alpha1.Severity
		wantAction   gpuhealthv1alpha1.Action
		wantCall     call
	}{
		{
			name:   "A line about a management NIC is not reported.",
			record: healthLine,
			resolver: func(string, string) (string, bool, bool) {
				return "mlx5_0", false, true
			},
			wantCall: call{pci: "0000:c1:00.0"},
		},
		{
			name:         "A line about the compute fabric names the RDMA device and keeps the table's severity.",
			record:       healthLine,
			resolver:     func(string, string) (string, bool, bool) { return "mlx5_3", true, true },
			wantReported: true, wantID: "mlx5_3",
			wantSeverity: gpuhealthv1alpha1.SeverityFatal, wantAction: gpuhealthv1alpha1.ActionRebootNode,
			wantCall: call{pci: "0000:c1:00.0"},
		},
		{
			name:         "Without a resolver the PCI address names the NIC and a fatal line is capped at Degraded.",
			record:       healthLine,
			wantReported: true, wantID: "0000:c1:00.0",
			wantSeverity: gpuhealthv1alpha1.SeverityDegraded, wantAction: gpuhealthv1alpha1.ActionNone,
		},
		{
			name:         "A NIC the resolver does not know is treated as without a resolver.",
			record:       healthLine,
			resolver:     func(string, string) (string, bool, bool) { return "", false, false },
			wantReported: true, wantID: "0000:c1:00.0",
			wantSeverity: gpuhealthv1alpha1.SeverityDegraded, wantAction: gpuhealthv1alpha1.ActionNone,
			wantCall: call{pci: "0000:c1:00.0"},
		},
		{
			name:         "A device name that cannot be a component id gives way to the PCI address, with the table's severity.",
			record:       healthLine,
			resolver:     func(string, string) (string, bool, bool) { return "bad name", true, true },
			wantReported: true, wantID: "0000:c1:00.0",
			wantSeverity: gpuhealthv1alpha1.SeverityFatal, wantAction: gpuhealthv1alpha1.ActionRebootNode,
			wantCall: call{pci: "0000:c1:00.0"},
		},
		{
			name:         "A netdev_err line gives the resolver both the address and the interface.",
			record:       txLine,
			resolver:     func(string, string) (string, bool, bool) { return "mlx5_2", true, true },
			wantReported: true, wantID: "mlx5_2",
			wantSeverity: gpuhealthv1alpha1.SeverityDegraded, wantAction: gpuhealthv1alpha1.ActionNone,
			wantCall: call{pci: "0000:c1:00.0", netdev: "ens1f0np0"},
		},
		{
			name:         "The old watchdog text gives the resolver only the interface.",
			record:       watchdogLine,
			resolver:     func(string, string) (string, bool, bool) { return "mlx5_2", true, true },
			wantReported: true, wantID: "mlx5_2",
			wantSeverity: gpuhealthv1alpha1.SeverityDegraded, wantAction: gpuhealthv1alpha1.ActionNone,
			wantCall: call{netdev: "ens1f0np0"},
		},
		{
			name:         "Without a resolver the old watchdog text is named by its interface.",
			record:       watchdogLine,
			wantReported: true, wantID: "ens1f0np0",
			wantSeverity: gpuhealthv1alpha1.SeverityDegraded, wantAction: gpuhealthv1alpha1.ActionNone,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			e, err := Parse(tc.record)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(e.Kind).To(Equal(KindNIC))
			var got call
			resolver := tc.resolver
			if resolver != nil {
				resolver = func(pci, netdev string) (string, bool, bool) {
					got = call{pci, netdev}
					return tc.resolver(pci, netdev)
				}
			}
			f, ok := nicRun(resolver).finding(e)
			g.Expect(got).To(Equal(tc.wantCall))
			g.Expect(ok).To(Equal(tc.wantReported))
			if !tc.wantReported {
				g.Expect(f).To(Equal(monitors.Finding{}))
				return
			}
			g.Expect(f.Component).To(Equal(gpuhealthv1alpha1.Component{Kind: gpuhealthv1alpha1.ComponentNIC, ID: tc.wantID}))
			g.Expect(f.Severity).To(Equal(tc.wantSeverity))
			g.Expect(f.Action).To(Equal(tc.wantAction))
		})
	}
}

// TestSourceReportsNICFindings runs the source over a file with a compute
// NIC's fault, a management NIC's and an unknown NIC's, and checks what is
// reported and counted.
func TestSourceReportsNICFindings(t *testing.T) {
	g := NewWithT(t)
	management0 := testutil.ToFloat64(lines.WithLabelValues(resultManagement))
	fx := newFixture(t,
		"3,1,5000000,-;mlx5_core 0000:0a:00.0: poll_health:840:(pid 0): Fatal error 1 detected",
		"3,2,5000001,-;mlx5_core 0000:c1:00.0: poll_health:840:(pid 0): Fatal error 1 detected",
		"3,3,5000002,-;mlx5_core 0000:c1:00.0: wait_func:1189:(pid 72061): ACCESS_REG(0x805) timeout. Will cause a leak of a command resource",
		"3,4,5000003,-;mlx5_core 0000:d2:00.0: port_module:252:(pid 0): Port module event[error]: module 0, Cable error, High Temperature",
	)
	src := fx.source()
	src.NICResolver = func(pci, _ string) (string, bool, bool) {
		switch pci {
		case "0000:0a:00.0":
			return "mlx5_0", false, true
		case "0000:c1:00.0":
			return "mlx5_4", true, true
		}
		return "", false, false
	}
	r := start(t, src)
	want := []monitors.Finding{{
		Source: gpuhealthv1alpha1.SourceKmsg, Check: gpuhealthv1alpha1.CheckNIC,
		Component: gpuhealthv1alpha1.Component{Kind: gpuhealthv1alpha1.ComponentNIC, ID: "mlx5_4"},
		Code:      NICHealthCompromised, Severity: gpuhealthv1alpha1.SeverityFatal, Action: gpuhealthv1alpha1.ActionRebootNode,
		Message: "Fatal error 1 detected (" + nicVerdicts[NICHealthCompromised].why + ")",
	}, {
		Source: gpuhealthv1alpha1.SourceKmsg, Check: gpuhealthv1alpha1.CheckNIC,
		Component: gpuhealthv1alpha1.Component{Kind: gpuhealthv1alpha1.ComponentNIC, ID: "mlx5_4"},
		Code:      NICCommandTimeout, Severity: gpuhealthv1alpha1.SeverityDegraded, Action: gpuhealthv1alpha1.ActionNone,
		Message: "ACCESS_REG(0x805) timeout. Will cause a leak of a command resource (" + nicVerdicts[NICCommandTimeout].why + ")",
	}, {
		Source: gpuhealthv1alpha1.SourceKmsg, Check: gpuhealthv1alpha1.CheckNIC,
		Component: gpuhealthv1alpha1.Component{Kind: gpuhealthv1alpha1.ComponentNIC, ID: "0000:d2:00.0"},
		Code:      NICModuleError, Severity: gpuhealthv1alpha1.SeverityDegraded, Action: gpuhealthv1alpha1.ActionNone,
		Message: "Port module event[error]: module 0, Cable error, High Temperature (" + nicVerdicts[NICModuleError].why +
			"; judged Degraded: not known to be a compute-fabric NIC)",
	}}
	for _, w := range want {
		got := r.next(g)
		got.Time = time.Time{}
		g.Expect(got).To(Equal(w))
	}
	g.Consistently(r.findings, 100*time.Millisecond).ShouldNot(Receive())
	g.Expect(testutil.ToFloat64(lines.WithLabelValues(resultManagement)) - management0).To(Equal(1.0))
}
