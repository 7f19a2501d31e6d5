package ib

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	clocktesting "k8s.io/utils/clock/testing"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/monitors"
	"github.com/gpuhealth/gpuhealth/monitors/ib/ibfake"
)

var t0 = time.Date(2026, 12, 5, 10, 0, 0, 0, time.UTC)

// rig is a fake sysfs, a source on a fake clock and what it reported.
type rig struct {
	t     *testing.T
	root  string
	clock *clocktesting.FakeClock
	sc    *scanner
	got   []monitors.Finding
	// taken are the findings the last take returned.
	taken []monitors.Finding
}

func newRig(t *testing.T, src *Source, hcas ...ibfake.HCA) *rig {
	t.Helper()
	r := &rig{t: t, root: t.TempDir(), clock: clocktesting.NewFakeClock(t0)}
	if err := ibfake.Write(r.root, hcas...); err != nil {
		t.Fatal(err)
	}
	src.SysRoot, src.Clock = r.root, r.clock
	r.sc = src.newScanner(logr.Discard())
	return r
}

// step advances the clock by d and scans.
func (r *rig) step(d time.Duration) {
	r.t.Helper()
	r.clock.Step(d)
	if err := r.sc.scan(func(f monitors.Finding) { r.got = append(r.got, f) }); err != nil {
		r.t.Fatal(err)
	}
}

// take returns "code id [resolved]" of what was reported since the last take.
func (r *rig) take() []string {
	var out []string
	for _, f := range r.got {
		s := f.Code + " " + f.Component.ID
		if f.Resolved {
			s += " resolved"
		}
		out = append(out, s)
	}
	r.taken, r.got = r.got, nil
	return out
}

// last returns the last finding reported with code.
func (r *rig) last(code string) monitors.Finding {
	all := append(slices.Clone(r.taken), r.got...)
	for i := len(all) - 1; i >= 0; i-- {
		if all[i].Code == code {
			return all[i]
		}
	}
	r.t.Fatalf("no %s finding in %v", code, r.got)
	return monitors.Finding{}
}

func (r *rig) must(err error) {
	r.t.Helper()
	if err != nil {
		r.t.Fatal(err)
	}
}

func TestHealthyPortsReportNothingButCloseWhatAnEarlierRunLeftOpen(t *testing.T) {
	g := NewWithT(t)
	mgmt := ibfake.RoCE(9) // Ethernet and not named in Devices: management
	r := newRig(t, &Source{}, ibfake.InfiniBand(0), ibfake.InfiniBand(1), mgmt)
	r.step(0)
	g.Expect(r.take()).To(ConsistOf(
		"PortDown mlx5_0/1 resolved", "PortFlapping mlx5_0/1 resolved",
		"PortDown mlx5_1/1 resolved", "PortFlapping mlx5_1/1 resolved"))
	for range 5 {
		r.step(time.Second)
	}
	g.Expect(r.take()).To(BeEmpty())
	st := r.sc.src.Status()
	g.Expect(st).To(HaveLen(3))
	g.Expect(st[0].Compute).To(BeTrue())
	g.Expect(st[0].RateGbps).To(Equal(400.0))
	g.Expect(st[0].ExpectedRateGbps).To(Equal(400.0), "two ports of one type: the fastest is expected")
	g.Expect(st[2].Compute).To(BeFalse())
	g.Expect(st[2].Netdev).To(Equal("ens9np0"))

	dev, compute, ok := r.sc.src.Resolve(mgmt.PCI, "")
	g.Expect([]any{dev, compute, ok}).To(Equal([]any{"mlx5_9", false, true}))
	dev, compute, ok = r.sc.src.Resolve("", "ens9np0")
	g.Expect([]any{dev, compute, ok}).To(Equal([]any{"mlx5_9", false, true}))
	dev, compute, ok = r.sc.src.Resolve(ibfake.InfiniBand(1).PCI, "")
	g.Expect([]any{dev, compute, ok}).To(Equal([]any{"mlx5_1", true, true}))
	_, _, ok = r.sc.src.Resolve("0000:99:00.0", "")
	g.Expect(ok).To(BeFalse())
}

