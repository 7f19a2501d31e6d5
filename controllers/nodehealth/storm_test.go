package nodehealth

import (
	"testing"
	"time"

	. "github.com/onsi/gomega"
	clocktesting "k8s.io/utils/clock/testing"
)

func TestStormGate(t *testing.T) {
	g := NewWithT(t)
	clk := clocktesting.NewFakePassiveClock(time.Unix(1000, 0))
	gate := &stormGate{quiet: 300 * time.Millisecond, maxHold: 2 * time.Second, clock: clk}

	g.Expect(gate.hold("a")).To(BeZero(), "a node this process did not fence is never held (after a restart, say)")

	gate.fenced("a")
	g.Expect(gate.hold("a")).To(BeZero(), "a lone fence is written up at once")

	gate.fenced("b")
	clk.SetTime(clk.Now().Add(100 * time.Millisecond))
	gate.fenced("c")
	g.Expect(gate.hold("b")).To(Equal(300*time.Millisecond), "another node was fenced just now")
	g.Expect(gate.hold("c")).To(BeZero(), "the latest fence has nobody after it")

	clk.SetTime(clk.Now().Add(200 * time.Millisecond))
	g.Expect(gate.hold("b")).To(Equal(100*time.Millisecond), "until the fences have been quiet for 300 ms")
	clk.SetTime(clk.Now().Add(100 * time.Millisecond))
	g.Expect(gate.hold("b")).To(BeZero(), "the storm is over")
	g.Expect(gate.fencedAt).NotTo(HaveKey("b"), "a released node is forgotten")

	// A storm that never ends: every 100 ms another node is fenced.
	gate.fenced("d")
	for i := range 19 {
		clk.SetTime(clk.Now().Add(100 * time.Millisecond))
		gate.fenced("storm-" + string(rune('a'+i)))
		g.Expect(gate.hold("d")).To(BeNumerically(">", 0), "held %d00 ms after its fence", i+1)
	}
	clk.SetTime(clk.Now().Add(100 * time.Millisecond))
	gate.fenced("storm-z")
	g.Expect(gate.hold("d")).To(BeZero(), "written up after maxHold even though fences go on")

	long := &stormGate{quiet: 5 * time.Second, maxHold: time.Second, clock: clk}
	long.fenced("x")
	long.fenced("y")
	g.Expect(long.hold("x")).To(Equal(time.Second), "never past maxHold, even with a longer quiet period")

	off := &stormGate{}
	off.fenced("a")
	off.fenced("b")
	g.Expect(off.hold("a")).To(BeZero(), "quiet 0 turns the gate off")
	var none *stormGate
	none.fenced("a")
	g.Expect(none.hold("a")).To(BeZero())
}
