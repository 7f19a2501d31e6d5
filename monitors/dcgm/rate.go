package dcgm

import "time"

// sample is one reading of a cumulative counter.
type sample struct {
	t time.Time
	v int64
}

// counterWindow judges a cumulative error counter by its rate over a
// sliding window. It keeps the readings inside the window plus the newest
// one at or before the window's start, which is the baseline: the rate is
// (newest - baseline) / (time between them), and it is only judged once the
// readings span the whole window, so a short burst right after start or a
// reset is not extrapolated.
type counterWindow struct {
	samples []sample
}

// rateResult is what add learnt from a reading.
type rateResult struct {
	// judged is true when the readings span the window and rate is valid.
	judged bool
	// rate is errors per second over span.
	rate float64
	// delta is the counter's increase over span.
	delta int64
	// span is the time between the baseline and the newest reading.
	span time.Duration
	// reset is true when the counter went down: DCGM or the driver
	// restarted it (GPU reset, driver reload, hostengine restart). The
	// window restarts from this reading.
	reset bool
}

// add records a reading taken at t and judges the window. A reading not
// newer than the last one is ignored (DCGM had not refreshed the field).
func (w *counterWindow) add(t time.Time, v int64, window time.Duration) rateResult {
	if n := len(w.samples); n > 0 {
		last := w.samples[n-1]
		if !t.After(last.t) {
			return rateResult{}
		}
		if v < last.v {
			w.samples = append(w.samples[:0], sample{t: t, v: v})
			return rateResult{reset: true}
		}
	}
	w.samples = append(w.samples, sample{t: t, v: v})

	// Drop readings older than the baseline: the newest one at or before
	// the window's start stays.
	start := t.Add(-window)
	base := 0
	for i, s := range w.samples {
		if s.t.After(start) {
			break
		}
		base = i
	}
	if base > 0 {
		w.samples = append(w.samples[:0], w.samples[base:]...)
	}
	first := w.samples[0]
	if first.t.After(start) {
		return rateResult{}
	}
	span := t.Sub(first.t)
	delta := v - first.v
	return rateResult{judged: true, rate: float64(delta) / span.Seconds(), delta: delta, span: span}
}
