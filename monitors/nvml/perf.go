package nvml

import (
	"fmt"
	"slices"
	"strconv"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/monitors"
)

// Performance configures the checks that find a GPU that works but is slow
// (docs/monitors.md, "Slow GPUs"). The zero value means the defaults.
type Performance struct {
	// Window is the span the conditions are judged over
	// (DefaultPerformanceWindow when zero).
	Window time.Duration
	// Share is the part of the window a condition must hold for
	// (DefaultShare when zero).
	Share float64
	// BusyUtilization is the GPU utilisation, in percent, from which the
	// GPU counts as busy for the PCIe link judge (DefaultBusyUtilization
	// when zero).
	BusyUtilization uint32
	// PCIeReplayRate is the PCIe replay rate per second above which the
	// link is reported (DefaultPCIeReplayRate when zero).
	PCIeReplayRate float64
	// ThermalMargin is how close, in °C, the GPU may run to its slowdown
	// temperature before the time counts as without margin
	// (DefaultThermalMargin when zero).
	ThermalMargin uint32
	// NVLinkSpeedRatio: a link slower than this share of the fastest
	// active link of its GPU is degraded (DefaultNVLinkSpeedRatio when
	// zero).
	NVLinkSpeedRatio float64
	// Off lists the checks to skip: Throttled, PCIeDegraded, PCIe,
	// MemoryRepair, ECC, ThermalMargin, NVLinkDegraded.
	Off []gpuhealthv1alpha1.Check
}

// Defaults of Performance. They are this project's choices, explained in
// docs/monitors.md, except where they name their source.
const (
	DefaultPerformanceWindow = 5 * time.Minute
	DefaultShare             = 0.5
	DefaultBusyUtilization   = 30
	// DefaultPCIeReplayRate is DCGM's PCIe replay health limit, 8 a minute.
	DefaultPCIeReplayRate   = 8.0 / 60
	DefaultThermalMargin    = 5
	DefaultNVLinkSpeedRatio = 0.95
)

// PerformanceChecks are the checks Performance.Off may name.
var PerformanceChecks = []gpuhealthv1alpha1.Check{
	gpuhealthv1alpha1.CheckThrottled, gpuhealthv1alpha1.CheckPCIeDegraded, gpuhealthv1alpha1.CheckPCIe,
	gpuhealthv1alpha1.CheckMemoryRepair, gpuhealthv1alpha1.CheckECC, gpuhealthv1alpha1.CheckThermalMargin,
	gpuhealthv1alpha1.CheckNVLinkDegraded,
}

func (p Performance) withDefaults() Performance {
	if p.Window <= 0 {
		p.Window = DefaultPerformanceWindow
	}
	if p.Share <= 0 || p.Share > 1 {
		p.Share = DefaultShare
	}
	if p.BusyUtilization == 0 {
		p.BusyUtilization = DefaultBusyUtilization
	}
	if p.PCIeReplayRate <= 0 {
		p.PCIeReplayRate = DefaultPCIeReplayRate
	}
	if p.ThermalMargin == 0 {
		p.ThermalMargin = DefaultThermalMargin
	}
	if p.NVLinkSpeedRatio <= 0 || p.NVLinkSpeedRatio > 1 {
		p.NVLinkSpeedRatio = DefaultNVLinkSpeedRatio
	}
	return p
}

func (p *Performance) on(c gpuhealthv1alpha1.Check) bool { return !slices.Contains(p.Off, c) }

// longEnough says whether a condition held for more than Share of the window.
func (p *Performance) longEnough(held time.Duration) bool {
	return held > time.Duration(p.Share*float64(p.Window))
}

// Codes of the slow-GPU findings.
const (
	CodeThermalViolation     = "THERMAL_VIOLATION"
	CodeReliabilityViolation = "RELIABILITY_VIOLATION"
	CodePCIeGeneration       = "GENERATION"
	CodePCIeWidth            = "WIDTH"
	CodePCIeReplay           = "REPLAY"
	CodeRowRemapPending      = "ROW_REMAP_PENDING"
	CodeRowRemapFailure      = "ROW_REMAP_FAILURE"
	CodeRetiredPagesPending  = "RETIRED_PAGES_PENDING"
	CodeVolatileUncorrected  = "VOLATILE_UNCORRECTED"
	CodeSlowdownMargin       = "SLOWDOWN_MARGIN"
	CodeNVLinkSpeed          = "SPEED"
)

