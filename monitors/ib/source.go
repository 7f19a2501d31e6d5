package ib

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"path"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/utils/clock"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/monitors"
)

// Defaults for the Source fields left zero. None of them was measured on
// hardware: they are starting points with the reason for each, to be tuned
// per fleet (the agent's ib configuration sets every one).
const (
	// DefaultSysRoot is sysfs; its RDMA and PCI trees are the host's in a
	// container.
	DefaultSysRoot = "/sys"
	// DefaultInterval is how often the ports are read. A port that goes
	// down breaks every queue pair through it at once, and a scan of 8
	// adapters costs well under a millisecond (make bench-monitor), so each
	// second, like NVIDIA NVSentinel's NIC monitor.
	DefaultInterval = time.Second
	// DefaultDownGrace is how long a compute port must be down before it is
	// reported down: a link that retrains comes back within seconds and is
	// a flap (counted below), not an outage. NCCL's InfiniBand transport
	// gives up on a queue pair after its retries (NCCL_IB_TIMEOUT 20 and
	// NCCL_IB_RETRY_CNT 7 by default: 7 × 4.096 µs × 2^20 ≈ 30 s), so a
	// port down for 10 s has already stalled every job through it.
	DefaultDownGrace = 10 * time.Second
	// DefaultFlapWindow and DefaultMaxFlaps: a port that went down
	// MaxFlaps times within FlapWindow is flapping. One down can be a
	// switch port reset or a cable reseat; two within ten minutes is a link
	// that cannot hold, and each one broke the queue pairs through it
	// (NVIDIA's health validation treats RDMA link flaps as fatal).
	DefaultFlapWindow = 10 * time.Minute
	DefaultMaxFlaps   = 2
	// DefaultRateGrace is how long a port must run below its expected rate
	// before it is reported: a link trains up through lower rates for a few
	// seconds after it comes up.
	DefaultRateGrace = 30 * time.Second
	// DefaultCounterWindow is the window error-counter rates are judged
	// over: long enough that a burst of a few errors does not trip a
	// threshold, short enough that a cable going bad is seen within
	// minutes.
	DefaultCounterWindow = 5 * time.Minute
	// DefaultCounterInterval is how often the counters are read: their
	// rates are judged over minutes, and link_downed counts every down
	// since the last read, so reading them each second would cost three
	// times the scan for nothing (make bench-monitor).
	DefaultCounterInterval = 10 * time.Second
	// DefaultPCIInterval is how often the PCI bus is compared with the RDMA
	// devices (a full PCI scan reads two files of each of a few hundred
	// functions; an adapter does not come and go each second).
	DefaultPCIInterval = time.Minute
)

// DefaultThresholds are the error counters judged, with their rate per
// second over CounterWindow above which a compute port is reported
// (Degraded). The IB counters are the PortCounters of the InfiniBand
// specification (vol. 1, 16.1.3.5); the hw_counters are mlx5's. Reasons:
//   - symbol_error: minor link errors (bit errors the PHY saw); 0.1/s is
//     30 within the 5-minute window, more than a healthy FEC-protected
//     link shows, and the sign of a cable or transceiver going bad.
//   - link_error_recovery: the link retrained without going down; each one
//     stalls traffic. 0.01/s is 3 within the window.
//   - port_rcv_errors, port_rcv_remote_physical_errors: packets received
//     with errors (locally, or marked bad upstream). 0.1/s.
//   - local_link_integrity_errors, excessive_buffer_overrun_errors: the
//     link's integrity threshold or a receive buffer overrun, both rare on
//     a healthy link. 0.01/s.
//   - port_xmit_discards: packets discarded because the port was down or
//     congested. 10/s: congestion produces some under load.
//   - local_ack_timeout_err (RoCE, mlx5): the sender's ACK timer expired
//     and it retransmitted; sustained it is a lossy path. 1/s.
//
// link_downed is read too (it counts the link's downs, also those between
// two scans) and feeds the flap count, not a threshold.
var DefaultThresholds = map[string]float64{
	"symbol_error":                    0.1,
	"link_error_recovery":             0.01,
	"port_rcv_errors":                 0.1,
	"port_rcv_remote_physical_errors": 0.1,
	"local_link_integrity_errors":     0.01,
	"excessive_buffer_overrun_errors": 0.01,
	"port_xmit_discards":              10,
	"local_ack_timeout_err":           1,
}

