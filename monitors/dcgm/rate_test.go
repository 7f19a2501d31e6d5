package dcgm

import (
	"testing"
	"time"

	. "github.com/onsi/gomega"
)

func TestCounterWindow(t *testing.T) {
	type reading struct {
		at time.Duration
		v  int64
	}
	// every10s returns readings every 10 s from 0 to last, the counter
	// rising by step each time.
	every10s := func(last time.Duration, step int64) []reading {
		var rs []reading
		for at, v := time.Duration(0), int64(0); at <= last; at, v = at+10*time.Second, v+step {
			rs = append(rs, reading{at, v})
		}
		return rs
	}
	tests := []struct {
		name     string
		readings []reading
		want     rateResult
	}{
		{
			name:     "a counter is not judged before its readings span the window",
			readings: every10s(50*time.Second, 1000),
			want:     rateResult{},
		},
		{
			name:     "a counter is judged once its readings span the window",
			readings: every10s(60*time.Second, 1000),
			want:     rateResult{judged: true, rate: 100, delta: 6000, span: time.Minute},
		},
		{
			name: "the baseline slides with the window, so old errors age out",
			readings: []reading{
				{0, 0}, {10 * time.Second, 6000}, {20 * time.Second, 6000}, {30 * time.Second, 6000},
				{40 * time.Second, 6000}, {50 * time.Second, 6000}, {60 * time.Second, 6000}, {70 * time.Second, 6000},
			},
			want: rateResult{judged: true, rate: 0, delta: 0, span: time.Minute},
		},
		{
			name:     "a late poll keeps the reading before the window start as the baseline",
			readings: []reading{{0, 0}, {20 * time.Second, 100}, {40 * time.Second, 200}, {61 * time.Second, 610}},
			want:     rateResult{judged: true, rate: 10, delta: 610, span: 61 * time.Second},
		},
		{
			name:     "a counter that goes down was reset and is not judged",
			readings: append(every10s(60*time.Second, 1000), reading{70 * time.Second, 5}),
			want:     rateResult{reset: true},
		},
		{
			name: "after a reset the window restarts from the reset reading",
			readings: append(every10s(60*time.Second, 1000),
				reading{70 * time.Second, 0}, reading{80 * time.Second, 10}, reading{120 * time.Second, 50}),
			want: rateResult{},
		},
		{
			name: "after a reset the counter is judged again one window later",
			readings: append(every10s(60*time.Second, 1000),
				reading{70 * time.Second, 0}, reading{100 * time.Second, 30}, reading{130 * time.Second, 60}),
			want: rateResult{judged: true, rate: 1, delta: 60, span: time.Minute},
		},
		{
			name:     "a reading no newer than the last one is ignored",
			readings: append(every10s(60*time.Second, 1000), reading{60 * time.Second, 9999}),
			want:     rateResult{},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			w := &counterWindow{}
			var got rateResult
			for _, r := range tt.readings {
				got = w.add(testStart.Add(r.at), r.v, time.Minute)
			}
			g.Expect(got).To(Equal(tt.want))
			g.Expect(len(w.samples)).To(BeNumerically("<=", 8), "the window keeps only the readings it needs")
		})
	}
}