// throttleReason is a clocks event reason the Throttled check judges: the
// GPU slowed itself for heat or power, not because its workload asked for
// less (SW power cap, idle, application clocks, display and sync boost are
// not judged).
type throttleReason struct {
	bit   uint64
	code  string
	label string
}

var throttleReasons = []throttleReason{
	{gonvml.ClocksThrottleReasonHwSlowdown, "HW_SLOWDOWN", "hw_slowdown"},
	{gonvml.ClocksThrottleReasonHwThermalSlowdown, "HW_THERMAL_SLOWDOWN", "hw_thermal_slowdown"},
	{gonvml.ClocksThrottleReasonHwPowerBrakeSlowdown, "HW_POWER_BRAKE_SLOWDOWN", "hw_power_brake_slowdown"},
	{gonvml.ClocksEventReasonSwThermalSlowdown, "SW_THERMAL_SLOWDOWN", "sw_thermal_slowdown"},
}

// swPowerCap is exported as a metric for context but never judged: a
// power cap is the operator's setting or the workload's draw.
var swPowerCap = throttleReason{gonvml.ClocksEventReasonSwPowerCap, "", "sw_power_cap"}

// violationPolicies are the driver's cumulative violation counters read;
// thermal and reliability are judged, power only exported.
var violationPolicies = []struct {
	policy gonvml.PerfPolicyType
	code   string
	label  string
}{
	{gonvml.PERF_POLICY_THERMAL, CodeThermalViolation, "thermal"},
	{gonvml.PERF_POLICY_RELIABILITY, CodeReliabilityViolation, "reliability"},
	{gonvml.PERF_POLICY_POWER, "", "power"},
}

// perfState is what the slow-GPU checks remember about one GPU.
type perfState struct {
	// off holds the signals NVML does not support on this GPU.
	off        map[string]bool
	lastPoll   time.Time
	reasons    map[uint64]*share
	violations map[gonvml.PerfPolicyType]*rate
	pcie       map[string]*share
	replays    rate
	ecc        uint64
	eccKnown   bool
	thermal    share
	links      map[int]*share
	// legacySpeed is set once the scoped NVLink speed field is found
	// unsupported: the per-link fields of older drivers are read instead.
	legacySpeed bool
}

func newPerfState() *perfState {
	return &perfState{
		off:        map[string]bool{},
		reasons:    map[uint64]*share{},
		violations: map[gonvml.PerfPolicyType]*rate{},
		pcie:       map[string]*share{},
		links:      map[int]*share{},
	}
}

// supported says whether a read of signal succeeded. NOT_SUPPORTED turns
// the signal off for the GPU, logged once; a lost GPU is errLost; any other
// error is taken as transient (the next poll reads again).
func (s *Source) supported(d *device, signal string, ret gonvml.Return) (bool, error) {
	switch ret {
	case gonvml.SUCCESS:
		return true, nil
	case gonvml.ERROR_GPU_IS_LOST:
		return false, errLost
	case gonvml.ERROR_NOT_SUPPORTED, gonvml.ERROR_FUNCTION_NOT_FOUND:
		s.turnOff(d, signal)
	}
	return false, nil
}

// turnOff stops reading signal on the GPU, and says so once.
func (s *Source) turnOff(d *device, signal string) {
	if d.perf.off[signal] {
		return
	}
	d.perf.off[signal] = true
	s.Log.Info("GPU does not report this signal; its check is off for this GPU", "gpu", d.uuid, "signal", signal)
}

// hasSymbol says whether the loaded NVML library exports name; a library
// that cannot say (go-nvml's mock) is taken to have it.
func (s *Source) hasSymbol(name string) bool {
	if s.lookup == nil {
		return true
	}
	return s.lookup(name) == nil
}

