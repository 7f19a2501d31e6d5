package monitors

import (
	"testing"
	"time"

	. "github.com/onsi/gomega"
)

func TestRate(t *testing.T) {
	t0 := time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	type step struct {
		at    int
		value uint64
		rate  float64
		known bool
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{name: "one sample says nothing", steps: []step{{0, 5, 0, false}}},
		{name: "a steady climb gives its slope", steps: []step{{0, 0, 0, false}, {10, 1000, 100, true}, {20, 2000, 100, true}}},
		{name: "the window forgets old increases", steps: []step{
			{0, 0, 0, false}, {10, 6000, 600, true}, {60, 6000, 100, true}, {80, 6000, 0, true},
		}},
		{name: "a counter that goes down restarts the history (reset or wrap)", steps: []step{
			{0, 1 << 40, 0, false}, {10, 3, 0, false}, {20, 503, 50, true},
		}},
		{name: "a counter near its maximum that wraps does not yield a huge rate", steps: []step{
			{0, ^uint64(0) - 10, 0, false}, {10, 5, 0, false},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			var r Rate
			for _, s := range tt.steps {
				got, known := r.Add(at(s.at), s.value, time.Minute)
				g.Expect(known).To(Equal(s.known), "at %ds", s.at)
				g.Expect(got).To(BeNumerically("~", s.rate, 0.001), "at %ds", s.at)
			}
		})
	}
}

func TestRateBoundsHistory(t *testing.T) {
	g := NewWithT(t)
	var r Rate
	t0 := time.Now()
	for i := range 1000 {
		r.Add(t0.Add(time.Duration(i)*time.Millisecond), uint64(i), time.Hour)
	}
	g.Expect(len(r.samples)).To(BeNumerically("<=", maxSamples))
}

// A 5-minute window polled every second (300 polls, more than the history
// holds): the rate is taken over the whole window, not over its last 64
// polls, and the history stays bounded.
func TestRateCoversWindowsLongerThanItsHistory(t *testing.T) {
	g := NewWithT(t)
	var r Rate
	t0 := time.Unix(1_700_000_000, 0)
	const window = 5 * time.Minute
	// 1 per second for the first minute, then nothing: over the window
	// ending at 10 min the rate is 0; ending at 5 min 30 s, it is 30/300.
	value := uint64(0)
	var rate float64
	for i := range 331 {
		if i > 0 && i <= 60 {
			value++
		}
		rate, _ = r.Add(t0.Add(time.Duration(i)*time.Second), value, window)
	}
	g.Expect(rate).To(BeNumerically("~", 30.0/300, 0.01), "the window's first 30 s of increase count")
	g.Expect(r.Increase()).To(BeNumerically("~", 30, 5))
	g.Expect(len(r.samples)).To(BeNumerically("<=", maxSamples+2))
}
