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

// wrote records that obj, read at resourceVersion readVersion, was written.
func (e *expectations) wrote(kind string, obj client.Object, readVersion string) {
	if e == nil || readVersion == "" {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.stale[expectationKey{kind, obj.GetName()}] = expectation{resourceVersion: readVersion, at: e.clock.Now()}
}

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
