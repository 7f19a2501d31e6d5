package pipeline

import (
	"time"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/monitors"
)

// DebounceRule holds back findings of one check (and optionally one code)
// until they occurred Occurrences times within Window; then all the held
// occurrences are published together. Resolutions are never held.
type DebounceRule struct {
	// Check the rule applies to.
	Check gpuhealthv1alpha1.Check `json:"check"`
	// Code, when set, narrows the rule to one code.
	Code string `json:"code,omitempty"`
	// Occurrences is how many occurrences within Window release the finding;
	// 1 or less disables the rule.
	Occurrences int `json:"occurrences"`
	// Window is the span the occurrences must fall within.
	Window time.Duration `json:"window"`
}

func (r *DebounceRule) matches(f *monitors.Finding) bool {
	return r.Check == f.Check && (r.Code == "" || r.Code == f.Code)
}

// debouncer holds the recent occurrence times of held findings, by event
// name. It is not safe for concurrent use; the pipeline's mutex guards it.
type debouncer struct {
	rules []DebounceRule
	held  map[string][]time.Time
}

// maxHeld bounds the occurrence times kept per finding.
const maxHeld = 64

// admit records f's occurrences and returns how many to publish now: 0 while
// the finding is held, else every occurrence held so far plus f's. active
// says the finding is already published and not resolved: repeats of an
// active finding are never held.
func (d *debouncer) admit(name string, f *monitors.Finding, active bool) int64 {
	if f.Resolved {
		delete(d.held, name)
		return 0
	}
	var rule *DebounceRule
	for i := range d.rules {
		if d.rules[i].matches(f) && d.rules[i].Occurrences > 1 {
			rule = &d.rules[i]
			break
		}
	}
	if rule == nil || active {
		return f.Occurrences()
	}
	cutoff := f.Time.Add(-rule.Window)
	kept := d.held[name][:0]
	for _, t := range d.held[name] {
		if !t.Before(cutoff) {
			kept = append(kept, t)
		}
	}
	var total int64
	for range min(f.Occurrences(), maxHeld) {
		kept = append(kept, f.Time)
	}
	total = int64(len(kept)) - min(f.Occurrences(), maxHeld) + f.Occurrences()
	if total < int64(rule.Occurrences) {
		if len(kept) > maxHeld {
			kept = kept[len(kept)-maxHeld:]
		}
		d.held[name] = kept
		return 0
	}
	delete(d.held, name)
	return total
}