// counterLinkDowned counts the port's link-down transitions.
const counterLinkDowned = "link_downed"

// Codes of the ib source's findings (Check NIC). A counter over its
// threshold has the counter's name as its code.
const (
	// CodePortDown is a compute port not ACTIVE/LinkUp (or its RoCE
	// interface not up) for DownGrace, or gone from sysfs.
	CodePortDown = "PortDown"
	// CodePortFlapping is a compute port that went down MaxFlaps times
	// within FlapWindow.
	CodePortFlapping = "PortFlapping"
	// CodeRateDegraded is a compute port up at less than its expected rate
	// for RateGrace.
	CodeRateDegraded = "RateDegraded"
	// CodeHCAMissing is fewer compute adapters than ExpectedDevices.
	CodeHCAMissing = "HCAMissing"
	// CodeNoRDMADevice is a Mellanox adapter on the PCI bus without an
	// RDMA device while others have one: its driver did not bind.
	CodeNoRDMADevice = "NoRDMADevice"
)

// Source reads the node's InfiniBand and RoCE ports from the kernel's RDMA
// sysfs tree each Interval and reports the compute fabric's faults as
// Check NIC findings (component kind NIC, id "<device>/<port>"):
//
//   - PortDown (Fatal): a compute port not ACTIVE and LinkUp, or its RoCE
//     interface not up, for DownGrace; or a port that was there and is gone.
//     Its node's multi-node jobs are broken: quarantine, and recertify
//     once the port is back (Action None: a reboot does not mend a cable).
//   - PortFlapping (Fatal): MaxFlaps downs within FlapWindow. A scan
//     counts a down when it sees the port go down, or more when a RoCE
//     interface's carrier_changes (a down and an up each) say so; each
//     read of the port's link_downed counter adds the downs it counts
//     beyond those the scans saw since the last read — so a link down and
//     up between two scans is counted, and none twice.
//   - RateDegraded (Degraded): up at less than the expected rate for
//     RateGrace. The expected rate is ExpectedRates for the adapter's
//     hca_type, else ExpectedRateGbps, else the highest rate among the
//     node's up compute ports of the same hca_type (when there are two or
//     more); the fleet's view is the operator's (drift of the inventory's
//     port rates).
//   - <counter> (Degraded): an error counter's rate over CounterWindow
//     above its threshold. Counters are cumulative and saturate, wrap or
//     reset (a driver reload, a counter reset with perfquery -R): rates,
//     via monitors.Rate, which restarts its history on a decrease.
//   - HCAMissing (Fatal, Action RebootNode; component id empty): fewer
//     adapters with a compute port than ExpectedDevices.
//   - NoRDMADevice (Degraded; Fatal when the function is listed in
//     Devices; component id the PCI address): a Mellanox network function
//     on the PCI bus without an RDMA device while other functions have
//     one. Not judged when no RDMA device exists at all (no RDMA driver).
//
// Which ports are the compute fabric: every InfiniBand port of a physical
// PCI function, plus the ports of devices matched by Devices (patterns of
// device names or PCI addresses, path.Match syntax: mlx5_*), minus those
// matched by Exclude. Other ports (a management NIC; an SR-IOV virtual
// function or a sub-function, which come and go with the pods they are
// given to) are exported as metrics and never reported.
//
// When a run starts it resolves PortDown and PortFlapping of each compute
// port it finds healthy, so a condition left open by an earlier run (the
// agent restarted while the port came back) does not hold its node forever.
type Source struct {
	// SysRoot is sysfs; empty means DefaultSysRoot.
	SysRoot string
	// Interval is the time between scans; zero means DefaultInterval.
	Interval time.Duration
	// Devices are patterns of RDMA device names or PCI addresses whose
	// ports are the compute fabric (RoCE adapters), besides every
	// InfiniBand port.
	Devices []string
	// Exclude are patterns of devices never judged, even InfiniBand ones.
	Exclude []string
	// ExpectedRateGbps is every compute port's rate; zero means unknown.
	ExpectedRateGbps float64
	// ExpectedRates are compute ports' rates by adapter hca_type (MT4129
	// is ConnectX-7); they win over ExpectedRateGbps.
	ExpectedRates map[string]float64
	// ExpectedDevices is how many adapters with a compute port the node
	// has; zero means not checked.
	ExpectedDevices int
	// DownGrace, FlapWindow, MaxFlaps, RateGrace and CounterWindow: zero
	// means their defaults.
	DownGrace, FlapWindow, RateGrace, CounterWindow time.Duration
	MaxFlaps                                        int
	// Thresholds replace DefaultThresholds' entries (rate per second); a
	// threshold of zero or less turns the counter's judgement off.
	Thresholds map[string]float64
	// Repeat is how often a condition that holds is reported again; zero
	// means monitors.DefaultRepeat.
	Repeat time.Duration
	// Clock gives the scans' times and ticks; nil means the real clock.
	Clock clock.WithTicker

	mu     sync.Mutex
	status []PortStatus
}