func TestAPortDownIsReportedAfterItsGraceAndFlapsAreCounted(t *testing.T) {
	g := NewWithT(t)
	r := newRig(t, &Source{}, ibfake.InfiniBand(0), ibfake.InfiniBand(1))
	r.step(0)
	r.take()

	r.must(ibfake.SetPort(r.root, "mlx5_1", 1, false))
	r.step(time.Second)
	g.Expect(r.take()).To(BeEmpty(), "a port down for less than DownGrace is not yet an outage")
	r.step(DefaultDownGrace)
	g.Expect(r.got).To(HaveLen(1))
	f := r.got[0]
	g.Expect(f.Check).To(Equal(gpuhealthv1alpha1.CheckNIC))
	g.Expect(f.Source).To(Equal(gpuhealthv1alpha1.SourceIB))
	g.Expect(f.Component).To(Equal(gpuhealthv1alpha1.Component{Kind: gpuhealthv1alpha1.ComponentNIC, ID: "mlx5_1/1"}))
	g.Expect(f.Severity).To(Equal(gpuhealthv1alpha1.SeverityFatal))
	g.Expect(f.Message).To(Equal("MT4129 port mlx5_1/1 (InfiniBand) DOWN/Polling for 10s"))
	r.take()

	r.must(ibfake.SetPort(r.root, "mlx5_1", 1, true))
	r.step(time.Second)
	g.Expect(r.take()).To(Equal([]string{"PortDown mlx5_1/1 resolved"}))

	// A second down within the window: flapping, at once (before the
	// down's own grace).
	r.must(ibfake.SetPort(r.root, "mlx5_1", 1, false))
	r.step(time.Second)
	g.Expect(r.take()).To(Equal([]string{"PortFlapping mlx5_1/1"}))
	r.must(ibfake.SetPort(r.root, "mlx5_1", 1, true))
	r.step(time.Second)
	g.Expect(r.take()).To(BeEmpty(), "flapping holds until the downs leave the window")
	r.step(DefaultFlapWindow)
	g.Expect(r.take()).To(Equal([]string{"PortFlapping mlx5_1/1 resolved"}))
}

func TestDownsBetweenScansAreCountedFromTheCounters(t *testing.T) {
	g := NewWithT(t)
	roce := ibfake.RoCE(4)
	r := newRig(t, &Source{Devices: []string{"mlx5_4"}}, ibfake.InfiniBand(0), roce)
	r.step(0)
	g.Expect(r.take()).To(ContainElement("PortDown mlx5_4/1 resolved"), "a RoCE device named in Devices is compute")

	// link_downed rose by 2 while every scan saw the port up; counters
	// are read every DefaultCounterInterval.
	r.must(ibfake.SetCounter(r.root, "mlx5_0", 1, "link_downed", 2))
	r.step(time.Second)
	g.Expect(r.take()).To(BeEmpty(), "counters are not read each scan")
	r.step(DefaultCounterInterval)
	g.Expect(r.take()).To(Equal([]string{"PortFlapping mlx5_0/1"}))
	g.Expect(r.sc.ports["mlx5_0/1"].downs).To(HaveLen(2))

	// Four more carrier changes on the RoCE interface: two flaps.
	r.must(ibfake.SetCarrierChanges(r.root, roce, 6))
	r.step(time.Second)
	g.Expect(r.take()).To(Equal([]string{"PortFlapping mlx5_4/1"}))

	// A counter reset (driver reload) is not a flap.
	r.step(DefaultFlapWindow)
	r.take()
	r.must(ibfake.SetCounter(r.root, "mlx5_0", 1, "link_downed", 0))
	r.must(ibfake.SetCarrierChanges(r.root, roce, 0))
	r.step(time.Second)
	g.Expect(r.take()).To(BeEmpty())
}

func TestARoCEInterfaceDownIsAPortDown(t *testing.T) {
	g := NewWithT(t)
	roce := ibfake.RoCE(4)
	r := newRig(t, &Source{Devices: []string{roce.PCI}}, roce)
	r.step(0)
	r.take()
	r.must(ibfake.SetNetdev(r.root, roce, false))
	r.step(time.Second)
	r.step(DefaultDownGrace)
	g.Expect(r.take()).To(ConsistOf("PortDown mlx5_4/1"))
	g.Expect(r.last("PortDown").Message).To(ContainSubstring("ACTIVE/LinkUp, ens4np0 not up"))
	r.must(ibfake.SetNetdev(r.root, roce, true))
	for range 20 {
		r.step(time.Second)
	}
	g.Expect(r.take()).To(Equal([]string{"PortDown mlx5_4/1 resolved"}), "one down and up is no flap")
}

