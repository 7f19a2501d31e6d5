package dcgm

import (
	"time"

	"github.com/gpuhealth/gpuhealth/monitors"
)

// scope names the check that owns a condition, so that one check's sweep
// does not resolve another's conditions.
type scope string

const (
	scopeRate   scope = "nvlink-rate"
	scopeIMEX   scope = "imex"
	scopeHealth scope = "health"
)

// conditions turns "this holds now" / "this no longer holds" into findings:
// a condition is reported once when it starts, again at most every repeat
// while it holds (so its event's lastSeen moves), and once as Resolved when
// it ends. It is owned by Run's goroutine.
type conditions struct {
	repeat time.Duration
	open   map[monitors.Key]*openCondition
}

// openCondition is a condition that holds.
type openCondition struct {
	finding  monitors.Finding
	scope    scope
	reported time.Time
}

func newConditions(repeat time.Duration) *conditions {
	return &conditions{repeat: repeat, open: map[monitors.Key]*openCondition{}}
}

// hold records that f holds at now and reports it when it is new or was
// last reported repeat ago.
func (c *conditions) hold(sc scope, f monitors.Finding, now time.Time, report monitors.Reporter) {
	k := f.Key()
	o, ok := c.open[k]
	if ok && now.Sub(o.reported) < c.repeat {
		return
	}
	f.Resolved = false
	if f.Time.IsZero() {
		f.Time = now
	}
	c.open[k] = &openCondition{finding: f, scope: sc, reported: now}
	report(f)
}

// holdOnce records that f holds at now and reports it only when it is new:
// for conditions DCGM keeps reporting long after the fault (incidents from
// its XID history), where a repeat would read as a new occurrence.
func (c *conditions) holdOnce(sc scope, f monitors.Finding, now time.Time, report monitors.Reporter) {
	if _, ok := c.open[f.Key()]; ok {
		return
	}
	c.hold(sc, f, now, report)
}

// release records that the condition with key k no longer holds and
// reports it resolved, with message, if it was open.
func (c *conditions) release(k monitors.Key, message string, now time.Time, report monitors.Reporter) {
	o, ok := c.open[k]
	if !ok {
		return
	}
	delete(c.open, k)
	f := o.finding
	f.Resolved, f.Time, f.Count, f.Message = true, now, 0, message
	report(f)
}

// sweep releases every open condition of scope sc whose key is not in seen.
func (c *conditions) sweep(sc scope, seen map[monitors.Key]bool, message string, now time.Time, report monitors.Reporter) {
	for k, o := range c.open {
		if o.scope == sc && !seen[k] {
			c.release(k, message, now, report)
		}
	}
}