var _ monitors.Source = &Source{}

// Name returns "ib".
func (s *Source) Name() string { return string(gpuhealthv1alpha1.SourceIB) }

// PortStatus is what the last scan found of one port.
type PortStatus struct {
	Port
	// HCAType and FirmwareVersion are its adapter's; PCI its function.
	HCAType, FirmwareVersion, PCI string
	// Compute is true for a port of the compute fabric.
	Compute bool
	// ExpectedRateGbps is the rate it should run at; 0 when unknown.
	ExpectedRateGbps float64
}

// Status returns the ports the last scan found, sorted by id; nil before the
// first scan. It is safe to call while Run runs.
func (s *Source) Status() []PortStatus {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.status)
}

// Resolve names the RDMA device of a PCI function or network interface
// (a kernel log line names one or the other) and says whether it is part of
// the compute fabric; ok is false when the last scan did not see it.
func (s *Source) Resolve(pci, netdev string) (device string, compute, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := range s.status {
		p := &s.status[i]
		// A PCI address names the function on the host; an interface
		// name only within a network namespace, so it is the fallback.
		if pci != "" && p.PCI == pci || pci == "" && netdev != "" && p.Netdev == netdev {
			device, ok = p.Device, true
			compute = compute || p.Compute
		}
	}
	return device, compute, ok
}

// Run scans until ctx is done. It returns an error wrapping
// monitors.ErrUnavailable when the first scan finds no RDMA sysfs tree (no
// RDMA driver loaded, or sysfs not mounted); a later scan that cannot read
// it is logged and judged as every port gone. When ctx is done it resolves
// nothing: the agent is stopping, not the condition.
func (s *Source) Run(ctx context.Context, report monitors.Reporter) error {
	sc := s.newScanner(ctrllog.FromContext(ctx).WithValues("source", s.Name()))
	if err := sc.scan(report); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return monitors.Unavailable("no RDMA devices: %s does not exist (no RDMA driver loaded, or sysfs not mounted there)", sc.classRoot())
		}
		return monitors.Unavailable("reading %s: %v", sc.classRoot(), err)
	}
	monitors.Every(ctx, sc.clock, sc.interval, func() {
		if err := sc.scan(report); err != nil {
			sc.log.Error(err, "Reading the RDMA devices failed; judging every port gone", "sysRoot", sc.sysRoot)
		}
	})
	return nil
}