// TestOneBounceIsNotAFlap: a link down for a few seconds and back, as the
// kernel counts it (link_downed one more, a RoCE interface's carrier
// changes one down and one up), is one down, seen by a scan and by the
// counters: never counted twice, never flapping.
func TestOneBounceIsNotAFlap(t *testing.T) {
	g := NewWithT(t)
	roce := ibfake.RoCE(4)
	r := newRig(t, &Source{Devices: []string{"mlx5_4"}}, ibfake.InfiniBand(0), roce)
	r.step(0)
	r.take()
	r.must(ibfake.SetPort(r.root, "mlx5_0", 1, false))
	r.must(ibfake.SetNetdev(r.root, roce, false))
	r.step(time.Second)
	r.step(2 * time.Second)
	r.must(ibfake.SetPort(r.root, "mlx5_0", 1, true))
	r.must(ibfake.SetNetdev(r.root, roce, true))
	for range 30 { // past two counter reads
		r.step(time.Second)
	}
	g.Expect(r.take()).To(BeEmpty())
	g.Expect(r.sc.ports["mlx5_0/1"].downs).To(HaveLen(1))
	g.Expect(r.sc.ports["mlx5_4/1"].downs).To(HaveLen(1))

	// Down and up between two scans: the counters count it, once.
	r.must(ibfake.SetPort(r.root, "mlx5_0", 1, false))
	r.must(ibfake.SetPort(r.root, "mlx5_0", 1, true))
	r.must(ibfake.SetNetdev(r.root, roce, false))
	r.must(ibfake.SetNetdev(r.root, roce, true))
	for range 11 {
		r.step(time.Second)
	}
	g.Expect(r.take()).To(ConsistOf("PortFlapping mlx5_0/1", "PortFlapping mlx5_4/1"), "the second down within the window")
	g.Expect(r.sc.ports["mlx5_0/1"].downs).To(HaveLen(2))
	g.Expect(r.sc.ports["mlx5_4/1"].downs).To(HaveLen(2))
}

// TestAStartSeesWhatIsDownAsDown: a new run closes what an earlier one
// left open only for ports it finds up.
func TestAStartSeesWhatIsDownAsDown(t *testing.T) {
	g := NewWithT(t)
	root := t.TempDir()
	r := &rig{t: t, root: root, clock: clocktesting.NewFakeClock(t0)}
	r.must(ibfake.Write(root, ibfake.InfiniBand(0), ibfake.InfiniBand(1)))
	r.must(ibfake.SetPort(root, "mlx5_1", 1, false))
	r.sc = (&Source{SysRoot: root, Clock: r.clock}).newScanner(logr.Discard())
	r.step(0)
	g.Expect(r.take()).To(ConsistOf("PortDown mlx5_0/1 resolved", "PortFlapping mlx5_0/1 resolved"))
	r.step(DefaultDownGrace)
	g.Expect(r.take()).To(Equal([]string{"PortDown mlx5_1/1"}))
}

// TestVirtualFunctionsAreNotTheFabric: an SR-IOV virtual function's port
// comes and goes with the pod it is given to: never judged, unless named.
func TestVirtualFunctionsAreNotTheFabric(t *testing.T) {
	g := NewWithT(t)
	vf := ibfake.InfiniBand(3)
	vf.VF = true
	r := newRig(t, &Source{}, ibfake.InfiniBand(0), vf)
	r.step(0)
	g.Expect(r.take()).To(ConsistOf("PortDown mlx5_0/1 resolved", "PortFlapping mlx5_0/1 resolved"))
	g.Expect(r.sc.src.Status()[1].Compute).To(BeFalse())
	r.must(ibfake.Unbind(r.root, "mlx5_3"))
	r.step(DefaultDownGrace + time.Second)
	r.step(2 * DefaultPCIInterval)
	g.Expect(r.take()).To(BeEmpty(), "a VF gone (to a pod's network namespace) is no finding, nor missing from the PCI bus")

	named := newRig(t, &Source{Devices: []string{"mlx5_3"}}, ibfake.InfiniBand(0), vf)
	named.step(0)
	g.Expect(named.sc.src.Status()[1].Compute).To(BeTrue(), "a VF named in Devices is judged")
}

func TestAManagementPortNeverReportsAnything(t *testing.T) {
	g := NewWithT(t)
	// An InfiniBand port excluded by pattern, and a RoCE port not listed.
	r := newRig(t, &Source{Exclude: []string{"mlx5_1"}}, ibfake.InfiniBand(0), ibfake.InfiniBand(1), ibfake.RoCE(5))
	r.step(0)
	r.take()
	r.must(ibfake.SetPort(r.root, "mlx5_1", 1, false))
	r.must(ibfake.SetPort(r.root, "mlx5_5", 1, false))
	r.must(ibfake.SetCounter(r.root, "mlx5_1", 1, "link_downed", 5))
	r.must(ibfake.SetCounter(r.root, "mlx5_1", 1, "symbol_error", 1e6))
	for range 20 {
		r.step(time.Second)
	}
	g.Expect(r.take()).To(BeEmpty())
}

