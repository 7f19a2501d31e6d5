package nvml

import (
	"testing"
	"time"

	. "github.com/onsi/gomega"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/monitors"
	"github.com/gpuhealth/gpuhealth/monitors/slowgpu"
)

// The slow-GPU checks run through go-nvml against the fake library with a one-second
// window (and a 50 ms poll), so that "half the window" is half a second.

func perfSource() *Source {
	return &Source{Performance: slowgpu.Config{Window: time.Second}}
}

func TestThrottleByHWSlowdownIsReportedAndResolves(t *testing.T) {
	g := NewWithT(t)
	r, stop := run(t, twoGPUs+
		"clocks device=0 reasons=hw_slowdown sm=1100 at=200ms\nclocks device=0 reasons=none at=2500ms\n"+
		"clocks device=1 reasons=sw_power_cap,gpu_idle sm=900\n"+
		"clocks device=1 reasons=hw_slowdown at=1s\nclocks device=1 reasons=sw_power_cap at=1200ms\n", perfSource())
	throttled := func() []monitors.Finding { return r.matching(gpuhealthv1alpha1.CheckThrottled, uuid0, "HW_SLOWDOWN") }
	g.Eventually(throttled, 5*time.Second).Should(HaveLen(1))
	f := throttled()[0]
	g.Expect(f.Severity).To(Equal(gpuhealthv1alpha1.SeverityDegraded))
	g.Expect(f.Action).To(Equal(gpuhealthv1alpha1.ActionRecertify))
	g.Expect(f.Message).To(ContainSubstring("SM clock 1100 of 1980 MHz"))
	g.Eventually(func() bool { got := throttled(); return got[len(got)-1].Resolved }, 5*time.Second).Should(BeTrue(),
		"resolved once the reason cleared for half the window")
	got := throttled()
	g.Expect(len(got)).To(BeNumerically(">=", 3), "reported again once a window while it held (2 s of throttle, a 1 s window)")
	for _, f := range got[:len(got)-1] {
		g.Expect(f.Resolved).To(BeFalse())
	}
	g.Expect(r.matching(gpuhealthv1alpha1.CheckThrottled, uuid1, "HW_SLOWDOWN")).To(BeEmpty(), "a 200 ms blip is not half the window")
	for _, f := range r.all() {
		g.Expect(f.Component.ID == uuid1 && f.Check == gpuhealthv1alpha1.CheckThrottled).To(BeFalse(), "a power cap and idling are the workload's: %v", f.String())
	}
	g.Expect(stop()).To(Succeed())
}

func TestThermalSlowdownAlsoShowsAsViolationTime(t *testing.T) {
	g := NewWithT(t)
	r, stop := run(t, twoGPUs+"clocks device=1 reasons=hw_thermal\n", perfSource())
	g.Eventually(func() []monitors.Finding {
		return r.matching(gpuhealthv1alpha1.CheckThrottled, uuid1, "HW_THERMAL_SLOWDOWN")
	}, 5*time.Second).ShouldNot(BeEmpty())
	g.Eventually(func() []monitors.Finding {
		return r.matching(gpuhealthv1alpha1.CheckThrottled, uuid1, slowgpu.CodeThermalViolation)
	}, 5*time.Second).ShouldNot(BeEmpty())
	g.Expect(r.matching(gpuhealthv1alpha1.CheckThrottled, uuid1, slowgpu.CodeReliabilityViolation)).To(BeEmpty())
	g.Expect(stop()).To(Succeed())
}

func TestPCIeLinkIsJudgedOnlyWhileBusy(t *testing.T) {
	g := NewWithT(t)
	// x8 of x16 throughout. Idle for 1.5 s (no finding), busy until 3.5 s
	// (WIDTH), idle again (the finding stays open), busy at x16 from 5 s
	// (resolved).
	r, stop := run(t, twoGPUs+
		"pcie device=0 gen=5 width=8\npcie device=0 at=5s\n"+
		"util device=0 gpu=0\nutil device=0 gpu=95 at=1500ms\nutil device=0 gpu=2 at=3500ms\nutil device=0 gpu=90 at=5s\n", perfSource())
	width := func() []monitors.Finding {
		return r.matching(gpuhealthv1alpha1.CheckPCIeDegraded, uuid0, slowgpu.CodePCIeWidth)
	}
	g.Consistently(width, 1200*time.Millisecond).Should(BeEmpty(), "an idle link may slow down")
	g.Eventually(width, 5*time.Second).ShouldNot(BeEmpty())
	g.Expect(width()[0].Action).To(Equal(gpuhealthv1alpha1.ActionRebootNode), "a lost lane needs the link retrained")
	g.Expect(width()[0].Message).To(ContainSubstring("gen 5 x8, below the gen 5 x16"))
	g.Expect(r.matching(gpuhealthv1alpha1.CheckPCIeDegraded, uuid0, slowgpu.CodePCIeGeneration)).To(BeEmpty(), "the generation is at its maximum")
	time.Sleep(time.Until(startOf(r).Add(4800 * time.Millisecond)))
	g.Expect(resolutions(width())).To(BeZero(), "idle again: the verdict stands")
	g.Eventually(func() int { return resolutions(width()) }, 5*time.Second).Should(Equal(1))
	g.Expect(width()[len(width())-1].Resolved).To(BeTrue())
	g.Expect(stop()).To(Succeed())
}

// resolutions counts the resolved findings among fs.
func resolutions(fs []monitors.Finding) int {
	n := 0
	for _, f := range fs {
		if f.Resolved {
			n++
		}
	}
	return n
}

// startOf is when the run began, a moment before nvmlInit, which the
// fake's relative times count from.
func startOf(r *recorder) time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.started
}