// scanner is the state of one Run.
type scanner struct {
	src   *Source
	log   logr.Logger
	clock clock.WithTicker
	r     reader

	sysRoot                                         string
	interval, downGrace, flapWindow, rateGrace, cwn time.Duration
	maxFlaps                                        int
	thresholds                                      map[string]float64
	counters                                        []string

	tracker monitors.Tracker
	ports   map[string]*portState
	first   bool
	// pciAt is when the PCI bus was last compared; pciMissing the
	// functions without an RDMA device at that comparison.
	pciAt      time.Time
	pciMissing map[string]bool
	// countersAt is when the counters were last read.
	countersAt time.Time
	// shortSince is when fewer adapters than ExpectedDevices were first
	// seen; zero while there are enough.
	shortSince time.Time
	series     series
}

// portState is what the scans saw of one port.
type portState struct {
	// up is the last scan's view; downSince when it went down.
	up        bool
	downSince time.Time
	// downs are the times of the downs within FlapWindow.
	downs []time.Time
	// linkDowned and carrier are the last counter values (has* false
	// until read).
	linkDowned, carrier       uint64
	hasLinkDowned, hasCarrier bool
	// seenDowns are the downs the scans (and carrier changes) counted
	// since link_downed was last read.
	seenDowns int
	// slowSince is when the port was first seen up below its expected
	// rate; zero while it is not.
	slowSince time.Time
	// rates are the error counters' rates.
	rates map[string]*monitors.Rate
	// rateNow are the rates the last scan computed, for metrics.
	rateNow map[string]float64
	// last is the port as last seen, for a port that disappears.
	last PortStatus
}

func (s *Source) newScanner(log logr.Logger) *scanner {
	sc := &scanner{
		src:        s,
		log:        log,
		clock:      s.Clock,
		sysRoot:    cmp.Or(s.SysRoot, DefaultSysRoot),
		interval:   monitors.PositiveOr(s.Interval, DefaultInterval),
		downGrace:  monitors.PositiveOr(s.DownGrace, DefaultDownGrace),
		flapWindow: monitors.PositiveOr(s.FlapWindow, DefaultFlapWindow),
		rateGrace:  monitors.PositiveOr(s.RateGrace, DefaultRateGrace),
		cwn:        monitors.PositiveOr(s.CounterWindow, DefaultCounterWindow),
		maxFlaps:   s.MaxFlaps,
		thresholds: maps.Clone(DefaultThresholds),
		tracker:    monitors.Tracker{Repeat: s.Repeat},
		ports:      map[string]*portState{},
		first:      true,
	}
	if sc.clock == nil {
		sc.clock = clock.RealClock{}
	}
	if sc.maxFlaps <= 0 {
		sc.maxFlaps = DefaultMaxFlaps
	}
	for k, v := range s.Thresholds {
		if v <= 0 {
			delete(sc.thresholds, k)
			continue
		}
		sc.thresholds[k] = v
	}
	sc.counters = append(slices.Sorted(maps.Keys(sc.thresholds)), counterLinkDowned)
	return sc
}

func (sc *scanner) classRoot() string { return path.Join(sc.sysRoot, classDir) }

// matches reports whether a pattern in patterns matches the device's name
// or PCI address.
func matches(patterns []string, d *Device) bool {
	for _, p := range patterns {
		if ok, _ := path.Match(p, d.Name); ok && d.Name != "" {
			return true
		}
		if ok, _ := path.Match(p, d.PCI); ok && d.PCI != "" {
			return true
		}
	}
	return false
}

// compute says whether a port is part of the compute fabric.
func (s *Source) compute(d *Device, p *Port) bool {
	if matches(s.Exclude, d) {
		return false
	}
	if matches(s.Devices, d) {
		return true
	}
	return p.LinkLayer == LinkLayerInfiniBand && d.Physical
}

