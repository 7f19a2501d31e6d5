package monitors

import "time"

// Rate tracks one cumulative counter and answers its rate per second over a
// sliding window. A counter that goes down was reset (a driver reload, a
// reset of the NVLink counters) or wrapped; either way the increase across
// that sample is unknown, so the history restarts from it.
type Rate struct {
	samples []sample
}

type sample struct {
	at    time.Time
	value uint64
}

// maxSamples bounds the history. Only the oldest sample in the window and
// the newest decide a rate, and the ones between are there to become the
// oldest as the window moves on; so the samples kept are spaced at least
// window/maxSamples apart (a new sample replaces the newest kept while
// that one is nearer than this to the one before it), and any window is covered at any poll
// interval, its start known to within 1/maxSamples of it. (A window of more
// than maxSamples polls once kept only the last maxSamples of them: a
// 5-minute window polled every 2 s judged 128 s.)
const maxSamples = 64

// Add records value at time at and returns the rate per second over the
// samples within window before it, and whether there were enough samples
// (two at least) to say.
func (r *Rate) Add(at time.Time, value uint64, window time.Duration) (float64, bool) {
	if n := len(r.samples); n > 0 && value < r.samples[n-1].value {
		r.samples = r.samples[:0]
	}
	if n := len(r.samples); n >= 2 && r.samples[n-1].at.Sub(r.samples[n-2].at) < window/maxSamples {
		r.samples[n-1] = sample{at: at, value: value}
	} else {
		r.samples = append(r.samples, sample{at: at, value: value})
	}
	cutoff := at.Add(-window)
	drop := 0
	// Keep one sample at or before the cutoff so the window is covered.
	for drop+1 < len(r.samples) && !r.samples[drop+1].at.After(cutoff) {
		drop++
	}
	if over := len(r.samples) - drop - maxSamples; over > 0 {
		drop += over
	}
	r.samples = r.samples[drop:]
	if len(r.samples) < 2 {
		return 0, false
	}
	first, last := r.samples[0], r.samples[len(r.samples)-1]
	span := last.at.Sub(first.at).Seconds()
	if span <= 0 {
		return 0, false
	}
	return float64(last.value-first.value) / span, true
}

// Increase is how much the counter rose across the samples kept: over the
// last window, or since the history (re)started when that is shorter.
func (r *Rate) Increase() uint64 {
	if len(r.samples) < 2 {
		return 0
	}
	return r.samples[len(r.samples)-1].value - r.samples[0].value
}
