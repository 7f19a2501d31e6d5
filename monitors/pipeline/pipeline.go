package pipeline

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/api/xid"
	"github.com/gpuhealth/gpuhealth/monitors"
	"github.com/gpuhealth/gpuhealth/monitors/spool"
)

// Defaults for Options.
const (
	// DefaultWindow is the coalescing window: repeats of a finding update
	// its object at most once per window. 5 s keeps a storm of 10,000 XIDs a
	// second to one write every 5 s while lastSeen stays fresh enough for
	// the operator's debounce (whose windows are minutes).
	DefaultWindow = 5 * time.Second
	// DefaultWorkers is how many objects are written at once.
	DefaultWorkers = 4
	// maxBackoff caps the retry delay after failed writes, so that the
	// spool drains within half a minute of the apiserver coming back.
	maxBackoff = 30 * time.Second
	// firstBackoff is the retry delay after the first failure.
	firstBackoff = 200 * time.Millisecond
	// idleForget is how long a published, clean entry is kept in memory
	// (for the coalescing window and its known count) after its last change.
	idleForget = time.Hour
)

// Options configure a Pipeline.
type Options struct {
	// NodeName is the node every event is about (the agent's own node).
	NodeName string
	// Client writes NodeHealthEvents. Its rest.Config's QPS and Burst are the
	// client-side rate limit.
	Client client.Client
	// Spool keeps unacknowledged findings; Replay are the records it held
	// when it was opened, published first.
	Spool  *spool.Spool
	Replay []spool.Record
	// Clock defaults to the real clock.
	Clock clock.WithTicker
	// Window is the coalescing window (DefaultWindow when zero).
	Window time.Duration
	// Workers is the number of concurrent writes (DefaultWorkers when zero).
	Workers int
	// Debounce rules hold back findings until they repeat.
	Debounce []DebounceRule
	// Log receives the pipeline's logs.
	Log logr.Logger
	// Checkpointed names the sources that keep a read position (the kmsg
	// cursor), each with the generation its durable position has reached.
	// Their occurrences are published only once a position that covers
	// them is durable (Seal), so that a crash can neither lose a count nor
	// count one twice.
	Checkpointed map[gpuhealthv1alpha1.Source]uint64
}

// Pipeline classifies, debounces and coalesces findings and publishes them as
// NodeHealthEvents. Report is safe to call from any goroutine; Run writes.
type Pipeline struct {
	opts Options

	mu       sync.Mutex
	entries  map[string]*entry
	debounce debouncer
	wake     chan struct{}
	// nextGen is the generation of the checkpointed sources' next durable
	// read position: the one that will cover the unsealed occurrences.
	nextGen uint64
	// recent remembers the XIDs of the last moments per GPU, for the
	// catalog's workflows that depend on other XIDs (45, 48, 159).
	recent recentXIDs
}

// entry is one NodeHealthEvent's state in the pipeline.
type entry struct {
	// rec is what remains to write; rec.Pending > 0 or rec.StateChanged
	// means the apiserver is behind.
	rec spool.Record
	// gen counts changes to rec, so a finished write knows whether more
	// came in meanwhile.
	gen uint64
	// stateGen counts changes of rec.Resolved, so a finished write knows
	// whether the state it wrote is still the latest.
	stateGen uint64
	// persistedGen is the gen last written to the spool.
	persistedGen uint64
	// urgent entries skip the coalescing window: a new finding or a change
	// between resolved and active is written at once.
	urgent bool
	// inflight is true while a worker writes this entry.
	inflight bool
	// lastWrite is when the apiserver last accepted a write for it.
	lastWrite time.Time
	// failures counts consecutive failed writes; retryAt is the earliest
	// next attempt.
	failures int
	retryAt  time.Time
	// pendingSince is when the oldest pending occurrence was reported (for
	// the latency histogram); zero when nothing is pending.
	pendingSince time.Time
	// touched is when the entry last changed, for forgetting idle ones.
	touched time.Time
	// unsealed is how many pending occurrences of a checkpointed source
	// no durable read position covers yet; they are not published.
	// sealable is how many of them the last Sync spooled, which the next
	// Seal releases.
	unsealed, sealable int64
}

func (e *entry) dirty() bool { return e.rec.Pending > 0 || e.rec.StateChanged }

// publishable says whether a write would change anything.
func (e *entry) publishable() bool { return e.rec.Pending > e.unsealed || e.rec.StateChanged }

