package nodehealth

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
)

func TestJudge(t *testing.T) {
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	at := func(d time.Duration) *metav1.Time { t := metav1.NewTime(now.Add(d)); return &t }
	event := func(check gpuhealthv1alpha1.Check, code string, sev gpuhealthv1alpha1.Severity, st gpuhealthv1alpha1.NodeHealthEventStatus) *gpuhealthv1alpha1.NodeHealthEvent {
		return &gpuhealthv1alpha1.NodeHealthEvent{
			Spec:   gpuhealthv1alpha1.NodeHealthEventSpec{NodeName: "n", Source: "nvml", Check: check, Code: code, Severity: sev, RecommendedAction: "None"},
			Status: st,
		}
	}
	debounceRule := gpuhealthv1alpha1.Rule{
		Name: "app-xids", Match: gpuhealthv1alpha1.RuleMatch{Checks: []gpuhealthv1alpha1.Check{"XID"}, Codes: []string{"13"}},
		Verdict: "Quarantine", Action: "Recertify",
		Debounce: &gpuhealthv1alpha1.Debounce{Count: 5, Window: "24h"},
	}
	recoveryRule := gpuhealthv1alpha1.Rule{
		Name: "nvlink", Match: gpuhealthv1alpha1.RuleMatch{Checks: []gpuhealthv1alpha1.Check{"NVLinkErrors"}},
		Verdict: "Quarantine", Recovery: &gpuhealthv1alpha1.Recovery{ClearAfter: "15m"},
	}
	ignore45 := gpuhealthv1alpha1.Rule{Name: "ignore-45", Match: gpuhealthv1alpha1.RuleMatch{Codes: []string{"45"}}, Verdict: "Ignore"}
	rules := []gpuhealthv1alpha1.Rule{debounceRule, recoveryRule, ignore45}

	cases := []struct {
		name        string
		event       *gpuhealthv1alpha1.NodeHealthEvent
		wantRule    string
		wantPhase   gpuhealthv1alpha1.EventPhase
		wantCounts  bool
		wantAction  gpuhealthv1alpha1.Action
		wantRecheck time.Duration
	}{
		{
			name:     "XID 79 quarantines by the built-in catalog with a reboot",
			event:    event("XID", "79", "Fatal", gpuhealthv1alpha1.NodeHealthEventStatus{Count: 1}),
			wantRule: DefaultRule, wantPhase: "Active", wantCounts: true, wantAction: "RebootNode",
		},
		{
			name:     "XID 43 is ignored by the catalog",
			event:    event("XID", "43", "Fatal", gpuhealthv1alpha1.NodeHealthEventStatus{Count: 1}),
			wantRule: DefaultRule, wantPhase: "Ignored", wantAction: "None",
		},
		{
			name:  "a rule ignores XID 45",
			event: event("XID", "45", "Fatal", gpuhealthv1alpha1.NodeHealthEventStatus{Count: 1}),
			// XID 45 is judged per occurrence by the monitor: the action is
			// the event's own (none here), not the catalog's.
			wantRule: "ignore-45", wantPhase: "Ignored", wantAction: "None",
		},
		{
			name:     "XID 13 seen four times waits for its debounce",
			event:    event("XID", "13", "Info", gpuhealthv1alpha1.NodeHealthEventStatus{Count: 4, FirstSeen: at(-time.Hour), LastSeen: at(0)}),
			wantRule: "app-xids", wantPhase: "Active", wantAction: "Recertify",
		},
		{
			name:     "XID 13 seen five times in an hour passes its debounce",
			event:    event("XID", "13", "Info", gpuhealthv1alpha1.NodeHealthEventStatus{Count: 5, FirstSeen: at(-time.Hour), LastSeen: at(0)}),
			wantRule: "app-xids", wantPhase: "Active", wantCounts: true, wantAction: "Recertify",
		},
		{
			name:     "XID 13 seen five times over a week is too slow for 5 per 24h",
			event:    event("XID", "13", "Info", gpuhealthv1alpha1.NodeHealthEventStatus{Count: 5, FirstSeen: at(-7 * 24 * time.Hour), LastSeen: at(0)}),
			wantRule: "app-xids", wantPhase: "Active", wantAction: "Recertify",
		},
		{
			name:     "a resolved NVLink finding counts until its hysteresis ends",
			event:    event("NVLinkErrors", "CRC_FLIT", "Degraded", gpuhealthv1alpha1.NodeHealthEventStatus{Count: 3, Resolved: true, ResolvedAt: at(-5 * time.Minute)}),
			wantRule: "nvlink", wantPhase: "Active", wantCounts: true, wantAction: "None", wantRecheck: 10 * time.Minute,
		},
		{
			name:     "a resolved NVLink finding stops counting after its hysteresis",
			event:    event("NVLinkErrors", "CRC_FLIT", "Degraded", gpuhealthv1alpha1.NodeHealthEventStatus{Count: 3, Resolved: true, ResolvedAt: at(-20 * time.Minute)}),
			wantRule: "nvlink", wantPhase: "Resolved", wantAction: "None",
		},
		{
			name:     "a Degraded finding no rule matches is observed, not quarantined",
			event:    event("Fabric", "NOT_COMPLETED", "Degraded", gpuhealthv1alpha1.NodeHealthEventStatus{Count: 1}),
			wantRule: DefaultRule, wantPhase: "Active", wantAction: "None",
		},
		{
			name: "a superseded finding stays closed",
			event: event("XID", "79", "Fatal", gpuhealthv1alpha1.NodeHealthEventStatus{
				Count: 1, LastSeen: at(-time.Hour), SupersededAt: at(-time.Minute),
			}),
			wantRule: DefaultRule, wantPhase: "Superseded", wantAction: "RebootNode",
		},
		{
			name: "a superseded finding that occurs again is active again",
			event: event("XID", "79", "Fatal", gpuhealthv1alpha1.NodeHealthEventStatus{
				Count: 2, LastSeen: at(0), SupersededAt: at(-time.Minute),
			}),
			wantRule: DefaultRule, wantPhase: "Active", wantCounts: true, wantAction: "RebootNode",
		},
		{
			name: "a superseded finding that occurs again in the second it was closed is active again",
			event: event("XID", "79", "Fatal", gpuhealthv1alpha1.NodeHealthEventStatus{
				Count: 2, SupersededCount: 1, LastSeen: at(-time.Minute), SupersededAt: at(-time.Minute),
			}),
			wantRule: DefaultRule, wantPhase: "Active", wantCounts: true, wantAction: "RebootNode",
		},
		{
			name: "a superseded finding not seen since, in the second it was closed, stays closed",
			event: event("XID", "79", "Fatal", gpuhealthv1alpha1.NodeHealthEventStatus{
				Count: 2, SupersededCount: 2, LastSeen: at(-time.Minute), SupersededAt: at(-time.Minute),
			}),
			wantRule: DefaultRule, wantPhase: "Superseded", wantAction: "RebootNode",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			j := judge(tc.event, rules, now)
			g.Expect(j.rule).To(Equal(tc.wantRule))
			g.Expect(j.phase).To(Equal(tc.wantPhase))
			g.Expect(j.counts).To(Equal(tc.wantCounts), j.reason)
			g.Expect(j.action).To(Equal(tc.wantAction))
			if tc.wantRecheck > 0 {
				g.Expect(j.recheckAt.Sub(now)).To(Equal(tc.wantRecheck))
			} else {
				g.Expect(j.recheckAt.IsZero()).To(BeTrue())
			}
		})
	}
}

