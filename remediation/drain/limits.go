package drain

import (
	"context"
	"sync"
	"time"

	"golang.org/x/time/rate"
	"k8s.io/apimachinery/pkg/types"
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

// budgetSpacing is the least time between the starts of two evictions
// under one PodDisruptionBudget, across every pass of the process.
//
// The apiserver's eviction reads the budget, checks it and writes its
// status back at the resourceVersion it read; on a conflict it waits 500
// ms (±10%) before it reads again, up to 20 times, and then answers 429.
// Evictions sent together under one budget conflict with each other:
// in the drain race (docs/performance.md), 64 in flight under one budget
// took 2 s at the median and 10 s, the retries' limit, at the 99th
// percentile, with 1,090 conflicting status writes for 200 evictions. One
// at a time they instead stall on every conflict with the disruption
// controller, which writes the budget's status after each eviction too.
// Spaced 25 ms apart (at most 40 a second a budget, twice what one budget
// took here) they still overlap, but rarely read the same version: the
// race's median eviction took 200 ms and the drain finished sooner.
const budgetSpacing = 25 * time.Millisecond

// budgetPacers spaces the evictions under each PodDisruptionBudget by
// budgetSpacing.
type budgetPacers struct {
	mu     sync.Mutex
	pacers map[types.NamespacedName]*rate.Limiter
}

// maxIdlePacers is how many budgets' pacers are kept before the idle ones
// (a full bucket: nothing evicted under them for budgetSpacing) are dropped.
const maxIdlePacers = 64

func newBudgetPacers() *budgetPacers {
	return &budgetPacers{pacers: map[types.NamespacedName]*rate.Limiter{}}
}

// wait waits, until ctx is done, for budget's turn to start an eviction. It
// fails at once when the turn would come after ctx's deadline.
func (b *budgetPacers) wait(ctx context.Context, budget types.NamespacedName) error {
	b.mu.Lock()
	l := b.pacers[budget]
	if l == nil {
		if len(b.pacers) >= maxIdlePacers {
			// The limiters' own clock: rate.Limiter.Wait reads time.Now,
			// so a pacer is idle by the wall clock, not the injected one.
			now := time.Now() //nolint:forbidigo // rate.Limiter keeps wall-clock time
			for k, p := range b.pacers {
				if p.TokensAt(now) >= 1 {
					delete(b.pacers, k)
				}
			}
		}
		l = rate.NewLimiter(rate.Every(budgetSpacing), 1)
		b.pacers[budget] = l
	}
	b.mu.Unlock()
	return l.Wait(ctx)
}