// New returns a pipeline. Run must be called for anything to be written.
func New(opts Options) (*Pipeline, error) {
	if opts.NodeName == "" || opts.Client == nil || opts.Spool == nil {
		return nil, errors.New("pipeline needs a node name, a client and a spool")
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	if opts.Window <= 0 {
		opts.Window = DefaultWindow
	}
	if opts.Workers <= 0 {
		opts.Workers = DefaultWorkers
	}
	p := &Pipeline{
		opts:     opts,
		entries:  map[string]*entry{},
		debounce: debouncer{rules: opts.Debounce, held: map[string][]time.Time{}},
		wake:     make(chan struct{}, 1),
		recent:   recentXIDs{byGPU: map[string][]seenXID{}},
	}
	p.nextGen = 1
	for _, committed := range opts.Checkpointed {
		p.nextGen = after(committed)
	}
	now := opts.Clock.Now()
	for _, r := range opts.Replay {
		if r.Spec.NodeName != opts.NodeName {
			opts.Log.Info("Dropping spooled finding about another node", "record", r.Name(), "Node", klog.KRef("", r.Spec.NodeName))
			_ = opts.Spool.Delete(r.Name())
			continue
		}
		if committed, ok := opts.Checkpointed[r.Spec.Source]; ok && r.Unsealed > 0 {
			if r.UnsealedGen > committed {
				// The source's position never covered these: it reads
				// them again.
				r.Pending -= min(r.Unsealed, r.Pending)
			}
			r.Unsealed, r.UnsealedGen = 0, 0
		}
		if r.Pending == 0 && !r.StateChanged {
			_ = opts.Spool.Delete(r.Name())
			continue
		}
		p.entries[r.Name()] = &entry{rec: r, gen: 1, persistedGen: 1, urgent: true, pendingSince: now, touched: now}
	}
	spoolRecords.Set(float64(opts.Spool.Len()))
	return p, nil
}

// Report takes one finding from a source. It classifies and coalesces it in
// memory, writes a new finding or a change of state to the spool before
// returning, and wakes the publisher. It never calls the apiserver.
func (p *Pipeline) Report(f monitors.Finding) {
	now := p.opts.Clock.Now()
	if f.Time.IsZero() {
		f.Time = now
	}
	if err := normalize(&f); err != nil {
		droppedTotal.WithLabelValues(string(f.Severity), dropInvalid).Inc()
		p.opts.Log.Error(err, "Dropping invalid finding")
		return
	}
	classify(&f, p.recent.observe(&f, now))
	findingsTotal.WithLabelValues(string(f.Source), string(f.Check), string(f.Severity)).Inc()

	spec := gpuhealthv1alpha1.NodeHealthEventSpec{
		NodeName: p.opts.NodeName, Source: f.Source, Check: f.Check, Component: f.Component,
		Code: f.Code, Severity: f.Severity, RecommendedAction: f.Action, Message: f.Message,
	}
	name := xid.EventName(&spec)

	p.mu.Lock()
	defer p.mu.Unlock()
	e := p.entries[name]
	active := e != nil && !e.rec.Resolved && (e.rec.Base > 0 || e.rec.Pending > 0)
	n := p.debounce.admit(name, &f, active)
	if !f.Resolved && n == 0 {
		heldTotal.WithLabelValues(string(f.Source), string(f.Check)).Inc()
		return
	}
	isNew := e == nil
	if isNew {
		if f.Resolved {
			// Resolving something this agent has not seen since it
			// started: the object may exist from before a restart. The
			// publisher reads it and resolves it, or drops the entry.
			e = &entry{rec: spool.Record{Spec: spec, Base: -1, Resolved: true, ResolvedAt: &f.Time, StateChanged: true}}
		} else {
			e = &entry{rec: spool.Record{Spec: spec, Base: -1, FirstSeen: f.Time}}
		}
		p.entries[name] = e
		e.urgent = true
	}
	switch {
	case f.Resolved && !e.rec.Resolved:
		e.rec.Resolved, e.rec.ResolvedAt, e.rec.StateChanged = true, &f.Time, true
		e.urgent = true
		e.stateGen++
	case !f.Resolved && e.rec.Resolved:
		e.rec.Resolved, e.rec.ResolvedAt, e.rec.StateChanged = false, nil, true
		e.urgent = true
		e.stateGen++
	}
	if !f.Resolved {
		if e.rec.Pending == 0 {
			e.pendingSince = now
			if e.rec.FirstSeen.IsZero() || e.rec.Base <= 0 && f.Time.Before(e.rec.FirstSeen) {
				e.rec.FirstSeen = f.Time
			}
		}
		e.rec.Pending += n
		if _, ok := p.opts.Checkpointed[f.Source]; ok {
			e.unsealed += n
		}
		if f.Time.After(e.rec.LastSeen) {
			e.rec.LastSeen = f.Time
		}
	}
	e.gen++
	e.touched = now
	if e.urgent {
		// A new finding or a change of state goes to disk before Report
		// returns; repeats are spooled by the publisher, once per window,
		// or by Sync.
		_ = p.persistLocked(name, e) // logged; kept in memory and retried
	}
	p.signal()
}

// persistLocked writes e to the spool if it changed since the last write,
// and returns the spool's error. The caller holds p.mu.
func (p *Pipeline) persistLocked(name string, e *entry) error {
	if e.persistedGen == e.gen {
		return nil
	}
	// The occurrences no durable read position covers are marked with the
	// generation of the one that will: after a crash they count only if
	// that position was written, else the source reads them again.
	e.rec.Unsealed, e.rec.UnsealedGen = e.unsealed, 0
	if e.unsealed > 0 {
		e.rec.UnsealedGen = p.nextGen
	}
	dropped, err := p.opts.Spool.Put(&e.rec)
	for _, d := range dropped {
		if victim, ok := p.entries[d]; ok && !victim.inflight {
			droppedTotal.WithLabelValues(string(victim.rec.Spec.Severity), dropSpoolFull).Inc()
			p.opts.Log.Info("Spool full: dropping an older, less severe finding", "record", d)
			delete(p.entries, d)
		}
	}
	switch {
	case errors.Is(err, spool.ErrFull):
		// Nothing less severe to drop: this finding is kept in memory
		// only; it is still published while the agent runs.
		droppedTotal.WithLabelValues(string(e.rec.Spec.Severity), dropSpoolFull).Inc()
		p.opts.Log.Info("Spool full: finding kept in memory only", "record", name)
	case err != nil:
		p.opts.Log.Error(err, "Writing finding to the spool failed; kept in memory", "record", name)
	default:
		e.persistedGen = e.gen
	}
	spoolRecords.Set(float64(p.opts.Spool.Len()))
	return err
}

// Sync writes every entry that changed since it was last spooled, so that
// all occurrences reported so far survive a crash. A checkpointed source
// (see Options.Checkpointed) calls it with the generation of the read
// position it is about to write, and Seal once that position is durable;
// the occurrences not covered yet are spooled marked with gen. It returns
// the first error; entries that could not be written stay dirty and are
// tried again by the next Sync or publish.
func (p *Pipeline) Sync(gen uint64) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.nextGen = gen
	var first error
	for name, e := range p.entries {
		if e.unsealed > 0 && (e.rec.Unsealed != e.unsealed || e.rec.UnsealedGen != gen) {
			e.gen++ // spool it again, marked with gen
		}
		if e.persistedGen != e.gen && e.dirty() {
			// A full spool keeps the finding in memory by design (it holds
			// Fatal findings first); that is no reason to stop the caller.
			if err := p.persistLocked(name, e); err != nil && !errors.Is(err, spool.ErrFull) && first == nil {
				first = fmt.Errorf("spooling %s: %w", name, err)
			}
		}
		if e.persistedGen == e.gen {
			e.sealable = e.unsealed
		}
	}
	return first
}