// pollPerformance runs the slow-GPU checks on one GPU; up lists its NVLinks
// that are up.
func (s *Source) pollPerformance(now time.Time, d *device, up []int, tracker *monitors.Tracker, report monitors.Reporter) error {
	p := s.Performance.withDefaults()
	if d.perf == nil {
		d.perf = newPerfState()
	}
	labels := []string{strconv.Itoa(d.index), d.uuid}
	for _, judge := range []func(time.Time, *device, *Performance, []string, *monitors.Tracker, monitors.Reporter) error{
		s.judgeClocks, s.judgePCIe, s.judgeMemory, s.judgeThermalMargin,
	} {
		if err := judge(now, d, &p, labels, tracker, report); err != nil {
			return err
		}
	}
	err := s.judgeNVLinkSpeed(now, d, &p, up, labels, tracker, report)
	d.perf.lastPoll = now
	return err
}

func gpuFinding(d *device, check gpuhealthv1alpha1.Check, code string, severity gpuhealthv1alpha1.Severity, action gpuhealthv1alpha1.Action, message string) monitors.Finding {
	return monitors.Finding{
		Source:    gpuhealthv1alpha1.SourceNVML,
		Check:     check,
		Component: gpuhealthv1alpha1.Component{Kind: gpuhealthv1alpha1.ComponentGPU, ID: d.uuid},
		Code:      code,
		Severity:  severity,
		Action:    action,
		Message:   message,
	}
}

func percent(part, whole time.Duration) float64 {
	if whole <= 0 {
		return 0
	}
	return 100 * float64(part) / float64(whole)
}

// judgeClocks is the Throttled check: clocks event reasons active for more
// than Share of the window, and the driver's thermal and reliability
// violation time growing faster than Share of the wall clock.
func (s *Source) judgeClocks(now time.Time, d *device, p *Performance, labels []string, tracker *monitors.Tracker, report monitors.Reporter) error {
	if !p.on(gpuhealthv1alpha1.CheckThrottled) {
		return nil
	}
	if !d.perf.off["clocks event reasons"] {
		var reasons uint64
		var ret gonvml.Return
		if s.hasSymbol("nvmlDeviceGetCurrentClocksEventReasons") {
			reasons, ret = d.handle.GetCurrentClocksEventReasons()
		} else {
			reasons, ret = d.handle.GetCurrentClocksThrottleReasons() // drivers before 535
		}
		ok, err := s.supported(d, "clocks event reasons", ret)
		if err != nil {
			return err
		}
		if ok {
			sm, _ := d.handle.GetClockInfo(gonvml.CLOCK_SM)
			smMax, _ := d.handle.GetMaxClockInfo(gonvml.CLOCK_SM)
			smClock.WithLabelValues(labels...).Set(float64(sm))
			smClockMax.WithLabelValues(labels...).Set(float64(smMax))
			since := time.Duration(0)
			if !d.perf.lastPoll.IsZero() {
				since = now.Sub(d.perf.lastPoll)
			}
			for _, r := range append(throttleReasons, swPowerCap) {
				active := reasons&r.bit != 0
				if active && since > 0 {
					clocksEventSeconds.WithLabelValues(append(labels, r.label)...).Add(since.Seconds())
				}
				if r.code == "" {
					continue
				}
				sh := d.perf.reasons[r.bit]
				if sh == nil {
					sh = &share{}
					d.perf.reasons[r.bit] = sh
				}
				held, _ := sh.add(now, active, true, p.Window)
				tracker.Set(now, gpuFinding(d, gpuhealthv1alpha1.CheckThrottled, r.code, gpuhealthv1alpha1.SeverityDegraded, gpuhealthv1alpha1.ActionRecertify,
					fmt.Sprintf("GPU %d (%s) clocks held down by %s for %.0f%% of the last %s (threshold %.0f%%); SM clock %d of %d MHz",
						d.index, d.uuid, r.code, percent(held, p.Window), p.Window, 100*p.Share, sm, smMax)),
					p.longEnough(held), report)
			}
		}
	}
	for _, v := range violationPolicies {
		signal := "violation time " + v.label
		if d.perf.off[signal] {
			continue
		}
		vt, ret := d.handle.GetViolationStatus(v.policy)
		ok, err := s.supported(d, signal, ret)
		if err != nil {
			return err
		}
		if !ok {
			continue
		}
		violationSeconds.WithLabelValues(append(labels, v.label)...).Set(float64(vt.ViolationTime) / 1e9)
		if v.code == "" {
			continue
		}
		r := d.perf.violations[v.policy]
		if r == nil {
			r = &rate{}
			d.perf.violations[v.policy] = r
		}
		if _, known := r.add(now, vt.ViolationTime, p.Window); !known {
			continue
		}
		held := time.Duration(r.increase())
		tracker.Set(now, gpuFinding(d, gpuhealthv1alpha1.CheckThrottled, v.code, gpuhealthv1alpha1.SeverityDegraded, gpuhealthv1alpha1.ActionRecertify,
			fmt.Sprintf("GPU %d (%s) in %s violation for %s of the last %s (threshold %.0f%%)",
				d.index, d.uuid, v.label, held.Round(time.Second), p.Window, 100*p.Share)),
			p.longEnough(held), report)
	}
	return nil
}

