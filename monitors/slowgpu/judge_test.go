package slowgpu

import (
	"testing"
	"time"

	. "github.com/onsi/gomega"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/monitors"
)

// These tests drive a Judge on a synthetic clock: a 10 s window polled
// every second, so that "more than half the window" is more than 5 s.

type poll struct {
	judge   *Judge
	tracker *monitors.Tracker
	t0      time.Time
	got     []monitors.Finding
}

func newPoll() *poll {
	c := Config{Window: 10 * time.Second}
	return &poll{
		judge:   &Judge{Source: gpuhealthv1alpha1.SourceNVML, Index: 2, UUID: "GPU-2", Config: c},
		tracker: &monitors.Tracker{Repeat: c.Repeat(0)},
		t0:      time.Unix(1_700_000_000, 0),
	}
}

// at observes r at second s and returns what was reported then.
func (p *poll) at(s int, r Reading) []monitors.Finding {
	var now []monitors.Finding
	p.judge.Observe(p.t0.Add(time.Duration(s)*time.Second), r, p.tracker, func(f monitors.Finding) {
		now = append(now, f)
		p.got = append(p.got, f)
	})
	return now
}

func TestThrottleNeedsMoreThanHalfTheWindowAndResolves(t *testing.T) {
	g := NewWithT(t)
	p := newPoll()
	firstAt, resolvedAt := -1, -1
	for s := range 21 { // 0 s to 20 s
		reasons := ReasonSWPowerCap // the workload's: never judged
		if s < 7 {
			reasons |= ReasonHWSlowdown
		}
		for _, f := range p.at(s, Reading{Clocks: &Clocks{Reasons: reasons, SM: 900, SMMax: 1980}}) {
			g.Expect(f.Code).To(Equal("HW_SLOWDOWN"))
			if !f.Resolved && firstAt < 0 {
				firstAt = s
			}
			if f.Resolved {
				resolvedAt = s
			}
		}
	}
	g.Expect(firstAt).To(Equal(6), "held 6 s of 10 at 6 s, the first poll past half")
	g.Expect(resolvedAt).To(Equal(12), "at 12 s the window holds 5 s of throttle, no longer more than half")
	g.Expect(p.got).To(HaveLen(2), "no repeat within one window")
	g.Expect(p.got[0].Severity).To(Equal(gpuhealthv1alpha1.SeverityDegraded))
	g.Expect(p.got[0].Message).To(ContainSubstring("SM clock 900 of 1980 MHz"))
}

func TestThrottleThatHoldsIsRepeatedOnceAWindow(t *testing.T) {
	g := NewWithT(t)
	p := newPoll()
	for s := range 31 { // 0 s to 30 s
		p.at(s, Reading{Clocks: &Clocks{Reasons: ReasonHWThermal}})
	}
	g.Expect(p.got).To(HaveLen(3), "at 6 s, 16 s and 26 s")
}

func TestPCIeIsJudgedOnlyWhileBusy(t *testing.T) {
	g := NewWithT(t)
	p := newPoll()
	x8 := func(util uint32) Reading {
		return Reading{PCIe: &PCIe{Generation: 5, Width: 8, MaxGeneration: 5, MaxWidth: 16, Utilization: util}}
	}
	for s := range 10 {
		g.Expect(p.at(s, x8(0))).To(BeEmpty(), "an idle link at x8 is no finding")
	}
	var opened int
	for s := 10; s < 20; s++ {
		if f := p.at(s, x8(95)); len(f) > 0 && opened == 0 {
			opened = s
			g.Expect(f).To(HaveLen(1))
			g.Expect(f[0].Code).To(Equal(CodePCIeWidth))
			g.Expect(f[0].Action).To(Equal(gpuhealthv1alpha1.ActionRebootNode))
		}
	}
	g.Expect(opened).To(Equal(16), "busy for more than half the window, at x8 throughout")
	for s := 20; s < 40; s++ {
		for _, f := range p.at(s, x8(0)) {
			g.Expect(f.Resolved).To(BeFalse(), "idle at %d s: the verdict stands", s)
		}
	}
	resolved := -1
	for s := 40; s < 50; s++ {
		for _, f := range p.at(s, Reading{PCIe: &PCIe{Generation: 5, Width: 16, MaxGeneration: 5, MaxWidth: 16, Utilization: 90}}) {
			if f.Resolved {
				resolved = s
			}
		}
	}
	g.Expect(resolved).To(Equal(46), "busy at x16 for more than half the window")
}

