package slowgpu

import (
	"fmt"
	"slices"
	"strconv"
	"time"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/monitors"
)

// Config configures the checks. The zero value means the defaults.
type Config struct {
	// Window is the span the conditions are judged over (DefaultWindow
	// when zero).
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
	// Off lists the checks to skip (any of Checks).
	Off []gpuhealthv1alpha1.Check
}

// Defaults of Config. They are this project's choices, explained in
// docs/monitors.md, except where they name their source.
const (
	DefaultWindow          = 5 * time.Minute
	DefaultShare           = 0.5
	DefaultBusyUtilization = 30
	// DefaultPCIeReplayRate is DCGM's PCIe replay health limit, 8 a minute.
	DefaultPCIeReplayRate   = 8.0 / 60
	DefaultThermalMargin    = 5
	DefaultNVLinkSpeedRatio = 0.95
)

// Checks are the checks this package judges, which Config.Off may name.
var Checks = []gpuhealthv1alpha1.Check{
	gpuhealthv1alpha1.CheckThrottled, gpuhealthv1alpha1.CheckPCIeDegraded, gpuhealthv1alpha1.CheckPCIe,
	gpuhealthv1alpha1.CheckMemoryRepair, gpuhealthv1alpha1.CheckECC, gpuhealthv1alpha1.CheckThermalMargin,
	gpuhealthv1alpha1.CheckNVLinkDegraded,
}

// WithDefaults fills what is unset.
func (c Config) WithDefaults() Config {
	if c.Window <= 0 {
		c.Window = DefaultWindow
	}
	if c.Share <= 0 || c.Share > 1 {
		c.Share = DefaultShare
	}
	if c.BusyUtilization == 0 {
		c.BusyUtilization = DefaultBusyUtilization
	}
	if c.PCIeReplayRate <= 0 {
		c.PCIeReplayRate = DefaultPCIeReplayRate
	}
	if c.ThermalMargin == 0 {
		c.ThermalMargin = DefaultThermalMargin
	}
	if c.NVLinkSpeedRatio <= 0 || c.NVLinkSpeedRatio > 1 {
		c.NVLinkSpeedRatio = DefaultNVLinkSpeedRatio
	}
	return c
}

// On says whether check c is judged.
func (c *Config) On(check gpuhealthv1alpha1.Check) bool { return !slices.Contains(c.Off, check) }

// longEnough says whether a condition held for more than Share of the window.
func (c *Config) longEnough(held time.Duration) bool {
	return held > time.Duration(c.Share*float64(c.Window))
}

// Codes of the findings.
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

// The clocks event reason bits (nvml.h's nvmlClocksEventReason*, which
// DCGM's DCGM_FI_DEV_CLOCKS_EVENT_REASONS reports as they are).
const (
	ReasonSWPowerCap   uint64 = 0x4
	ReasonHWSlowdown   uint64 = 0x8
	ReasonSWThermal    uint64 = 0x20
	ReasonHWThermal    uint64 = 0x40
	ReasonHWPowerBrake uint64 = 0x80
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
	{ReasonHWSlowdown, "HW_SLOWDOWN", "hw_slowdown"},
	{ReasonHWThermal, "HW_THERMAL_SLOWDOWN", "hw_thermal_slowdown"},
	{ReasonHWPowerBrake, "HW_POWER_BRAKE_SLOWDOWN", "hw_power_brake_slowdown"},
	{ReasonSWThermal, "SW_THERMAL_SLOWDOWN", "sw_thermal_slowdown"},
}

// swPowerCap is exported as a metric for context but never judged: a
// power cap is the operator's setting or the workload's draw.
var swPowerCap = throttleReason{ReasonSWPowerCap, "", "sw_power_cap"}

// Policy names one of the driver's cumulative violation counters.
type Policy string

// The violation counters read; thermal and reliability are judged, power
// only exported.
const (
	PolicyPower       Policy = "power"
	PolicyThermal     Policy = "thermal"
	PolicyReliability Policy = "reliability"
)

var judgedPolicies = map[Policy]string{PolicyThermal: CodeThermalViolation, PolicyReliability: CodeReliabilityViolation}