// scan reads the devices once, judges the compute ports, publishes the
// status and metrics. An error means the RDMA tree could not be listed; the
// ports were then judged gone.
func (sc *scanner) scan(report monitors.Reporter) error {
	now := sc.clock.Now()
	var counters []string
	if sc.countersAt.IsZero() || now.Sub(sc.countersAt) >= max(DefaultCounterInterval, sc.interval) {
		counters, sc.countersAt = sc.counters, now
	}
	devs, err := sc.r.scan(sc.sysRoot, counters)
	if err != nil && sc.first {
		return err
	}
	statuses := make([]PortStatus, 0, 8)
	for i := range devs {
		d := &devs[i]
		for j := range d.Ports {
			p := &d.Ports[j]
			statuses = append(statuses, PortStatus{Port: *p, HCAType: d.HCAType, FirmwareVersion: d.FirmwareVersion, PCI: d.PCI, Compute: sc.src.compute(d, p)})
		}
	}
	sc.expectRates(statuses)
	seen := make(map[string]bool, len(statuses))
	computeDevs := map[string]bool{}
	for i := range statuses {
		st := &statuses[i]
		seen[st.ID()] = true
		if !st.Compute {
			// A port that stops being compute (the configuration
			// changed with a restart, so only within a run when the
			// link layer flips) closes what was open of it.
			if ps, ok := sc.ports[st.ID()]; ok {
				sc.resolvePort(now, ps.last, report)
				delete(sc.ports, st.ID())
			}
			continue
		}
		computeDevs[st.Device] = true
		sc.observe(now, st, report)
	}
	for id, ps := range sc.ports {
		if !seen[id] {
			gone := ps.last
			gone.State, gone.StateText, gone.PhysState, gone.PhysText = 0, "gone from sysfs", 0, ""
			sc.observe(now, &gone, report)
		}
	}
	sc.judgeDevices(now, devs, computeDevs, report)
	sc.first = false
	sc.src.mu.Lock()
	sc.src.status = statuses
	sc.src.mu.Unlock()
	sc.publishMetrics(statuses)
	return err
}

// expectRates fills each compute port's expected rate (see Source).
func (sc *scanner) expectRates(statuses []PortStatus) {
	best := map[string]float64{}
	n := map[string]int{}
	for i := range statuses {
		st := &statuses[i]
		if st.Compute && st.Up() {
			best[st.HCAType] = max(best[st.HCAType], st.RateGbps)
			n[st.HCAType]++
		}
	}
	for i := range statuses {
		st := &statuses[i]
		if !st.Compute {
			continue
		}
		switch {
		case sc.src.ExpectedRates[st.HCAType] > 0:
			st.ExpectedRateGbps = sc.src.ExpectedRates[st.HCAType]
		case sc.src.ExpectedRateGbps > 0:
			st.ExpectedRateGbps = sc.src.ExpectedRateGbps
		case n[st.HCAType] >= 2:
			st.ExpectedRateGbps = best[st.HCAType]
		}
	}
}