// judgePCIe is the PCIeDegraded check (the link below the generation or
// width the GPU and its slot support, judged only while the GPU is busy,
// since links legitimately slow down when idle) and the PCIe replay rate.
func (s *Source) judgePCIe(now time.Time, d *device, p *Performance, labels []string, tracker *monitors.Tracker, report monitors.Reporter) error {
	if p.on(gpuhealthv1alpha1.CheckPCIeDegraded) && !d.perf.off["pcie link"] && !d.perf.off["utilization"] {
		gen, ret := d.handle.GetCurrPcieLinkGeneration()
		if ok, err := s.supported(d, "pcie link", ret); !ok {
			return err
		}
		width, _ := d.handle.GetCurrPcieLinkWidth()
		maxGen, ret := d.handle.GetMaxPcieLinkGeneration()
		if ret != gonvml.SUCCESS && s.hasSymbol("nvmlDeviceGetGpuMaxPcieLinkGeneration") {
			maxGen, _ = d.handle.GetGpuMaxPcieLinkGeneration()
		}
		maxWidth, _ := d.handle.GetMaxPcieLinkWidth()
		util, ret := d.handle.GetUtilizationRates()
		if ok, err := s.supported(d, "utilization", ret); !ok {
			return err
		}
		pcieGeneration.WithLabelValues(labels...).Set(float64(gen))
		pcieGenerationMax.WithLabelValues(labels...).Set(float64(maxGen))
		pcieWidth.WithLabelValues(labels...).Set(float64(width))
		pcieWidthMax.WithLabelValues(labels...).Set(float64(maxWidth))
		utilization.WithLabelValues(labels...).Set(float64(util.Gpu) / 100)
		busy := util.Gpu >= p.BusyUtilization
		link := fmt.Sprintf("gen %d x%d, below the gen %d x%d it and its slot support,", gen, width, maxGen, maxWidth)
		for _, c := range []struct {
			code     string
			cur, max int
			action   gpuhealthv1alpha1.Action
		}{
			{CodePCIeGeneration, gen, maxGen, gpuhealthv1alpha1.ActionRecertify},
			{CodePCIeWidth, width, maxWidth, gpuhealthv1alpha1.ActionRebootNode},
		} {
			sh := d.perf.pcie[c.code]
			if sh == nil {
				sh = &share{}
				d.perf.pcie[c.code] = sh
			}
			held, busyTime := sh.add(now, c.max > 0 && c.cur < c.max, busy, p.Window)
			f := gpuFinding(d, gpuhealthv1alpha1.CheckPCIeDegraded, c.code, gpuhealthv1alpha1.SeverityDegraded, c.action,
				fmt.Sprintf("GPU %d (%s) PCIe link %s %s for %.0f%% of its busy time over the last %s (busy %.0f%% of the window; utilisation now %d%%)",
					d.index, d.uuid, c.code, link, percent(held, busyTime), p.Window, percent(busyTime, p.Window), util.Gpu))
			// Too little busy time says nothing: the verdict stands.
			holds := tracker.Open(f.Key())
			if p.longEnough(busyTime) {
				holds = float64(held) > p.Share*float64(busyTime)
			}
			tracker.Set(now, f, holds, report)
		}
	}
	if p.on(gpuhealthv1alpha1.CheckPCIe) && !d.perf.off["pcie replays"] {
		v, ret := d.handle.GetPcieReplayCounter()
		ok, err := s.supported(d, "pcie replays", ret)
		if err != nil {
			return err
		}
		if ok {
			pcieReplays.WithLabelValues(labels...).Set(float64(v))
			if perSecond, known := d.perf.replays.add(now, uint64(v), p.Window); known {
				tracker.Set(now, gpuFinding(d, gpuhealthv1alpha1.CheckPCIe, CodePCIeReplay, gpuhealthv1alpha1.SeverityDegraded, gpuhealthv1alpha1.ActionRecertify,
					fmt.Sprintf("GPU %d (%s) PCIe replays at %.2f/s over the last %s (threshold %.3g/s)", d.index, d.uuid, perSecond, p.Window, p.PCIeReplayRate)),
					perSecond > p.PCIeReplayRate, report)
			}
		}
	}
	return nil
}