// A width or generation NVML could not read arrives as 0: not read, never a
// link of width 0 on a busy GPU (which would be a WIDTH finding whose
// action reboots the node).
func TestUnreadPCIeValuesAreNotJudged(t *testing.T) {
	g := NewWithT(t)
	p := newPoll()
	for s := range 30 {
		g.Expect(p.at(s, Reading{PCIe: &PCIe{Generation: 5, Width: 0, MaxGeneration: 0, MaxWidth: 16, Utilization: 95}})).To(BeEmpty(), "at %d s", s)
	}
}

func TestMemoryAndECC(t *testing.T) {
	g := NewWithT(t)
	p := newPoll()
	ecc := func(v uint64) *uint64 { return &v }
	g.Expect(p.at(0, Reading{VolatileUncorrected: ecc(4)})).To(BeEmpty(), "the count at start is the driver's, not news")
	got := p.at(1, Reading{VolatileUncorrected: ecc(9), Remap: &Remap{Uncorrectable: 1, Pending: true}})
	g.Expect(got).To(HaveLen(2))
	g.Expect(got[0].Code).To(Equal(CodeRowRemapPending))
	g.Expect(got[1].Code).To(Equal(CodeVolatileUncorrected))
	g.Expect(got[1].Count).To(Equal(int64(5)))
	got = p.at(2, Reading{Remap: &Remap{Uncorrectable: 1, Failed: true}})
	g.Expect(got).To(HaveLen(2), "the pending remap resolved; a failure opened")
	g.Expect(got[0].Resolved).To(BeTrue())
	g.Expect(got[1].Severity).To(Equal(gpuhealthv1alpha1.SeverityFatal))
	g.Expect(got[1].Action).To(Equal(gpuhealthv1alpha1.ActionContactSupport))
	g.Expect(p.at(3, Reading{})).To(BeEmpty(), "a signal not read changes nothing")
}

func TestThermalMarginAndSlowNVLink(t *testing.T) {
	g := NewWithT(t)
	p := newPoll()
	for s := range 7 { // 0 s to 6 s
		p.at(s, Reading{
			Temperature: &Temperature{GPU: 86, Slowdown: 90},
			LinkSpeeds:  map[int]uint64{0: 26562, 1: 26562, 2: 13281},
		})
	}
	g.Expect(p.got).To(HaveLen(2))
	g.Expect(p.got[0].Check).To(Equal(gpuhealthv1alpha1.CheckThermalMargin))
	g.Expect(p.got[0].Severity).To(Equal(gpuhealthv1alpha1.SeverityInfo))
	g.Expect(p.got[1].Check).To(Equal(gpuhealthv1alpha1.CheckNVLinkDegraded))
	g.Expect(p.got[1].Component).To(Equal(gpuhealthv1alpha1.Component{Kind: gpuhealthv1alpha1.ComponentNVLink, ID: "GPU-2/link-2"}))
}

func TestChecksOff(t *testing.T) {
	g := NewWithT(t)
	p := newPoll()
	p.judge.Config.Off = []gpuhealthv1alpha1.Check{gpuhealthv1alpha1.CheckThrottled, gpuhealthv1alpha1.CheckMemoryRepair}
	for s := range 11 { // 0 s to 10 s
		p.at(s, Reading{Clocks: &Clocks{Reasons: ReasonHWSlowdown}, Remap: &Remap{Failed: true}})
	}
	g.Expect(p.got).To(BeEmpty())
}

func TestRepeatIsOnceAWindowOrTheSourcesShorterRepeat(t *testing.T) {
	g := NewWithT(t)
	g.Expect(Config{}.Repeat(0)).To(Equal(DefaultWindow), "unset: the default window")
	g.Expect(Config{Window: time.Minute}.Repeat(0)).To(Equal(time.Minute))
	g.Expect(Config{Window: time.Minute}.Repeat(5*time.Minute)).To(Equal(time.Minute), "the window is shorter")
	g.Expect(Config{Window: time.Minute}.Repeat(20*time.Second)).To(Equal(20*time.Second), "the source repeats more often")
}
