package pipeline

import (
	"testing"
	"time"

	. "github.com/onsi/gomega"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/monitors"
)

func TestDebounce(t *testing.T) {
	t0 := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	rule := DebounceRule{Check: gpuhealthv1alpha1.CheckIMEXDaemon, Occurrences: 3, Window: time.Minute}
	at := func(s int, resolved bool) monitors.Finding {
		return monitors.Finding{Check: gpuhealthv1alpha1.CheckIMEXDaemon, Code: "UNAVAILABLE", Time: t0.Add(time.Duration(s) * time.Second), Resolved: resolved}
	}
	type step struct {
		f      monitors.Finding
		active bool
		want   int64
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{name: "three within the window release all three", steps: []step{{at(0, false), false, 0}, {at(10, false), false, 0}, {at(20, false), false, 3}}},
		{name: "occurrences older than the window are forgotten", steps: []step{{at(0, false), false, 0}, {at(50, false), false, 0}, {at(70, false), false, 0}, {at(80, false), false, 3}}},
		{name: "a resolution clears what was held", steps: []step{{at(0, false), false, 0}, {at(5, false), false, 0}, {at(6, true), false, 0}, {at(7, false), false, 0}}},
		{name: "repeats of an active finding are never held", steps: []step{{at(0, false), true, 1}}},
		{name: "a finding that stands for many occurrences can release at once", steps: []step{{monitors.Finding{Check: gpuhealthv1alpha1.CheckIMEXDaemon, Code: "UNAVAILABLE", Time: t0, Count: 5}, false, 5}}},
		{name: "other checks pass straight through", steps: []step{{monitors.Finding{Check: gpuhealthv1alpha1.CheckXID, Code: "79", Time: t0}, false, 1}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			d := debouncer{rules: []DebounceRule{rule}, held: map[string][]time.Time{}}
			for i, s := range tt.steps {
				g.Expect(d.admit("event", &s.f, s.active)).To(Equal(s.want), "step %d", i)
			}
		})
	}
}
