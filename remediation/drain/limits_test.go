package drain

import (
	"context"
	"testing"
	"time"

	. "github.com/onsi/gomega"
)

func TestGateAdmitsUpToItsLimitAndFollowsLimitChanges(t *testing.T) {
	g := NewWithT(t)
	gt := newGate(2)
	cancelled, cancel := context.WithCancel(t.Context())
	cancel()

	g.Expect(gt.acquire(t.Context())).To(Succeed())
	g.Expect(gt.acquire(t.Context())).To(Succeed())
	g.Expect(gt.acquire(cancelled)).To(MatchError(context.Canceled), "a third request waits while two are in flight")

	// A waiter is let in when the limit rises.
	admitted := make(chan error, 1)
	go func() { admitted <- gt.acquire(t.Context()) }()
	gt.setLimit(3)
	g.Eventually(admitted).WithTimeout(10 * time.Second).Should(Receive(BeNil()))

	// A lower limit holds new requests back until enough in flight finish.
	gt.setLimit(1)
	gt.release()
	g.Expect(gt.acquire(cancelled)).To(MatchError(context.Canceled), "two still in flight, limit 1")
	go func() { admitted <- gt.acquire(t.Context()) }()
	gt.release()
	g.Expect(gt.acquire(cancelled)).To(MatchError(context.Canceled), "one still in flight, limit 1")
	g.Expect(admitted).NotTo(Receive())
	gt.release()
	g.Eventually(admitted).WithTimeout(10 * time.Second).Should(Receive(BeNil()))
}