// Clocks is the clocks event reasons and the SM clock.
type Clocks struct {
	Reasons   uint64
	SM, SMMax uint32
}

// PCIe is the PCIe link now and at most, with the GPU's utilisation.
type PCIe struct {
	// Each is 0 when it could not be read: that pair is not judged.
	Generation, Width, MaxGeneration, MaxWidth int
	// Utilization is the GPU's utilisation in percent.
	Utilization uint32
}

// Remap is the GPU's row remapping state.
type Remap struct {
	Correctable, Uncorrectable int
	Pending, Failed            bool
}

// Temperature is the GPU's temperature and its slowdown threshold in °C.
type Temperature struct {
	GPU, Slowdown uint32
}

// Reading is what one poll read of a GPU. A nil pointer or map is a signal
// not read (not supported, or the read failed): its checks keep their
// state until it is read again.
type Reading struct {
	Clocks *Clocks
	// Violations are the driver's cumulative violation times.
	Violations map[Policy]time.Duration
	PCIe       *PCIe
	// Replays is the PCIe replay counter.
	Replays *uint64
	Remap   *Remap
	// RetiredPending says pages wait for retirement (GPUs before Ampere).
	RetiredPending *bool
	// VolatileUncorrected is the volatile uncorrected ECC count.
	VolatileUncorrected *uint64
	Temperature         *Temperature
	// LinkSpeeds are the speeds of the GPU's active NVLinks in MB/s.
	LinkSpeeds map[int]uint64
}

// Judge keeps the history of one GPU's signals. It is not safe for
// concurrent use.
type Judge struct {
	// Source is the source the findings are from.
	Source gpuhealthv1alpha1.Source
	// Index and UUID identify the GPU (the UUID is the findings' component).
	Index int
	UUID  string
	// Config is used with its defaults filled.
	Config Config
	// Metrics says whether to export the signals (the nvml source does;
	// DCGM's own exporter exports its fields).
	Metrics bool

	lastPoll   time.Time
	reasons    map[uint64]*share
	violations map[Policy]*monitors.Rate
	pcie       map[string]*share
	replays    monitors.Rate
	ecc        uint64
	eccKnown   bool
	thermal    share
	links      map[int]*share
}

// Repeat is how often a condition that holds is reported again: once a
// judging window, so that each report is one more occurrence for a policy
// rule's debounce, or every general (the source's repeat for its other
// conditions) where that is shorter; a general of zero is not set.
func (c Config) Repeat(general time.Duration) time.Duration {
	window := c.WithDefaults().Window
	if general > 0 {
		return min(window, general)
	}
	return window
}

