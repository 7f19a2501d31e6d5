package nodehealth

import (
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	clocktesting "k8s.io/utils/clock/testing"
)

// TestStormGate: without a wake-up the gate tells a held node to look again
// when the storm may have passed.
func TestStormGate(t *testing.T) {
	g := NewWithT(t)
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
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

// TestStormGateWakesHeldNodesWhenTheStormPasses: with a wake-up a held node
// waits for its bound, not the quiet period, and is woken once, when no
// node has been fenced for quiet, however long the storm went on.
func TestStormGateWakesHeldNodesWhenTheStormPasses(t *testing.T) {
	g := NewWithT(t)
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	var mu sync.Mutex
	var wakes []string
	gate := &stormGate{quiet: 300 * time.Millisecond, maxHold: time.Minute, clock: clk, wake: func(node string) {
		mu.Lock()
		defer mu.Unlock()
		wakes = append(wakes, node)
	}}
	woken := func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(wakes)
	}

	gate.fenced("a")
	g.Expect(gate.hold("a")).To(BeZero(), "a lone fence is written up at once")

	// A storm of 40 s, a fence every 100 ms: longer than any fixed hold of
	// a few seconds.
	gate.fenced("b")
	for i := range 400 {
		clk.Step(100 * time.Millisecond)
		gate.fenced("storm-" + strconv.Itoa(i))
		if i == 0 {
			g.Expect(gate.hold("b")).To(Equal(time.Minute-100*time.Millisecond), "held up to its bound: the wake-up comes sooner")
		}
	}
	g.Expect(gate.hold("storm-0")).To(BeNumerically(">", 0))
	g.Consistently(woken, 50*time.Millisecond).Should(BeEmpty(), "nobody is woken while fences go on")

	clk.Step(200 * time.Millisecond)
	g.Consistently(woken, 50*time.Millisecond).Should(BeEmpty(), "not before quiet has passed")
	clk.Step(100 * time.Millisecond)
	g.Eventually(woken).Should(ConsistOf("b", "storm-0"), "every held node once, when the storm has passed")
	g.Expect(gate.hold("b")).To(BeZero(), "and its pass writes it up")
	g.Expect(gate.hold("storm-0")).To(BeZero())

	clk.Step(time.Second)
	g.Consistently(woken, 50*time.Millisecond).Should(HaveLen(2), "no second wake-up")

	// A node fenced in a storm that outlasts its bound is written up at
	// the bound, woken or not.
	gate.fenced("c")
	for i := range 700 {
		clk.Step(100 * time.Millisecond)
		gate.fenced("long-" + strconv.Itoa(i))
	}
	g.Expect(gate.hold("c")).To(BeZero(), "past maxHold")
}
