package nodehealth

import (
	"sync"
	"time"

	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// expectationTimeout bounds how long a write may stay unseen in the cache
// before the reconciler decides anyway; an informer delivers a write within
// milliseconds, so this only covers a lost expectation (an object deleted
// and re-created under the same name, say).
const expectationTimeout = 30 * time.Second

// expectations remember, per object, the resourceVersion this process read
// just before it wrote the object. Until the cache shows another version,
// the cache does not hold the write, and a decision from it would repeat
// the one that caused the write (a second transition, a second Event, a
// second breaker count). Kubernetes' own controllers keep expectations for
// the same reason; these compare versions only for equality, as the API
// allows.
type expectations struct {
	clock clock.PassiveClock

	mu    sync.Mutex
	stale map[expectationKey]expectation
}

type expectationKey struct {
	kind, name string
}

type expectation struct {
	resourceVersion string
	at              time.Time
}

func newExpectations(clk clock.PassiveClock) *expectations {
	if clk == nil {
		clk = clock.RealClock{}
	}
	return &expectations{clock: clk, stale: map[expectationKey]expectation{}}
}

// wrote records that the object kind/name, read at readVersion, was
// written and the apiserver answered with writtenVersion. A write that
// changed nothing (the apiserver answers with the version it had: a status
// equal but for sub-second times, say) leaves nothing for the cache to
// catch up with, and expecting it to would stall the object until
// expectationTimeout.
func (e *expectations) wrote(kind, name, readVersion, writtenVersion string) {
	if e == nil || readVersion == "" || writtenVersion == readVersion {
		return
	}
	now := e.clock.Now()
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.stale) >= sweepAt {
		// Expectations of objects never listed again (a finding deleted
		// right after a write) would otherwise stay for good.
		for k, x := range e.stale {
			if now.Sub(x.at) >= expectationTimeout {
				delete(e.stale, k)
			}
		}
	}
	e.stale[expectationKey{kind, name}] = expectation{resourceVersion: readVersion, at: now}
}

// sweepAt is the number of expectations at which lapsed ones are dropped.
const sweepAt = 4096

// caughtUp says whether the cache's copy of an object (nil when the cache
// has none) holds every write this process made to it, and forgets the
// expectation once it does.
func (e *expectations) caughtUp(kind, name string, cached client.Object) bool {
	if e == nil {
		return true
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	k := expectationKey{kind, name}
	exp, ok := e.stale[k]
	if !ok {
		return true
	}
	if cached != nil && cached.GetResourceVersion() == exp.resourceVersion && e.clock.Since(exp.at) < expectationTimeout {
		return false
	}
	delete(e.stale, k)
	return true
}

// forget drops every expectation about a node's objects (the node is gone).
func (e *expectations) forget(kind, name string) {
	if e == nil {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	delete(e.stale, expectationKey{kind, name})
}
