package drain

import (
	"context"
	"sync"
)

// gate bounds the requests in flight across every pass of the process. Unlike
// a buffered channel its limit can change while requests are in flight: a lower
// limit takes effect as requests finish, a higher one at once.
type gate struct {
	mu       sync.Mutex
	limit    int
	inFlight int
	// freed is closed, and replaced, whenever a slot frees up or the limit rises.
	freed chan struct{}
}

// newGate returns a gate that admits limit requests at a time.
func newGate(limit int) *gate {
	return &gate{limit: limit, freed: make(chan struct{})}
}

// setLimit changes how many requests may be in flight.
func (g *gate) setLimit(limit int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if limit > g.limit {
		g.wakeLocked()
	}
	g.limit = limit
}

// acquire waits for a slot until ctx is done. Every nil return must be paired with release.
func (g *gate) acquire(ctx context.Context) error {
	for {
		g.mu.Lock()
		if g.inFlight < g.limit {
			g.inFlight++
			g.mu.Unlock()
			return nil
		}
		freed := g.freed
		g.mu.Unlock()
		select {
		case <-freed:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// release frees a slot taken by acquire.
func (g *gate) release() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.inFlight--
	g.wakeLocked()
}

// wakeLocked wakes every waiter; they race for the free slots. g.mu must be held.
func (g *gate) wakeLocked() {
	close(g.freed)
	g.freed = make(chan struct{})
}