// Seal says that the read position of generation gen is durable: the
// occurrences spooled with that generation (or an earlier one) may be
// published.
func (p *Pipeline) Seal(gen uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, e := range p.entries {
		e.unsealed -= min(e.sealable, e.unsealed)
		e.sealable = 0
	}
	p.nextGen = after(gen)
	p.signal()
}

// after is the generation after gen; the largest one (a checkpointed
// source without a usable position) has none after it and stays.
func after(gen uint64) uint64 {
	if gen == ^uint64(0) {
		return gen
	}
	return gen + 1
}

func (p *Pipeline) signal() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// Pending returns the number of entries the apiserver is behind on.
func (p *Pipeline) Pending() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, e := range p.entries {
		if e.dirty() {
			n++
		}
	}
	return n
}

// Run publishes until ctx is done.
func (p *Pipeline) Run(ctx context.Context) error {
	// Learn the REST mapping now rather than on the first finding: the
	// client discovers API groups lazily, which takes a second or more.
	if _, err := p.opts.Client.RESTMapper().RESTMapping(schema.GroupKind{Group: gpuhealthv1alpha1.GroupVersion.Group, Kind: "NodeHealthEvent"}); err != nil {
		p.opts.Log.V(1).Info("Discovering the NodeHealthEvent API failed; the first write retries", "err", err)
	}
	work := make(chan string)
	var wg sync.WaitGroup
	for range p.opts.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for name := range work {
				p.publish(ctx, name)
				p.signal()
			}
		}()
	}
	defer func() {
		close(work)
		wg.Wait()
	}()
	timer := p.opts.Clock.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		due, next := p.due()
		for _, name := range due {
			select {
			case work <- name:
			case <-ctx.Done():
				p.release(due)
				return nil
			}
		}
		if !timer.Stop() {
			select {
			case <-timer.C():
			default:
			}
		}
		timer.Reset(next)
		select {
		case <-ctx.Done():
			return nil
		case <-p.wake:
		case <-timer.C():
		}
	}
}