// observe judges one compute port.
func (sc *scanner) observe(now time.Time, st *PortStatus, report monitors.Reporter) {
	ps, known := sc.ports[st.ID()]
	if !known {
		ps = &portState{up: true, rates: map[string]*monitors.Rate{}, rateNow: map[string]float64{}}
		sc.ports[st.ID()] = ps
	}
	up := st.Up()
	// Downs since the last scan: the scans' own view, and a RoCE
	// interface's carrier changes, which cover the same interval (a down
	// and an up each: after a scan that saw the port up, the first change
	// is a down), whichever saw more.
	downs := 0
	if known && ps.up && !up {
		downs = 1
	}
	if st.HasCarrier {
		if ps.hasCarrier && st.CarrierChanges > ps.carrier {
			changes := min(st.CarrierChanges-ps.carrier, 2000)
			if ps.up {
				changes++
			}
			downs = max(downs, int(changes/2))
		}
		ps.carrier, ps.hasCarrier = st.CarrierChanges, true
	}
	ps.seenDowns += downs
	// The port's link_downed counter, read every DefaultCounterInterval,
	// counts every down since its last read, also those no scan saw: the
	// downs it counts beyond those the scans saw since then are added.
	if v, ok := st.Counters[counterLinkDowned]; ok {
		if ps.hasLinkDowned && v > ps.linkDowned {
			downs += max(0, int(min(v-ps.linkDowned, 1000))-ps.seenDowns)
		}
		ps.linkDowned, ps.hasLinkDowned, ps.seenDowns = v, true, 0
	}
	for range downs {
		ps.downs = append(ps.downs, now)
	}
	ps.downs = slices.DeleteFunc(ps.downs, func(t time.Time) bool { return now.Sub(t) >= sc.flapWindow })
	if !up && (ps.up || !known) {
		ps.downSince = now
	}
	ps.up = up
	if st.Compute {
		ps.last = *st
	}

	base := monitors.Finding{
		Source:    gpuhealthv1alpha1.SourceIB,
		Check:     gpuhealthv1alpha1.CheckNIC,
		Component: gpuhealthv1alpha1.Component{Kind: gpuhealthv1alpha1.ComponentNIC, ID: st.ID()},
		Severity:  gpuhealthv1alpha1.SeverityFatal,
		Action:    gpuhealthv1alpha1.ActionNone,
	}
	down := base
	down.Code = CodePortDown
	down.Message = fmt.Sprintf("%s port %s (%s) %s for %s", describe(st), st.ID(), st.LinkLayer, stateOf(st), now.Sub(ps.downSince).Round(time.Second))
	flap := base
	flap.Code = CodePortFlapping
	flap.Message = fmt.Sprintf("%s port %s (%s) went down %d times within %s (%d or more is flapping); now %s", describe(st), st.ID(), st.LinkLayer, len(ps.downs), sc.flapWindow, sc.maxFlaps, stateOf(st))
	isDown := !up && now.Sub(ps.downSince) >= sc.downGrace
	isFlapping := len(ps.downs) >= sc.maxFlaps
	if sc.first && up && !isFlapping {
		// Close what an earlier run may have left open (see Source).
		for _, f := range []monitors.Finding{down, flap} {
			f.Resolved, f.Time = true, now
			report(f)
		}
	}
	sc.tracker.Set(now, down, isDown, report)
	sc.tracker.Set(now, flap, isFlapping, report)

	slow := base
	slow.Code, slow.Severity = CodeRateDegraded, gpuhealthv1alpha1.SeverityDegraded
	isSlow := up && st.ExpectedRateGbps > 0 && st.RateGbps < st.ExpectedRateGbps
	switch {
	case !isSlow:
		ps.slowSince = time.Time{}
	case ps.slowSince.IsZero():
		ps.slowSince = now
	}
	slow.Message = fmt.Sprintf("%s port %s runs at %s, expected %g Gb/s, for %s", describe(st), st.ID(), st.RateText, st.ExpectedRateGbps, now.Sub(ps.slowSince).Round(time.Second))
	sc.tracker.Set(now, slow, isSlow && now.Sub(ps.slowSince) >= sc.rateGrace, report)

	for _, name := range sc.counters {
		limit, judged := sc.thresholds[name]
		if !judged {
			continue
		}
		v, ok := st.Counters[name]
		if !ok {
			continue
		}
		r := ps.rates[name]
		if r == nil {
			r = &monitors.Rate{}
			ps.rates[name] = r
		}
		rate, enough := r.Add(now, v, sc.cwn)
		if enough {
			ps.rateNow[name] = rate
		}
		f := base
		f.Code, f.Severity = name, gpuhealthv1alpha1.SeverityDegraded
		f.Message = fmt.Sprintf("%s port %s: %s rose %d over the last %s (%.3g/s, threshold %g/s)", describe(st), st.ID(), name, r.Increase(), sc.cwn, rate, limit)
		sc.tracker.Set(now, f, enough && rate > limit, report)
	}
}

// resolvePort closes every open condition of a port.
func (sc *scanner) resolvePort(now time.Time, st PortStatus, report monitors.Reporter) {
	id := st.ID()
	sc.tracker.ResolveWhere(now, func(f *monitors.Finding) bool {
		return f.Source == gpuhealthv1alpha1.SourceIB && f.Component.ID == id
	}, report)
}