func TestADowntrainedPortIsDegraded(t *testing.T) {
	for _, tc := range []struct {
		name     string
		src      *Source
		rate     string
		expected float64
		want     bool
	}{
		{name: "half the other ports' rate", src: &Source{}, rate: ibfake.HDR, expected: 400, want: true},
		{name: "all at the configured rate", src: &Source{ExpectedRateGbps: 400}, rate: ibfake.NDR, expected: 400},
		{name: "the type's configured rate wins", src: &Source{ExpectedRateGbps: 800, ExpectedRates: map[string]float64{ibfake.CX7: 200}}, rate: ibfake.HDR, expected: 200},
		{name: "configured above what every port runs", src: &Source{ExpectedRateGbps: 800}, rate: ibfake.NDR, expected: 800, want: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			r := newRig(t, tc.src, ibfake.InfiniBand(0), ibfake.InfiniBand(1), ibfake.InfiniBand(2))
			r.must(ibfake.SetRate(r.root, "mlx5_2", 1, tc.rate))
			r.step(0)
			r.take()
			r.step(DefaultRateGrace - time.Second)
			g.Expect(r.take()).To(BeEmpty(), "a link trains up through lower rates")
			r.step(time.Second)
			got := r.take()
			g.Expect(slices.Contains(got, "RateDegraded mlx5_2/1")).To(Equal(tc.want), "%v", got)
			g.Expect(r.sc.src.Status()[2].ExpectedRateGbps).To(Equal(tc.expected))
			if tc.want {
				f := r.last("RateDegraded")
				g.Expect(f.Severity).To(Equal(gpuhealthv1alpha1.SeverityDegraded))
				g.Expect(f.Message).To(ContainSubstring(fmt.Sprintf("runs at %s, expected %g Gb/s", tc.rate, tc.expected)))
			}
		})
	}
}

func TestErrorCountersAreJudgedAsRatesThroughWrapsAndResets(t *testing.T) {
	g := NewWithT(t)
	r := newRig(t, &Source{Thresholds: map[string]float64{"port_xmit_discards": 0}}, ibfake.InfiniBand(0))
	r.step(0)
	r.take()
	// 20 symbol errors a minute: 0.33/s, over the 0.1/s threshold once
	// the window has two samples.
	var v uint64
	for range 5 {
		v += 20
		r.must(ibfake.SetCounter(r.root, "mlx5_0", 1, "symbol_error", v))
		r.step(time.Minute)
	}
	g.Expect(r.take()).To(Equal([]string{"symbol_error mlx5_0/1"}))
	f := r.last("symbol_error")
	g.Expect(f.Severity).To(Equal(gpuhealthv1alpha1.SeverityDegraded))
	g.Expect(f.Message).To(ContainSubstring("symbol_error rose 20 over the last 5m0s (0.333/s, threshold 0.1/s)"))

	// The counter is reset (perfquery -R, a driver reload): the history
	// restarts, no spike, and the rate falls under the threshold.
	r.must(ibfake.SetCounter(r.root, "mlx5_0", 1, "symbol_error", 0))
	r.step(time.Minute)
	r.step(time.Minute)
	g.Expect(r.take()).To(Equal([]string{"symbol_error mlx5_0/1 resolved"}))

	// A 16-bit counter that saturates stays at its maximum: its rise is
	// judged, then it reads a rate of 0 and resolves.
	r.must(ibfake.SetCounter(r.root, "mlx5_0", 1, "symbol_error", 65535))
	for range 10 {
		r.step(time.Minute)
	}
	g.Expect(r.take()).To(Equal([]string{"symbol_error mlx5_0/1", "symbol_error mlx5_0/1 resolved"}))

	// A threshold turned off in the configuration is never judged.
	r.must(ibfake.SetCounter(r.root, "mlx5_0", 1, "port_xmit_discards", 1e9))
	r.step(time.Minute)
	g.Expect(r.take()).To(BeEmpty())
	g.Expect(r.sc.counters).NotTo(ContainElement("port_xmit_discards"))
}