func (j *Judge) finding(check gpuhealthv1alpha1.Check, code string, severity gpuhealthv1alpha1.Severity, action gpuhealthv1alpha1.Action, message string) monitors.Finding {
	return monitors.Finding{
		Source:    j.Source,
		Check:     check,
		Component: gpuhealthv1alpha1.Component{Kind: gpuhealthv1alpha1.ComponentGPU, ID: j.UUID},
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

// Observe judges one poll's reading at now, reporting through tracker what
// started, holds or ended (and a rise of the ECC count directly).
func (j *Judge) Observe(now time.Time, r Reading, tracker *monitors.Tracker, report monitors.Reporter) {
	c := j.Config.WithDefaults()
	if j.reasons == nil {
		j.reasons, j.violations, j.pcie, j.links = map[uint64]*share{}, map[Policy]*monitors.Rate{}, map[string]*share{}, map[int]*share{}
	}
	labels := []string{strconv.Itoa(j.Index), j.UUID}
	j.clocks(now, &c, r, labels, tracker, report)
	j.pcieLink(now, &c, r, labels, tracker, report)
	j.memory(now, &c, r, labels, tracker, report)
	j.thermalMargin(now, &c, r, labels, tracker, report)
	j.nvlinkSpeed(now, &c, r, labels, tracker, report)
	j.lastPoll = now
}

func shareOf[K comparable](m map[K]*share, k K) *share {
	s := m[k]
	if s == nil {
		s = &share{}
		m[k] = s
	}
	return s
}

// clocks is the Throttled check: clocks event reasons active for more than
// Share of the window, and the driver's thermal and reliability violation
// time growing by more than Share of the window.
func (j *Judge) clocks(now time.Time, c *Config, r Reading, labels []string, tracker *monitors.Tracker, report monitors.Reporter) {
	if !c.On(gpuhealthv1alpha1.CheckThrottled) {
		return
	}
	if ck := r.Clocks; ck != nil {
		if j.Metrics {
			smClock.WithLabelValues(labels...).Set(float64(ck.SM))
			smClockMax.WithLabelValues(labels...).Set(float64(ck.SMMax))
		}
		since := time.Duration(0)
		if !j.lastPoll.IsZero() {
			since = now.Sub(j.lastPoll)
		}
		for _, reason := range append(throttleReasons, swPowerCap) {
			active := ck.Reasons&reason.bit != 0
			if j.Metrics && active && since > 0 {
				clocksEventSeconds.WithLabelValues(append(labels, reason.label)...).Add(since.Seconds())
			}
			if reason.code == "" {
				continue
			}
			held, _ := shareOf(j.reasons, reason.bit).add(now, active, true, c.Window)
			tracker.Set(now, j.finding(gpuhealthv1alpha1.CheckThrottled, reason.code, gpuhealthv1alpha1.SeverityDegraded, gpuhealthv1alpha1.ActionRecertify,
				fmt.Sprintf("GPU %d (%s) clocks held down by %s for %.0f%% of the last %s (threshold %.0f%%); SM clock %d of %d MHz",
					j.Index, j.UUID, reason.code, percent(held, c.Window), c.Window, 100*c.Share, ck.SM, ck.SMMax)),
				c.longEnough(held), report)
		}
	}
	for _, p := range []Policy{PolicyThermal, PolicyReliability, PolicyPower} {
		v, ok := r.Violations[p]
		if !ok {
			continue
		}
		if j.Metrics {
			violationSeconds.WithLabelValues(append(labels, string(p))...).Set(v.Seconds())
		}
		code, judged := judgedPolicies[p]
		if !judged {
			continue
		}
		rt := j.violations[p]
		if rt == nil {
			rt = &monitors.Rate{}
			j.violations[p] = rt
		}
		if _, known := rt.Add(now, uint64(v), c.Window); !known {
			continue
		}
		held := time.Duration(rt.Increase())
		tracker.Set(now, j.finding(gpuhealthv1alpha1.CheckThrottled, code, gpuhealthv1alpha1.SeverityDegraded, gpuhealthv1alpha1.ActionRecertify,
			fmt.Sprintf("GPU %d (%s) in %s violation for %s of the last %s (threshold %.0f%%)",
				j.Index, j.UUID, p, held.Round(time.Second), c.Window, 100*c.Share)),
			c.longEnough(held), report)
	}
}

// pcieLink is the PCIeDegraded check (the link below the generation or
// width the GPU and its slot support, judged only while the GPU is busy,
// since links legitimately slow down when idle) and the PCIe replay rate.
func (j *Judge) pcieLink(now time.Time, c *Config, r Reading, labels []string, tracker *monitors.Tracker, report monitors.Reporter) {
	if p := r.PCIe; p != nil && c.On(gpuhealthv1alpha1.CheckPCIeDegraded) {
		if j.Metrics {
			pcieGeneration.WithLabelValues(labels...).Set(float64(p.Generation))
			pcieGenerationMax.WithLabelValues(labels...).Set(float64(p.MaxGeneration))
			pcieWidth.WithLabelValues(labels...).Set(float64(p.Width))
			pcieWidthMax.WithLabelValues(labels...).Set(float64(p.MaxWidth))
			utilization.WithLabelValues(labels...).Set(float64(p.Utilization) / 100)
		}
		busy := p.Utilization >= c.BusyUtilization
		link := fmt.Sprintf("gen %d x%d, below the gen %d x%d it and its slot support,", p.Generation, p.Width, p.MaxGeneration, p.MaxWidth)
		for _, l := range []struct {
			code     string
			cur, max int
			action   gpuhealthv1alpha1.Action
		}{
			{CodePCIeGeneration, p.Generation, p.MaxGeneration, gpuhealthv1alpha1.ActionRecertify},
			{CodePCIeWidth, p.Width, p.MaxWidth, gpuhealthv1alpha1.ActionRebootNode},
		} {
			// A value not read (0) is time that counts neither way: a failed
			// width read is no link of width 0.
			read := l.cur > 0 && l.max > 0
			held, busyTime := shareOf(j.pcie, l.code).add(now, read && l.cur < l.max, busy && read, c.Window)
			f := j.finding(gpuhealthv1alpha1.CheckPCIeDegraded, l.code, gpuhealthv1alpha1.SeverityDegraded, l.action,
				fmt.Sprintf("GPU %d (%s) PCIe link %s %s for %.0f%% of its busy time over the last %s (busy %.0f%% of the window; utilisation now %d%%)",
					j.Index, j.UUID, l.code, link, percent(held, busyTime), c.Window, percent(busyTime, c.Window), p.Utilization))
			// Too little busy time says nothing: the verdict stands.
			holds := tracker.Open(f.Key())
			if c.longEnough(busyTime) {
				holds = float64(held) > c.Share*float64(busyTime)
			}
			tracker.Set(now, f, holds, report)
		}
	}
	if r.Replays != nil && c.On(gpuhealthv1alpha1.CheckPCIe) {
		if j.Metrics {
			pcieReplays.WithLabelValues(labels...).Set(float64(*r.Replays))
		}
		if perSecond, known := j.replays.Add(now, *r.Replays, c.Window); known {
			tracker.Set(now, j.finding(gpuhealthv1alpha1.CheckPCIe, CodePCIeReplay, gpuhealthv1alpha1.SeverityDegraded, gpuhealthv1alpha1.ActionRecertify,
				fmt.Sprintf("GPU %d (%s) PCIe replays at %.2f/s over the last %s (threshold %.3g/s)", j.Index, j.UUID, perSecond, c.Window, c.PCIeReplayRate)),
				perSecond > c.PCIeReplayRate, report)
		}
	}
}

// memory is the MemoryRepair check (row remapping on Ampere and later,
// retired pages before) and the volatile uncorrected ECC count.
func (j *Judge) memory(now time.Time, c *Config, r Reading, labels []string, tracker *monitors.Tracker, report monitors.Reporter) {
	if m := r.Remap; m != nil && c.On(gpuhealthv1alpha1.CheckMemoryRepair) {
		if j.Metrics {
			remappedRows.WithLabelValues(append(labels, "correctable")...).Set(float64(m.Correctable))
			remappedRows.WithLabelValues(append(labels, "uncorrectable")...).Set(float64(m.Uncorrectable))
			remapPending.WithLabelValues(labels...).Set(b2f(m.Pending))
			remapFailure.WithLabelValues(labels...).Set(b2f(m.Failed))
		}
		rows := fmt.Sprintf("%d rows remapped for correctable and %d for uncorrectable errors", m.Correctable, m.Uncorrectable)
		tracker.Set(now, j.finding(gpuhealthv1alpha1.CheckMemoryRepair, CodeRowRemapPending, gpuhealthv1alpha1.SeverityDegraded, gpuhealthv1alpha1.ActionResetGPU,
			fmt.Sprintf("GPU %d (%s) has a row remap pending: a GPU reset applies it (%s)", j.Index, j.UUID, rows)), m.Pending, report)
		tracker.Set(now, j.finding(gpuhealthv1alpha1.CheckMemoryRepair, CodeRowRemapFailure, gpuhealthv1alpha1.SeverityFatal, gpuhealthv1alpha1.ActionContactSupport,
			fmt.Sprintf("GPU %d (%s) failed to remap a row of its memory (%s)", j.Index, j.UUID, rows)), m.Failed, report)
	}
	if r.RetiredPending != nil && c.On(gpuhealthv1alpha1.CheckMemoryRepair) {
		tracker.Set(now, j.finding(gpuhealthv1alpha1.CheckMemoryRepair, CodeRetiredPagesPending, gpuhealthv1alpha1.SeverityDegraded, gpuhealthv1alpha1.ActionResetGPU,
			fmt.Sprintf("GPU %d (%s) has memory pages pending retirement: a GPU reset retires them", j.Index, j.UUID)), *r.RetiredPending, report)
	}
	if r.VolatileUncorrected != nil && c.On(gpuhealthv1alpha1.CheckECC) {
		v := *r.VolatileUncorrected
		// Only a rise is reported: the count at start is the driver's since
		// it loaded, which an agent restart would otherwise report again.
		if j.eccKnown && v > j.ecc {
			f := j.finding(gpuhealthv1alpha1.CheckECC, CodeVolatileUncorrected, gpuhealthv1alpha1.SeverityDegraded, gpuhealthv1alpha1.ActionResetGPU,
				fmt.Sprintf("GPU %d (%s) volatile uncorrected ECC errors rose from %d to %d", j.Index, j.UUID, j.ecc, v))
			f.Time, f.Count = now, int64(min(v-j.ecc, 1<<40))
			report(f)
		}
		j.ecc, j.eccKnown = v, true
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// thermalMargin is the ThermalMargin check: the GPU within ThermalMargin
// °C of its slowdown temperature for more than Share of the window.
func (j *Judge) thermalMargin(now time.Time, c *Config, r Reading, labels []string, tracker *monitors.Tracker, report monitors.Reporter) {
	t := r.Temperature
	if t == nil || !c.On(gpuhealthv1alpha1.CheckThermalMargin) {
		return
	}
	if j.Metrics {
		temperature.WithLabelValues(labels...).Set(float64(t.GPU))
		slowdownTemperature.WithLabelValues(labels...).Set(float64(t.Slowdown))
	}
	near := int64(t.GPU)+int64(c.ThermalMargin) >= int64(t.Slowdown)
	held, _ := j.thermal.add(now, near, true, c.Window)
	tracker.Set(now, j.finding(gpuhealthv1alpha1.CheckThermalMargin, CodeSlowdownMargin, gpuhealthv1alpha1.SeverityInfo, gpuhealthv1alpha1.ActionNone,
		fmt.Sprintf("GPU %d (%s) at %d°C, within %d°C of its slowdown temperature %d°C for %.0f%% of the last %s (threshold %.0f%%)",
			j.Index, j.UUID, t.GPU, c.ThermalMargin, t.Slowdown, percent(held, c.Window), c.Window, 100*c.Share)),
		c.longEnough(held), report)
}

// nvlinkSpeed is the NVLinkDegraded check: an active link slower than
// NVLinkSpeedRatio of the fastest active link of the same GPU for more
// than Share of the window.
func (j *Judge) nvlinkSpeed(now time.Time, c *Config, r Reading, labels []string, tracker *monitors.Tracker, report monitors.Reporter) {
	if len(r.LinkSpeeds) < 2 || !c.On(gpuhealthv1alpha1.CheckNVLinkDegraded) {
		return
	}
	var fastest uint64
	for _, v := range r.LinkSpeeds {
		fastest = max(fastest, v)
	}
	links := make([]int, 0, len(r.LinkSpeeds))
	for l := range r.LinkSpeeds {
		links = append(links, l)
	}
	slices.Sort(links)
	for _, l := range links {
		v := r.LinkSpeeds[l]
		if j.Metrics {
			nvlinkSpeed.WithLabelValues(append(labels, strconv.Itoa(l))...).Set(float64(v))
		}
		held, _ := shareOf(j.links, l).add(now, float64(v) < c.NVLinkSpeedRatio*float64(fastest), true, c.Window)
		tracker.Set(now, monitors.Finding{
			Source:    j.Source,
			Check:     gpuhealthv1alpha1.CheckNVLinkDegraded,
			Component: gpuhealthv1alpha1.Component{Kind: gpuhealthv1alpha1.ComponentNVLink, ID: j.UUID + "/link-" + strconv.Itoa(l)},
			Code:      CodeNVLinkSpeed,
			Severity:  gpuhealthv1alpha1.SeverityDegraded,
			Action:    gpuhealthv1alpha1.ActionRecertify,
			Message: fmt.Sprintf("NVLink %d of GPU %d (%s) at %d MB/s, below the %d MB/s of the GPU's fastest link, for %.0f%% of the last %s",
				l, j.Index, j.UUID, v, fastest, percent(held, c.Window), c.Window),
		}, c.longEnough(held), report)
	}
}
