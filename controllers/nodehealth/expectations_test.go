package nodehealth

import (
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"
)

// TestExpectations: the cache is behind while it shows the version read
// before our write, caught up once it shows any other, and an expectation
// lapses after expectationTimeout.
func TestExpectations(t *testing.T) {
	g := NewWithT(t)
	clk := clocktesting.NewFakeClock(t0)
	e := newExpectations(clk)
	at := func(rv string) *corev1.Node {
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n", ResourceVersion: rv}}
	}
	g.Expect(e.caughtUp(kindNode, "n", at("1"))).To(BeTrue(), "nothing written")
	e.wrote(kindNode, at("1"), "1")
	g.Expect(e.caughtUp(kindNode, "n", at("1"))).To(BeFalse(), "the cache shows the version we wrote over")
	g.Expect(e.caughtUp(kindNodeHealth, "n", at("1"))).To(BeTrue(), "kinds are apart")
	g.Expect(e.caughtUp(kindNode, "n", at("2"))).To(BeTrue(), "another version: our write or a later one")
	g.Expect(e.caughtUp(kindNode, "n", at("1"))).To(BeTrue(), "forgotten once caught up")

	e.wrote(kindNode, at("3"), "3")
	clk.Step(expectationTimeout)
	g.Expect(e.caughtUp(kindNode, "n", at("3"))).To(BeTrue(), "a lost expectation lapses")

	e.wrote(kindNode, at("4"), "4")
	e.forget(kindNode, "n")
	g.Expect(e.caughtUp(kindNode, "n", at("4"))).To(BeTrue(), "a deleted node's expectations go")

	var nilExp *expectations
	nilExp.wrote(kindNode, at("1"), "1")
	g.Expect(nilExp.caughtUp(kindNode, "n", at("1"))).To(BeTrue())

	// Expectations never checked again are swept once lapsed.
	for i := range sweepAt {
		e.wrote(kindHealthEvent, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: time.Duration(i).String()}}, "1")
	}
	clk.Step(expectationTimeout)
	e.wrote(kindNode, at("5"), "5")
	g.Expect(e.stale).To(HaveLen(1))
}