func TestPCIeGenerationDropAndReplays(t *testing.T) {
	g := NewWithT(t)
	r, stop := run(t, twoGPUs+"pcie device=1 gen=3 max_gen=5\nutil device=1 gpu=100\npcireplay device=1 rate=20\n", perfSource())
	g.Eventually(func() []monitors.Finding {
		return r.matching(gpuhealthv1alpha1.CheckPCIeDegraded, uuid1, slowgpu.CodePCIeGeneration)
	}, 5*time.Second).ShouldNot(BeEmpty())
	gen := r.matching(gpuhealthv1alpha1.CheckPCIeDegraded, uuid1, slowgpu.CodePCIeGeneration)[0]
	g.Expect(gen.Action).To(Equal(gpuhealthv1alpha1.ActionRecertify))
	g.Eventually(func() []monitors.Finding {
		return r.matching(gpuhealthv1alpha1.CheckPCIe, uuid1, slowgpu.CodePCIeReplay)
	}, 5*time.Second).ShouldNot(BeEmpty())
	g.Expect(r.matching(gpuhealthv1alpha1.CheckPCIe, uuid1, slowgpu.CodePCIeReplay)[0].Message).To(ContainSubstring("threshold 0.133/s"))
	g.Expect(stop()).To(Succeed())
}

func TestMemoryRepairAndECC(t *testing.T) {
	g := NewWithT(t)
	r, stop := run(t, twoGPUs+
		"remap device=0 corr=3\nremap device=0 corr=3 uncorr=1 pending=yes at=300ms\nremap device=0 corr=3 uncorr=1 at=1s\n"+
		"remap device=1 uncorr=4 failure=yes at=300ms\n"+
		"ecc device=1 value=7\necc device=1 value=10 at=500ms\n"+
		"retired device=0 pending=yes at=300ms\n", perfSource())
	pending := func() []monitors.Finding {
		return r.matching(gpuhealthv1alpha1.CheckMemoryRepair, uuid0, slowgpu.CodeRowRemapPending)
	}
	g.Eventually(pending, 5*time.Second).Should(HaveLen(2), "pending, then applied")
	g.Expect(pending()[0].Action).To(Equal(gpuhealthv1alpha1.ActionResetGPU))
	g.Expect(pending()[1].Resolved).To(BeTrue())
	failure := r.matching(gpuhealthv1alpha1.CheckMemoryRepair, uuid1, slowgpu.CodeRowRemapFailure)
	g.Expect(failure).To(HaveLen(1))
	g.Expect(failure[0].Severity).To(Equal(gpuhealthv1alpha1.SeverityFatal))
	g.Expect(failure[0].Action).To(Equal(gpuhealthv1alpha1.ActionContactSupport))
	ecc := r.matching(gpuhealthv1alpha1.CheckECC, uuid1, slowgpu.CodeVolatileUncorrected)
	g.Expect(ecc).To(HaveLen(1), "the count at start is not news; the rise is")
	g.Expect(ecc[0].Count).To(Equal(int64(3)))
	g.Expect(r.matching(gpuhealthv1alpha1.CheckMemoryRepair, uuid0, slowgpu.CodeRetiredPagesPending)).To(HaveLen(1))
	g.Expect(stop()).To(Succeed())
}

func TestThermalMarginAndNVLinkSpeed(t *testing.T) {
	g := NewWithT(t)
	r, stop := run(t, twoGPUs+"temp device=0 gpu=86 slowdown=90\ntemp device=1 gpu=80 slowdown=90\n"+
		"nvlinkspeed device=1 link=1 mbps=13281\n", perfSource())
	g.Eventually(func() []monitors.Finding {
		return r.matching(gpuhealthv1alpha1.CheckThermalMargin, uuid0, slowgpu.CodeSlowdownMargin)
	}, 5*time.Second).ShouldNot(BeEmpty())
	margin := r.matching(gpuhealthv1alpha1.CheckThermalMargin, uuid0, slowgpu.CodeSlowdownMargin)[0]
	g.Expect(margin.Severity).To(Equal(gpuhealthv1alpha1.SeverityInfo))
	link := func() []monitors.Finding {
		return r.matching(gpuhealthv1alpha1.CheckNVLinkDegraded, uuid1+"/link-1", slowgpu.CodeNVLinkSpeed)
	}
	g.Eventually(link, 5*time.Second).ShouldNot(BeEmpty())
	g.Expect(link()[0].Message).To(ContainSubstring("13281 MB/s, below the 26562 MB/s"))
	g.Expect(r.matching(gpuhealthv1alpha1.CheckThermalMargin, uuid1, slowgpu.CodeSlowdownMargin)).To(BeEmpty(), "10°C of margin is enough")
	g.Expect(r.matching(gpuhealthv1alpha1.CheckNVLinkDegraded, uuid1+"/link-0", slowgpu.CodeNVLinkSpeed)).To(BeEmpty())
	g.Expect(stop()).To(Succeed())
}

func TestChecksTurnedOffOrUnsupportedStaySilent(t *testing.T) {
	g := NewWithT(t)
	s := perfSource()
	s.Performance.Off = []gpuhealthv1alpha1.Check{gpuhealthv1alpha1.CheckThrottled}
	// GPU 0 reports nothing of these signals (NOT_SUPPORTED); GPU 1 is
	// throttled but the check is off.
	r, stop := run(t, twoGPUs+"clocks device=1 reasons=hw_slowdown\n", s)
	g.Consistently(r.all, 1500*time.Millisecond).Should(BeEmpty())
	g.Expect(stop()).To(Succeed())
}