// judgeMemory is the MemoryRepair check (row remapping on Ampere and
// later, retired pages before) and the volatile uncorrected ECC count.
func (s *Source) judgeMemory(now time.Time, d *device, p *Performance, labels []string, tracker *monitors.Tracker, report monitors.Reporter) error {
	if p.on(gpuhealthv1alpha1.CheckMemoryRepair) && !d.perf.off["row remapping"] {
		corr, unc, pending, failed, ret := d.handle.GetRemappedRows()
		ok, err := s.supported(d, "row remapping", ret)
		if err != nil {
			return err
		}
		if ok {
			remappedRows.WithLabelValues(append(labels, "correctable")...).Set(float64(corr))
			remappedRows.WithLabelValues(append(labels, "uncorrectable")...).Set(float64(unc))
			remapPending.WithLabelValues(labels...).Set(b2f(pending))
			remapFailure.WithLabelValues(labels...).Set(b2f(failed))
			rows := fmt.Sprintf("%d rows remapped for correctable and %d for uncorrectable errors", corr, unc)
			tracker.Set(now, gpuFinding(d, gpuhealthv1alpha1.CheckMemoryRepair, CodeRowRemapPending, gpuhealthv1alpha1.SeverityDegraded, gpuhealthv1alpha1.ActionResetGPU,
				fmt.Sprintf("GPU %d (%s) has a row remap pending: a GPU reset applies it (%s)", d.index, d.uuid, rows)), pending, report)
			tracker.Set(now, gpuFinding(d, gpuhealthv1alpha1.CheckMemoryRepair, CodeRowRemapFailure, gpuhealthv1alpha1.SeverityFatal, gpuhealthv1alpha1.ActionContactSupport,
				fmt.Sprintf("GPU %d (%s) failed to remap a row of its memory (%s)", d.index, d.uuid, rows)), failed, report)
		}
	}
	if p.on(gpuhealthv1alpha1.CheckMemoryRepair) && !d.perf.off["retired pages"] {
		pending, ret := d.handle.GetRetiredPagesPendingStatus()
		ok, err := s.supported(d, "retired pages", ret)
		if err != nil {
			return err
		}
		if ok {
			tracker.Set(now, gpuFinding(d, gpuhealthv1alpha1.CheckMemoryRepair, CodeRetiredPagesPending, gpuhealthv1alpha1.SeverityDegraded, gpuhealthv1alpha1.ActionResetGPU,
				fmt.Sprintf("GPU %d (%s) has memory pages pending retirement: a GPU reset retires them", d.index, d.uuid)), pending == gonvml.FEATURE_ENABLED, report)
		}
	}
	if p.on(gpuhealthv1alpha1.CheckECC) && !d.perf.off["ecc"] {
		v, ret := d.handle.GetTotalEccErrors(gonvml.MEMORY_ERROR_TYPE_UNCORRECTED, gonvml.VOLATILE_ECC)
		ok, err := s.supported(d, "ecc", ret)
		if err != nil {
			return err
		}
		// Only a rise is reported: the count at start is the driver's since
		// it loaded, which an agent restart would otherwise report again.
		if ok && d.perf.eccKnown && v > d.perf.ecc {
			f := gpuFinding(d, gpuhealthv1alpha1.CheckECC, CodeVolatileUncorrected, gpuhealthv1alpha1.SeverityDegraded, gpuhealthv1alpha1.ActionResetGPU,
				fmt.Sprintf("GPU %d (%s) volatile uncorrected ECC errors rose from %d to %d", d.index, d.uuid, d.perf.ecc, v))
			f.Time, f.Count = now, int64(min(v-d.perf.ecc, 1<<40))
			report(f)
		}
		if ok {
			d.perf.ecc, d.perf.eccKnown = v, true
		}
	}
	return nil
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// judgeThermalMargin is the ThermalMargin check: the GPU within
// ThermalMargin °C of its slowdown temperature for more than Share of the
// window.
func (s *Source) judgeThermalMargin(now time.Time, d *device, p *Performance, labels []string, tracker *monitors.Tracker, report monitors.Reporter) error {
	if !p.on(gpuhealthv1alpha1.CheckThermalMargin) || d.perf.off["temperature"] {
		return nil
	}
	temp, ret := d.handle.GetTemperature(gonvml.TEMPERATURE_GPU)
	if ok, err := s.supported(d, "temperature", ret); !ok {
		return err
	}
	slowdown, ret := d.handle.GetTemperatureThreshold(gonvml.TEMPERATURE_THRESHOLD_SLOWDOWN)
	if ok, err := s.supported(d, "temperature", ret); !ok {
		return err
	}
	temperature.WithLabelValues(labels...).Set(float64(temp))
	slowdownTemperature.WithLabelValues(labels...).Set(float64(slowdown))
	near := int64(temp)+int64(p.ThermalMargin) >= int64(slowdown)
	held, _ := d.perf.thermal.add(now, near, true, p.Window)
	tracker.Set(now, gpuFinding(d, gpuhealthv1alpha1.CheckThermalMargin, CodeSlowdownMargin, gpuhealthv1alpha1.SeverityInfo, gpuhealthv1alpha1.ActionNone,
		fmt.Sprintf("GPU %d (%s) at %d°C, within %d°C of its slowdown temperature %d°C for %.0f%% of the last %s (threshold %.0f%%)",
			d.index, d.uuid, temp, p.ThermalMargin, slowdown, percent(held, p.Window), p.Window, 100*p.Share)),
		p.longEnough(held), report)
	return nil
}

// judgeNVLinkSpeed is the NVLinkDegraded check: an active link slower than
// NVLinkSpeedRatio of the fastest active link of the same GPU for more
// than Share of the window.
func (s *Source) judgeNVLinkSpeed(now time.Time, d *device, p *Performance, up []int, labels []string, tracker *monitors.Tracker, report monitors.Reporter) error {
	if !p.on(gpuhealthv1alpha1.CheckNVLinkDegraded) || d.perf.off["nvlink speed"] || len(up) < 2 {
		return nil
	}
	speeds, err := s.readLinkSpeeds(d, up)
	if err != nil || len(speeds) < 2 {
		return err
	}
	var fastest uint64
	for _, v := range speeds {
		fastest = max(fastest, v)
	}
	for _, l := range up {
		v, ok := speeds[l]
		if !ok {
			continue
		}
		nvlinkSpeed.WithLabelValues(append(labels, strconv.Itoa(l))...).Set(float64(v))
		sh := d.perf.links[l]
		if sh == nil {
			sh = &share{}
			d.perf.links[l] = sh
		}
		held, _ := sh.add(now, float64(v) < p.NVLinkSpeedRatio*float64(fastest), true, p.Window)
		tracker.Set(now, monitors.Finding{
			Source:    gpuhealthv1alpha1.SourceNVML,
			Check:     gpuhealthv1alpha1.CheckNVLinkDegraded,
			Component: gpuhealthv1alpha1.Component{Kind: gpuhealthv1alpha1.ComponentNVLink, ID: d.uuid + "/link-" + strconv.Itoa(l)},
			Code:      CodeNVLinkSpeed,
			Severity:  gpuhealthv1alpha1.SeverityDegraded,
			Action:    gpuhealthv1alpha1.ActionRecertify,
			Message: fmt.Sprintf("NVLink %d of GPU %d (%s) at %d MB/s, below the %d MB/s of the GPU's fastest link, for %.0f%% of the last %s",
				l, d.index, d.uuid, v, fastest, percent(held, p.Window), p.Window),
		}, p.longEnough(held), report)
	}
	return nil
}

// legacySpeedField is the per-link speed field of drivers without the
// scoped NVML_FI_DEV_NVLINK_GET_SPEED: links 0-5 and 6-11 only.
func legacySpeedField(link int) (uint32, bool) {
	switch {
	case link < 6:
		return gonvml.FI_DEV_NVLINK_SPEED_MBPS_L0 + uint32(link), true
	case link < 12:
		return gonvml.FI_DEV_NVLINK_SPEED_MBPS_L6 + uint32(link-6), true
	}
	return 0, false
}

// readLinkSpeeds reads the speed of each link in up, in MB/s, in one call.
func (s *Source) readLinkSpeeds(d *device, up []int) (map[int]uint64, error) {
	values := make([]gonvml.FieldValue, 0, len(up))
	for _, l := range up {
		if !d.perf.legacySpeed {
			values = append(values, gonvml.FieldValue{FieldId: gonvml.FI_DEV_NVLINK_GET_SPEED, ScopeId: uint32(l)})
		} else if id, ok := legacySpeedField(l); ok {
			values = append(values, gonvml.FieldValue{FieldId: id, ScopeId: uint32(l)})
		}
	}
	if len(values) == 0 {
		d.perf.off["nvlink speed"] = true
		return nil, nil
	}
	ret := d.handle.GetFieldValues(values)
	if ok, err := s.supported(d, "nvlink speed", ret); !ok {
		return nil, err
	}
	speeds := map[int]uint64{}
	unsupported := 0
	for _, v := range values {
		switch r := gonvml.Return(v.NvmlReturn); r {
		case gonvml.SUCCESS:
			if x, ok := fieldUint(v); ok {
				speeds[int(v.ScopeId)] = x
			}
		case gonvml.ERROR_GPU_IS_LOST:
			return nil, errLost
		case gonvml.ERROR_NOT_SUPPORTED:
			unsupported++
		}
	}
	if unsupported == len(values) {
		if !d.perf.legacySpeed {
			d.perf.legacySpeed = true
			return s.readLinkSpeeds(d, up)
		}
		s.turnOff(d, "nvlink speed")
	}
	return speeds, nil
}

// fieldUint decodes an unsigned field value (little-endian, as NVML's
// union is on the platforms it runs on).
func fieldUint(v gonvml.FieldValue) (uint64, bool) {
	var x uint64
	switch gonvml.ValueType(v.ValueType) {
	case gonvml.VALUE_TYPE_UNSIGNED_INT:
		for i := 3; i >= 0; i-- {
			x = x<<8 | uint64(v.Value[i])
		}
	case gonvml.VALUE_TYPE_UNSIGNED_LONG, gonvml.VALUE_TYPE_UNSIGNED_LONG_LONG:
		for i := 7; i >= 0; i-- {
			x = x<<8 | uint64(v.Value[i])
		}
	default:
		return 0, false
	}
	return x, true
}