func TestAnAdapterThatGoesAwayIsDownAndMissing(t *testing.T) {
	g := NewWithT(t)
	r := newRig(t, &Source{ExpectedDevices: 2}, ibfake.InfiniBand(0), ibfake.InfiniBand(1))
	r.step(0)
	r.take()
	r.must(ibfake.Unbind(r.root, "mlx5_1"))
	r.step(time.Second)
	g.Expect(r.take()).To(BeEmpty(), "a firmware reset unregisters the device for a moment")
	r.step(DefaultDownGrace)
	g.Expect(r.take()).To(ConsistOf("HCAMissing ", "PortDown mlx5_1/1"))
	g.Expect(r.last("HCAMissing").Message).To(Equal("1 adapters with a compute port (mlx5_0), 2 expected"))
	g.Expect(r.last("PortDown").Message).To(ContainSubstring("gone from sysfs"))
	// The PCI bus still has its function: missing at two comparisons.
	r.step(DefaultPCIInterval)
	g.Expect(r.take()).To(BeEmpty())
	r.step(DefaultPCIInterval)
	g.Expect(r.take()).To(Equal([]string{"NoRDMADevice " + ibfake.InfiniBand(1).PCI}))
	g.Expect(r.last("NoRDMADevice").Severity).To(Equal(gpuhealthv1alpha1.SeverityDegraded))

	// It comes back with new firmware (an update resets the adapter,
	// which removes and re-adds its device): read afresh.
	back := ibfake.InfiniBand(1)
	back.Firmware = "28.40.1000"
	r.must(ibfake.Write(r.root, back))
	r.step(time.Second)
	g.Expect(r.take()).To(ConsistOf("HCAMissing  resolved", "PortDown mlx5_1/1 resolved"))
	g.Expect(r.sc.src.Status()[1].FirmwareVersion).To(Equal("28.40.1000"))
	r.step(DefaultPCIInterval)
	g.Expect(r.take()).To(Equal([]string{"NoRDMADevice " + ibfake.InfiniBand(1).PCI + " resolved"}))
}

func TestNoRDMADriverIsUnavailable(t *testing.T) {
	g := NewWithT(t)
	src := &Source{SysRoot: t.TempDir()}
	err := src.Run(context.Background(), func(monitors.Finding) {})
	g.Expect(errors.Is(err, monitors.ErrUnavailable)).To(BeTrue())
	g.Expect(err.Error()).To(ContainSubstring("no RDMA devices"))
}

func TestParseRate(t *testing.T) {
	for in, want := range map[string]float64{
		"400 Gb/sec (4X NDR)": 400, "2.5 Gb/sec (1X SDR)": 2.5, "53.125 Gb/sec (1X HDR)": 53.125, " 100 Gb/sec (2X HDR)\n": 100,
	} {
		got, err := ParseRate(in)
		if err != nil || got != want {
			t.Errorf("ParseRate(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "fast", "400 Mb/sec", "-1 Gb/sec", "NaN Gb/sec"} {
		if _, err := ParseRate(in); err == nil {
			t.Errorf("ParseRate(%q): no error", in)
		}
	}
}

func FuzzParseRate(f *testing.F) {
	for _, s := range []string{"400 Gb/sec (4X NDR)", "2.5 Gb/sec (1X SDR)", "", " Gb/sec", "1e400 Gb/sec"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		v, err := ParseRate(s)
		if err == nil && (v < 0 || v > 1e6 || !strings.Contains(s, " Gb/sec")) {
			t.Fatalf("ParseRate(%q) = %v", s, v)
		}
	})
}

// TestErrorRateSeriesOnlyWhileCounting: a port's error-rate series exist
// only while the counter rises; the others are exported for every port.
func TestErrorRateSeriesOnlyWhileCounting(t *testing.T) {
	g := NewWithT(t)
	for _, v := range []*prometheus.GaugeVec{portUp, portRate, portExpectedRate, portDowns, counterRate} {
		v.Reset() // the other tests' scanners left theirs
	}
	r := newRig(t, &Source{}, ibfake.InfiniBand(0), ibfake.InfiniBand(1))
	r.step(0)
	r.step(DefaultCounterInterval)
	g.Expect(testutil.CollectAndCount(counterRate)).To(BeZero(), "no counter rose")
	g.Expect(testutil.CollectAndCount(portUp)).To(Equal(2))
	r.must(ibfake.SetCounter(r.root, "mlx5_1", 1, "symbol_error", 5))
	r.step(DefaultCounterInterval)
	g.Expect(testutil.CollectAndCount(counterRate)).To(Equal(1))
	g.Expect(testutil.ToFloat64(counterRate.WithLabelValues("mlx5_1", "1", "symbol_error"))).To(BeNumerically(">", 0))
	r.step(DefaultCounterWindow + DefaultCounterInterval)
	g.Expect(testutil.CollectAndCount(counterRate)).To(BeZero(), "gone once the window holds no rise")
}
