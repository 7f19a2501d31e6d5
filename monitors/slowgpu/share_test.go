package slowgpu

import (
	"testing"
	"time"

	. "github.com/onsi/gomega"
)

func TestShareCountsTimeHeldWithinTheWindow(t *testing.T) {
	g := NewWithT(t)
	t0 := time.Unix(1_700_000_000, 0)
	var s share
	at := func(sec float64) time.Time { return t0.Add(time.Duration(sec * float64(time.Second))) }
	held, covered := s.add(at(0), true, true, 10*time.Second)
	g.Expect([]time.Duration{held, covered}).To(Equal([]time.Duration{0, 0}), "one sample says nothing yet")
	held, covered = s.add(at(4), false, true, 10*time.Second)
	g.Expect([]time.Duration{held, covered}).To(Equal([]time.Duration{4 * time.Second, 4 * time.Second}), "the state lasts until the next sample")
	held, covered = s.add(at(6), true, false, 10*time.Second)
	g.Expect([]time.Duration{held, covered}).To(Equal([]time.Duration{4 * time.Second, 6 * time.Second}))
	held, covered = s.add(at(9), true, true, 10*time.Second)
	g.Expect([]time.Duration{held, covered}).To(Equal([]time.Duration{4 * time.Second, 6 * time.Second}), "time after an uncounted sample counts neither way")
	held, covered = s.add(at(13), true, true, 10*time.Second)
	g.Expect([]time.Duration{held, covered}).To(Equal([]time.Duration{5 * time.Second, 7 * time.Second}), "the window starts at 3 s: 1 s of the first sample is left")
	held, covered = s.add(at(30), false, true, 10*time.Second)
	g.Expect([]time.Duration{held, covered}).To(Equal([]time.Duration{10 * time.Second, 10 * time.Second}), "a long gap holds the last state")
	held, _ = s.add(at(20), true, true, 10*time.Second)
	g.Expect(held).To(BeZero(), "a clock that went back starts afresh")
}

// A window of many more polls than the history could once hold: 1 hour
// polled every 2 s (1,800 polls). A condition on throughout holds the whole
// window, one flipping at every poll half of it, with the history bounded
// by the changes, not the polls.
func TestShareCoversLongWindowsAtAnyPollInterval(t *testing.T) {
	g := NewWithT(t)
	t0 := time.Unix(1_700_000_000, 0)
	const window, poll = time.Hour, 2 * time.Second
	var steady, flipping share
	var held, flipHeld, covered time.Duration
	for i := range int(2*window/poll) + 1 {
		at := t0.Add(time.Duration(i) * poll)
		held, covered = steady.add(at, true, true, window)
		flipHeld, _ = flipping.add(at, i%2 == 0, true, window)
	}
	g.Expect(held).To(Equal(window), "on throughout holds the whole window")
	g.Expect(covered).To(Equal(window))
	g.Expect(steady.samples).To(HaveLen(1), "a state that never changes is one sample")
	g.Expect(flipHeld).To(Equal(window / 2))
	g.Expect(len(flipping.samples)).To(BeNumerically("<=", int(window/poll)+1))
	// The verdict a long window asks for can be reached.
	c := Config{Window: window, Share: 0.9}.WithDefaults()
	g.Expect(c.longEnough(held)).To(BeTrue())
}