// judgeDevices compares the adapters with ExpectedDevices and, each
// DefaultPCIInterval, with the PCI bus.
func (sc *scanner) judgeDevices(now time.Time, devs []Device, computeDevs map[string]bool, report monitors.Reporter) {
	if want := sc.src.ExpectedDevices; want > 0 {
		f := monitors.Finding{
			Source: gpuhealthv1alpha1.SourceIB, Check: gpuhealthv1alpha1.CheckNIC, Code: CodeHCAMissing,
			Component: gpuhealthv1alpha1.Component{Kind: gpuhealthv1alpha1.ComponentNIC},
			Severity:  gpuhealthv1alpha1.SeverityFatal, Action: gpuhealthv1alpha1.ActionRebootNode,
			Message: fmt.Sprintf("%d adapters with a compute port (%s), %d expected", len(computeDevs),
				strings.Join(slices.Sorted(maps.Keys(computeDevs)), ", "), want),
		}
		short := len(computeDevs) < want
		switch {
		case !short:
			sc.shortSince = time.Time{}
		case sc.shortSince.IsZero():
			sc.shortSince = now
		}
		// A firmware reset or a driver's health recovery unregisters
		// the device for a moment: missing for DownGrace, as a port.
		sc.tracker.Set(now, f, short && now.Sub(sc.shortSince) >= sc.downGrace, report)
	}
	if !sc.pciAt.IsZero() && now.Sub(sc.pciAt) < DefaultPCIInterval {
		return
	}
	sc.pciAt = now
	functions, err := sc.r.scanPCI(sc.sysRoot)
	if err != nil || len(devs) == 0 {
		// No PCI tree, or no RDMA driver at all: nothing to compare.
		return
	}
	have := map[string]bool{}
	for i := range devs {
		have[devs[i].PCI] = true
	}
	missing := map[string]bool{}
	for _, fn := range functions {
		if have[fn] {
			continue
		}
		missing[fn] = true
	}
	// Judge a function missing at two comparisons in a row: an adapter
	// whose driver is still probing at the first is not missing.
	for fn := range sc.pciMissing {
		if missing[fn] {
			continue
		}
		sc.tracker.Set(now, sc.noRDMA(fn), false, report)
	}
	for fn := range missing {
		if sc.pciMissing[fn] {
			sc.tracker.Set(now, sc.noRDMA(fn), true, report)
		}
	}
	sc.pciMissing = missing
}

// noRDMA is the finding of a PCI function without an RDMA device.
func (sc *scanner) noRDMA(fn string) monitors.Finding {
	f := monitors.Finding{
		Source: gpuhealthv1alpha1.SourceIB, Check: gpuhealthv1alpha1.CheckNIC, Code: CodeNoRDMADevice,
		Component: gpuhealthv1alpha1.Component{Kind: gpuhealthv1alpha1.ComponentNIC, ID: fn},
		Severity:  gpuhealthv1alpha1.SeverityDegraded, Action: gpuhealthv1alpha1.ActionNone,
		Message: fmt.Sprintf("Mellanox adapter %s is on the PCI bus with no RDMA device (its driver did not bind) while other adapters have one", fn),
	}
	if matches(sc.src.Devices, &Device{PCI: fn}) {
		f.Severity, f.Action = gpuhealthv1alpha1.SeverityFatal, gpuhealthv1alpha1.ActionRebootNode
		f.Message += "; it is listed as a compute adapter"
	}
	return f
}

// describe names a port's adapter for messages.
func describe(st *PortStatus) string {
	if st.HCAType != "" {
		return st.HCAType
	}
	return "adapter"
}

// stateOf is the port's state for messages.
func stateOf(st *PortStatus) string {
	s := cmp.Or(st.StateText, "unknown state")
	if st.PhysText != "" {
		s += "/" + st.PhysText
	}
	if st.Netdev != "" {
		if st.NetdevUp {
			s += ", " + st.Netdev + " up"
		} else {
			s += ", " + st.Netdev + " not up"
		}
	}
	return s
}