// release clears inflight on entries picked but not handed to a worker.
func (p *Pipeline) release(names []string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, n := range names {
		if e, ok := p.entries[n]; ok {
			e.inflight = false
		}
	}
}

// due returns the entries to write now, marked inflight, and how long until
// the next one falls due. It also forgets clean entries idle for an hour.
func (p *Pipeline) due() ([]string, time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.opts.Clock.Now()
	next := time.Hour
	var due []string
	for name, e := range p.entries {
		if e.inflight {
			continue
		}
		if !e.dirty() {
			if now.Sub(e.touched) > idleForget {
				delete(p.entries, name)
			}
			continue
		}
		if !e.publishable() {
			continue // waits for Seal, which signals
		}
		at := e.retryAt
		if !e.urgent && e.failures == 0 {
			if w := e.lastWrite.Add(p.opts.Window); w.After(at) {
				at = w
			}
		}
		if wait := at.Sub(now); wait > 0 {
			next = min(next, wait)
			continue
		}
		e.inflight = true
		due = append(due, name)
	}
	return due, next
}

// publish writes one entry: it spools the entry if it changed, makes sure
// the object exists and its count is known, then patches its status with
// the absolute count, lastSeen and resolved state.
func (p *Pipeline) publish(ctx context.Context, name string) {
	p.mu.Lock()
	e, ok := p.entries[name]
	if !ok {
		p.mu.Unlock()
		return
	}
	_ = p.persistLocked(name, e) // logged; the write below goes ahead
	rec, stateGen, since := e.rec, e.stateGen, e.pendingSince
	rec.Pending -= e.unsealed // only what a durable read position covers
	p.mu.Unlock()

	base, object, err := p.write(ctx, &rec, name)
	if object == name {
		object = ""
	}
	now := p.opts.Clock.Now()

	p.mu.Lock()
	defer p.mu.Unlock()
	e.inflight = false
	switch {
	case errors.Is(err, errGone):
		// A resolution for an object that does not exist: nothing to do.
		delete(p.entries, name)
		_ = p.opts.Spool.Delete(name)
		spoolRecords.Set(float64(p.opts.Spool.Len()))
		return
	case errors.Is(err, errInvalid):
		droppedTotal.WithLabelValues(string(rec.Spec.Severity), dropRejected).Inc()
		p.opts.Log.Error(err, "The apiserver rejected the finding; dropping it", "NodeHealthEvent", klog.KRef("", name))
		delete(p.entries, name)
		_ = p.opts.Spool.Delete(name)
		spoolRecords.Set(float64(p.opts.Spool.Len()))
		return
	case err != nil:
		if base >= 0 && (e.rec.Base < 0 || e.rec.Object != object) {
			// learnt before the failure (the object exists)
			e.rec.Base, e.rec.Object = base, object
			e.gen++
		}
		e.failures++
		backoff := min(firstBackoff<<min(e.failures-1, 10), maxBackoff)
		e.retryAt = now.Add(backoff)
		p.opts.Log.V(1).Info("Publishing finding failed; will retry", "NodeHealthEvent", klog.KRef("", name), "err", err, "retryIn", backoff.String())
		return
	}
	e.failures, e.retryAt, e.lastWrite, e.urgent = 0, time.Time{}, now, false
	if rec.Pending > 0 {
		publishLatency.Observe(now.Sub(since).Seconds())
	}
	e.rec.Base, e.rec.Object = base, object
	e.rec.Pending -= rec.Pending
	if e.stateGen == stateGen {
		e.rec.StateChanged = false
	}
	e.gen++
	if e.rec.Pending > 0 {
		e.pendingSince = now
	} else {
		e.pendingSince = time.Time{}
	}
	if !e.dirty() {
		if err := p.opts.Spool.Delete(name); err != nil {
			p.opts.Log.Error(err, "Removing published finding from the spool")
		}
		e.persistedGen = e.gen
		spoolRecords.Set(float64(p.opts.Spool.Len()))
	}
}
