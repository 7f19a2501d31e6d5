package slowgpu

import "time"

// share tracks a condition sampled at poll times and answers for how long
// it held within a sliding window. A sample's state lasts until the next
// sample; a sample may also be marked as not counting (a PCIe link read
// while the GPU is idle, or a value that could not be read), and then the
// time until the next sample counts neither for nor against the condition.
//
// Only changes of state are kept: a sample in the state of the one before
// it adds nothing, since that state lasts until the next change anyway. So
// the history grows with how often the condition changes within the
// window, not with how often it is polled, and any window is covered at
// any poll interval (a 1-hour window polled every 100 ms keeps two samples
// for a condition that held throughout, where a sample per poll kept the
// last 160 and judged 16 s of it).
type share struct {
	samples []shareSample
}

type shareSample struct {
	at      time.Time
	on      bool
	counted bool
}

// maxShareChanges bounds the history for a condition that changes at
// almost every poll: past it the oldest changes go, and the window is
// judged over the newest maxShareChanges of them. At the default 5-minute
// window polled every 2 s a condition can change at most 150 times.
const maxShareChanges = 4096

// add records the state at time at and returns, within the window before
// at, how long the condition held and how long was counted at all.
func (s *share) add(at time.Time, on, counted bool, window time.Duration) (held, covered time.Duration) {
	if n := len(s.samples); n > 0 && !at.After(s.samples[n-1].at) {
		s.samples = s.samples[:0] // the clock went back: start afresh
	}
	if n := len(s.samples); n == 0 || s.samples[n-1].on != on || s.samples[n-1].counted != counted {
		s.samples = append(s.samples, shareSample{at: at, on: on, counted: counted})
	}
	cutoff := at.Add(-window)
	drop := 0
	// Keep the newest sample at or before the cutoff: its state covers the
	// window's start.
	for drop+1 < len(s.samples) && !s.samples[drop+1].at.After(cutoff) {
		drop++
	}
	if over := len(s.samples) - drop - maxShareChanges; over > 0 {
		drop += over
	}
	s.samples = s.samples[drop:]
	for i, x := range s.samples {
		from, to := x.at, at
		if i+1 < len(s.samples) {
			to = s.samples[i+1].at
		}
		if from.Before(cutoff) {
			from = cutoff
		}
		if !to.After(from) || !x.counted {
			continue
		}
		covered += to.Sub(from)
		if x.on {
			held += to.Sub(from)
		}
	}
	return held, covered
}