// TestDebounceCountsTheWindow: a debounce counts occurrences within its
// window, from the samples the operator keeps, and starts afresh when a
// finding is superseded.
func TestDebounceCountsTheWindow(t *testing.T) {
	day := 24 * time.Hour
	t0 := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	rule := []gpuhealthv1alpha1.Rule{{
		Name: "app-xids", Match: gpuhealthv1alpha1.RuleMatch{Codes: []string{"13"}}, Verdict: "Quarantine",
		Debounce: &gpuhealthv1alpha1.Debounce{Count: 5, Window: "24h"},
	}}
	ev := &gpuhealthv1alpha1.NodeHealthEvent{Spec: gpuhealthv1alpha1.NodeHealthEventSpec{Check: "XID", Code: "13", Severity: "Info"}}
	// seen plays the monitor (count, lastSeen) and then the operator's pass.
	seen := func(count int64, at time.Time) judgement {
		ev.Status.Count = count
		ts := metav1.NewTime(at)
		ev.Status.LastSeen = &ts
		if ev.Status.FirstSeen == nil {
			ev.Status.FirstSeen = &ts
		}
		j := judge(ev, rule, at)
		ev.Status.Phase = j.phase
		return j
	}

	g := NewWithT(t)
	for i := int64(1); i <= 4; i++ {
		g.Expect(seen(i, t0.Add(time.Duration(i)*time.Hour)).counts).To(BeFalse(), "occurrence %d of 5", i)
	}
	g.Expect(seen(5, t0.Add(5*time.Hour)).counts).To(BeTrue(), "five within a day")
	g.Expect(ev.Status.Occurrences).To(HaveLen(5))

	// Recertified: the finding is superseded (as the reconciler does).
	closedAt := metav1.NewTime(t0.Add(6 * time.Hour))
	ev.Status.SupersededAt, ev.Status.SupersededCount = &closedAt, 5
	ev.Status.Occurrences = []gpuhealthv1alpha1.OccurrenceSample{{Time: closedAt, Count: 5}}
	j := seen(6, t0.Add(day+6*time.Hour))
	g.Expect(j.phase).To(Equal(gpuhealthv1alpha1.EventActive), "it occurred again")
	g.Expect(j.counts).To(BeFalse(), "one XID 13 a day later does not quarantine again: %s", j.reason)
	g.Expect(j.reason).To(ContainSubstring("seen 1"))

	// A long-flapping finding: one occurrence an hour for two days never
	// reaches five in 24h... but five within a day, after weeks, still counts.
	flap := &gpuhealthv1alpha1.NodeHealthEvent{Spec: gpuhealthv1alpha1.NodeHealthEventSpec{Check: "XID", Code: "13", Severity: "Info"}}
	ev = flap
	slow := rule[0].DeepCopy()
	slow.Debounce = &gpuhealthv1alpha1.Debounce{Count: 3, Window: "10m"}
	rule = []gpuhealthv1alpha1.Rule{*slow}
	for i := int64(1); i <= 48; i++ {
		g.Expect(seen(i, t0.Add(time.Duration(i)*time.Hour)).counts).To(BeFalse(), "one an hour is not three in ten minutes")
	}
	g.Expect(len(flap.Status.Occurrences)).To(BeNumerically("<=", 2), "samples older than the window are dropped")
	base := t0.Add(49 * time.Hour)
	seen(49, base)
	seen(50, base.Add(2*time.Minute))
	g.Expect(seen(51, base.Add(4*time.Minute)).counts).To(BeTrue(), "three within ten minutes, after two days of flapping")
}

