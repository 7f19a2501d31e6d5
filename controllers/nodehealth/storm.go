package nodehealth

import (
	"sync"
	"time"

	"k8s.io/utils/clock"
)

// defaultStormHoldMax bounds how long a storm holds one node's write-up.
// Measured on the 2-core bench cluster: the fences of a 5,000-node storm
// take about a minute and a 10,000-node storm's two to three, and a bound
// shorter than the storm (10 s, once the default) lets the first nodes'
// write-ups compete with the later fences (5,000 nodes cordoned in 92 s
// against 55 s held for the whole storm; docs/performance.md). The bound
// only matters in a storm that never pauses for StormQuiet.
const defaultStormHoldMax = 3 * time.Minute

// stormGate holds back the bookkeeping after fences while a storm of fences
// goes on. In a storm (a rack losing power, a bad driver rollout) the
// apiserver's write budget is what limits how fast sick nodes stop taking
// new work; each fence is one node patch, while its bookkeeping (the
// transition, the finding's judgement, the node condition, an Event) is
// four more writes. Spending those after the storm fences every node
// sooner.
//
// The hold adapts to the storm: a held node waits until no node has been
// fenced for quiet, however long the storm lasts, bounded by maxHold after
// its own fence. It does not poll: the gate wakes every held node once when
// the storm has passed (wake), and the node's requeue at the bound is the
// fallback. Polling each held node every quiet period cost thousands of
// passes a second in a 5,000-node storm, CPU the apiserver needed.
//
// The gate has a clock of its own, the real one unless a test sets it, not
// the reconciler's Clock: it shapes load and decides nothing, so a test's
// fake reconciler clock must not hold a node forever.
type stormGate struct {
	// quiet is how long no other node must have been fenced before a
	// fenced node's bookkeeping goes ahead; zero turns the gate off.
	quiet time.Duration
	// maxHold bounds the hold of one node, so a storm that never ends
	// still writes every node up.
	maxHold time.Duration
	// clock is the real clock when nil; tests set a fake one.
	clock clock.WithDelayedExecution
	// wake is called, outside the lock, for each held node once the storm
	// has passed; nil: held nodes wait for their requeue.
	wake func(node string)

	mu       sync.Mutex
	last     time.Time // the latest fence
	lastNode string    // the node of the latest fence
	fencedAt map[string]time.Time
	held     map[string]bool // nodes told to wait, to wake when the storm passes
	timer    clock.Timer     // fires quiet after the latest fence
}

// fenced records that node was fenced now.
func (g *stormGate) fenced(node string) {
	if g == nil || g.quiet <= 0 {
		return
	}
	now := g.now()
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.fencedAt == nil {
		g.fencedAt = map[string]time.Time{}
	}
	g.fencedAt[node] = now
	g.last, g.lastNode = now, node
	if g.timer == nil {
		// In a goroutine of its own: a fake clock runs the function under
		// its lock, which passed's clock reading would wait for.
		g.timer = g.clk().AfterFunc(g.quiet, func() { go g.passed() })
	} else {
		g.timer.Reset(g.quiet)
	}
}

// hold returns how long node's bookkeeping should wait, zero when it may go
// ahead: only a node this process fenced waits, and only while other nodes
// are being fenced, for at most maxHold since its own fence. A held node is
// woken when the storm passes, so the wait returned is the bound.
func (g *stormGate) hold(node string) time.Duration {
	if g == nil || g.quiet <= 0 {
		return 0
	}
	now := g.now()
	g.mu.Lock()
	defer g.mu.Unlock()
	at, ok := g.fencedAt[node]
	if !ok {
		return 0
	}
	if g.lastNode == node || now.Sub(g.last) >= g.quiet || now.Sub(at) >= g.maxHold {
		delete(g.fencedAt, node)
		delete(g.held, node)
		return 0
	}
	if g.wake == nil {
		// Nobody to wake it: look again when the storm may have passed.
		return min(g.quiet-now.Sub(g.last), g.maxHold-now.Sub(at))
	}
	if g.held == nil {
		g.held = map[string]bool{}
	}
	g.held[node] = true
	return g.maxHold - now.Sub(at)
}

// passed runs quiet after the latest fence it knows of: if no fence came
// since, it wakes every held node.
func (g *stormGate) passed() {
	g.mu.Lock()
	if wait := g.quiet - g.now().Sub(g.last); wait > 0 {
		// A fence raced the timer's firing; its Reset may have been lost.
		g.timer.Reset(wait)
		g.mu.Unlock()
		return
	}
	held := g.held
	g.held = nil
	g.mu.Unlock()
	if g.wake == nil {
		return
	}
	for node := range held {
		g.wake(node)
	}
}

func (g *stormGate) clk() clock.WithDelayedExecution {
	if g.clock != nil {
		return g.clock
	}
	return clock.RealClock{}
}

func (g *stormGate) now() time.Time { return g.clk().Now() }
