package monitors

import "time"

// DefaultRepeat is how often a condition that still holds is reported again,
// so that its event's lastSeen moves and the operator knows it persists.
const DefaultRepeat = 5 * time.Minute

// Tracker turns a source's periodic view of conditions (a link is down, a
// rate is over its threshold, the fabric is not up) into findings: reported
// once when the condition starts, again at most every Repeat while it holds,
// and once as Resolved when it ends. It is not safe for concurrent use.
type Tracker struct {
	// Repeat is DefaultRepeat when zero.
	Repeat time.Duration

	open map[Key]trackedCondition
}

type trackedCondition struct {
	finding  Finding
	reported time.Time
}

// Set records whether the condition f describes holds at now, and reports
// what changed: f when it starts (or holds and was last reported Repeat ago),
// a resolution of the finding it reported when it stops.
func (t *Tracker) Set(now time.Time, f Finding, holds bool, report Reporter) {
	if t.open == nil {
		t.open = map[Key]trackedCondition{}
	}
	repeat := t.Repeat
	if repeat <= 0 {
		repeat = DefaultRepeat
	}
	k := f.Key()
	c, isOpen := t.open[k]
	switch {
	case holds && (!isOpen || now.Sub(c.reported) >= repeat):
		f.Time, f.Resolved = now, false
		t.open[k] = trackedCondition{finding: f, reported: now}
		report(f)
	case !holds && isOpen:
		delete(t.open, k)
		r := c.finding
		r.Time, r.Resolved, r.Count = now, true, 0
		report(r)
	}
}

// Open reports whether the condition with key k is open.
func (t *Tracker) Open(k Key) bool {
	_, ok := t.open[k]
	return ok
}

// ResolveWhere resolves every open condition whose finding matches.
func (t *Tracker) ResolveWhere(now time.Time, match func(*Finding) bool, report Reporter) {
	for k, c := range t.open {
		if match(&c.finding) {
			t.Set(now, c.finding, false, report)
			delete(t.open, k)
		}
	}
}