// TestDebounceFirstSightOfACoalescedCount: a finding first seen with five
// occurrences over a week is not five within a day; over an hour it is.
func TestDebounceFirstSightOfACoalescedCount(t *testing.T) {
	now := time.Date(2026, 12, 8, 0, 0, 0, 0, time.UTC)
	d := &gpuhealthv1alpha1.Debounce{Count: 5, Window: "24h"}
	for _, tc := range []struct {
		span time.Duration
		want bool
	}{{7 * 24 * time.Hour, false}, {time.Hour, true}} {
		first, last := metav1.NewTime(now.Add(-tc.span)), metav1.NewTime(now)
		st := &gpuhealthv1alpha1.NodeHealthEventStatus{Count: 5, FirstSeen: &first, LastSeen: &last}
		st.Occurrences = sample(st, d.Window.Get(0), now)
		NewWithT(t).Expect(occurrencesWithin(st, d.Window.Get(0), now) >= int64(d.Count)).To(Equal(tc.want), "over %s", tc.span)
	}
}

// TestSamplePolicyJudgesSlowGPUs: the shipped policy's rules quarantine a
// throttled GPU, a PCIe link trained down and a slow NVLink once reported
// twice, act on memory repair at once (a failure with the monitor's
// ContactSupport) and only observe a thin thermal margin.
func TestSamplePolicyJudgesSlowGPUs(t *testing.T) {
	g := NewWithT(t)
	b, err := os.ReadFile(filepath.Join("..", "..", "config", "samples", "gpuhealth_v1alpha1_remediationpolicy.yaml"))
	g.Expect(err).NotTo(HaveOccurred())
	var policy gpuhealthv1alpha1.RemediationPolicy
	g.Expect(yaml.UnmarshalStrict(b, &policy)).To(Succeed())
	now := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	event := func(check gpuhealthv1alpha1.Check, code string, sev gpuhealthv1alpha1.Severity, action gpuhealthv1alpha1.Action, count int64) *gpuhealthv1alpha1.NodeHealthEvent {
		first, last := metav1.NewTime(now.Add(-5*time.Minute)), metav1.NewTime(now)
		if count == 1 {
			first = last
		}
		return &gpuhealthv1alpha1.NodeHealthEvent{
			Spec:   gpuhealthv1alpha1.NodeHealthEventSpec{NodeName: "n", Source: "nvml", Check: check, Code: code, Severity: sev, RecommendedAction: action},
			Status: gpuhealthv1alpha1.NodeHealthEventStatus{Count: count, FirstSeen: &first, LastSeen: &last},
		}
	}
	for _, tc := range []struct {
		event      *gpuhealthv1alpha1.NodeHealthEvent
		rule       string
		verdict    gpuhealthv1alpha1.Verdict
		counts     bool
		wantAction gpuhealthv1alpha1.Action
	}{
		{event("Throttled", "HW_SLOWDOWN", "Degraded", "Recertify", 1), "slow-gpu", "Quarantine", false, "Recertify"},
		{event("Throttled", "HW_SLOWDOWN", "Degraded", "Recertify", 2), "slow-gpu", "Quarantine", true, "Recertify"},
		{event("PCIeDegraded", "WIDTH", "Degraded", "RebootNode", 2), "slow-gpu", "Quarantine", true, "RebootNode"},
		{event("NVLinkDegraded", "SPEED", "Degraded", "Recertify", 2), "slow-gpu", "Quarantine", true, "Recertify"},
		{event("MemoryRepair", "ROW_REMAP_PENDING", "Degraded", "ResetGPU", 1), "memory-repair", "Quarantine", true, "ResetGPU"},
		{event("MemoryRepair", "ROW_REMAP_FAILURE", "Fatal", "ContactSupport", 1), "memory-repair", "Quarantine", true, "ContactSupport"},
		{event("ThermalMargin", "SLOWDOWN_MARGIN", "Info", "None", 3), "thermal-margin", "Observe", false, "None"},
	} {
		j := judge(tc.event, policy.Spec.Rules, now)
		g.Expect([]any{j.rule, j.verdict, j.counts, j.action}).To(Equal([]any{tc.rule, tc.verdict, tc.counts, tc.wantAction}),
			"%s/%s seen %d times", tc.event.Spec.Check, tc.event.Spec.Code, tc.event.Status.Count)
	}
}
