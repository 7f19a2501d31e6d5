package breaker

import (
	"testing"
	"time"

	. "github.com/onsi/gomega"
)

func TestBreaker(t *testing.T) {
	start := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	s := Settings{Limit: 2, Window: 10 * time.Minute, CoolDown: 30 * time.Minute}

	t.Run("quarantines up to the limit pass, the next opens the breaker", func(t *testing.T) {
		g := NewWithT(t)
		b := New()
		ok, _ := b.Allow("p", s, start)
		g.Expect(ok).To(BeTrue())
		ok, _ = b.Allow("p", s, start.Add(time.Minute))
		g.Expect(ok).To(BeTrue())
		ok, st := b.Allow("p", s, start.Add(2*time.Minute))
		g.Expect(ok).To(BeFalse())
		g.Expect(st.Open).To(BeTrue())
		g.Expect(st.Message).To(ContainSubstring("2 nodes entered quarantine within 10m0s (limit 2)"))
		ok, _ = b.Allow("p", s, start.Add(20*time.Minute))
		g.Expect(ok).To(BeFalse(), "stays open through the cool-down even when the window empties")
	})

	t.Run("quarantines spread wider than the window never open it", func(t *testing.T) {
		g := NewWithT(t)
		b := New()
		for i := range 10 {
			ok, _ := b.Allow("p", s, start.Add(time.Duration(i)*6*time.Minute))
			g.Expect(ok).To(BeTrue(), "quarantine %d", i)
		}
	})

	t.Run("the cool-down closes it and counting starts afresh", func(t *testing.T) {
		g := NewWithT(t)
		b := New()
		b.Allow("p", s, start)
		b.Allow("p", s, start)
		ok, _ := b.Allow("p", s, start)
		g.Expect(ok).To(BeFalse())
		ok, st := b.Allow("p", s, start.Add(30*time.Minute))
		g.Expect(ok).To(BeTrue())
		g.Expect(st.Open).To(BeFalse())
		g.Expect(st.InWindow).To(Equal(1))
	})

	t.Run("a reset closes it once per token", func(t *testing.T) {
		g := NewWithT(t)
		b := New()
		b.Allow("p", s, start)
		b.Allow("p", s, start)
		b.Allow("p", s, start)
		g.Expect(b.Peek("p", s, start).Open).To(BeTrue())
		g.Expect(b.Reset("p", "r1", start)).To(BeTrue())
		g.Expect(b.Peek("p", s, start).Open).To(BeFalse())
		ok, _ := b.Allow("p", s, start)
		g.Expect(ok).To(BeTrue())
		g.Expect(b.Reset("p", "r1", start)).To(BeFalse(), "the same token is honoured once")
	})

	t.Run("a breaker seeded open stays open for the rest of its cool-down", func(t *testing.T) {
		g := NewWithT(t)
		b := New()
		b.Seed("p", nil, "", start.Add(-20*time.Minute))
		ok, st := b.Allow("p", s, start)
		g.Expect(ok).To(BeFalse(), "the window is empty, but the breaker was open")
		g.Expect(st.Since).To(Equal(start.Add(-20*time.Minute)), "the cool-down is not restarted")
		ok, _ = b.Allow("p", s, start.Add(10*time.Minute))
		g.Expect(ok).To(BeTrue(), "it closes when the original cool-down ends")
	})

	t.Run("a seeded history counts, and policies are independent", func(t *testing.T) {
		g := NewWithT(t)
		b := New()
		b.Seed("p", []time.Time{start.Add(-time.Minute), start.Add(-2 * time.Minute)}, "", time.Time{})
		g.Expect(b.Seeded("p")).To(BeTrue())
		ok, _ := b.Allow("p", s, start)
		g.Expect(ok).To(BeFalse())
		ok, _ = b.Allow("other", s, start)
		g.Expect(ok).To(BeTrue())
	})
}
