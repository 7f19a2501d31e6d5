package nodehealth

import (
	"sync"
	"time"

	"k8s.io/utils/clock"
)

// stormGate holds back the bookkeeping after fences while a storm of fences
// goes on. In a storm (a rack losing power, a bad driver rollout) the
// apiserver's write budget is what limits how fast sick nodes stop taking
// new work; each fence is one node patch, while its bookkeeping (the
// transition, the finding's judgement, the node condition, an Event) is
// four more writes. Spending those after the storm fences every node
// sooner.
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
	clock clock.PassiveClock

	mu       sync.Mutex
	last     time.Time // the latest fence
	lastNode string    // the node of the latest fence
	fencedAt map[string]time.Time
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
}

// hold returns how long node's bookkeeping should wait, zero when it may go
// ahead: only a node this process fenced waits, and only while other nodes
// are being fenced, for at most maxHold since its own fence.
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
		return 0
	}
	return min(g.quiet-now.Sub(g.last), g.maxHold-now.Sub(at))
}

func (g *stormGate) now() time.Time {
	if g.clock != nil {
		return g.clock.Now()
	}
	return clock.RealClock{}.Now()
}
