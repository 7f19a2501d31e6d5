package slowgpu

import "time"

// share tracks a condition sampled at poll times and answers for how long
// it held within a sliding window. A sample's state lasts until the next
// sample; a sample may also be marked as not counting (a PCIe link read
// while the GPU is idle), and then the time until the next sample counts
// neither for nor against the condition.
type share struct {
	samples []shareSample
}

type shareSample struct {
	at      time.Time
	on      bool
	counted bool
}

// maxShareSamples bounds the history: a 5-minute window polled every 2 s.
const maxShareSamples = 160

// add records the state at time at and returns, within the window before
// at, how long the condition held and how long was counted at all.
func (s *share) add(at time.Time, on, counted bool, window time.Duration) (held, covered time.Duration) {
	if n := len(s.samples); n > 0 && !at.After(s.samples[n-1].at) {
		s.samples = s.samples[:0] // the clock went back: start afresh
	}
	s.samples = append(s.samples, shareSample{at: at, on: on, counted: counted})
	cutoff := at.Add(-window)
	drop := 0
	// Keep the newest sample at or before the cutoff: its state covers the
	// window's start.
	for drop+1 < len(s.samples) && !s.samples[drop+1].at.After(cutoff) {
		drop++
	}
	if over := len(s.samples) - drop - maxShareSamples; over > 0 {
		drop += over
	}
	s.samples = s.samples[drop:]
	for i := 0; i+1 < len(s.samples); i++ {
		from, to := s.samples[i].at, s.samples[i+1].at
		if from.Before(cutoff) {
			from = cutoff
		}
		if !to.After(from) || !s.samples[i].counted {
			continue
		}
		covered += to.Sub(from)
		if s.samples[i].on {
			held += to.Sub(from)
		}
	}
	return held, covered
}
