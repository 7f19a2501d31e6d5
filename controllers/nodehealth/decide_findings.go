package nodehealth

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"strconv"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/api/xid"
)

// DefaultRule names the built-in judgement in an event's classification.
const DefaultRule = "default"

// judgement is how one finding is judged under a policy at a time.
type judgement struct {
	// event is the finding; the reconcile records its judgement in event.Status.
	event *gpuhealthv1alpha1.NodeHealthEvent
	// orig is the finding as read, so record patches only what changed.
	orig *gpuhealthv1alpha1.NodeHealthEvent
	// verdict, action and rule are what the policy (or the built-in table) says.
	verdict gpuhealthv1alpha1.Verdict
	action  gpuhealthv1alpha1.Action
	rule    string
	catalog string
	// phase is the event's resulting phase.
	phase gpuhealthv1alpha1.EventPhase
	// counts is true when the finding counts against the node now: active,
	// verdict Quarantine and past its debounce.
	counts bool
	// reason explains the judgement in a sentence.
	reason string
	// scope is the rule's scope (empty: Node); device is the UUID of the
	// GPU the finding is handled on alone, when it is (then counts is
	// false: the finding does not count against the node).
	scope  gpuhealthv1alpha1.RuleScope
	device string
	// recheckAt is when the judgement changes by the passage of time alone
	// (a recovery hysteresis ending); zero when it does not.
	recheckAt time.Time
}

func matches(m gpuhealthv1alpha1.RuleMatch, s *gpuhealthv1alpha1.NodeHealthEventSpec) bool {
	return (len(m.Sources) == 0 || slices.Contains(m.Sources, s.Source)) &&
		(len(m.Checks) == 0 || slices.Contains(m.Checks, s.Check)) &&
		(len(m.Codes) == 0 || slices.Contains(m.Codes, s.Code)) &&
		(len(m.Severities) == 0 || slices.Contains(m.Severities, s.Severity))
}

// defaultJudgement is the built-in table: XIDs by the XID catalog, other
// findings by their own severity (Fatal quarantines, Degraded is observed,
// Info is ignored) and recommended action. An XID whose verdict depends on
// the occurrence (the driver's whole line, the XIDs that came with it; see
// xid.JudgedPerOccurrence) keeps the severity and action the monitor wrote,
// since only the monitor saw those.
func defaultJudgement(s *gpuhealthv1alpha1.NodeHealthEventSpec) (gpuhealthv1alpha1.Verdict, gpuhealthv1alpha1.Action, string, string) {
	severity, action, catalog := s.Severity, s.RecommendedAction, ""
	why := fmt.Sprintf("%s finding", severity)
	if s.Check == gpuhealthv1alpha1.CheckXID {
		n, err := strconv.Atoi(s.Code)
		if err != nil {
			n = -1
		}
		e := xid.Lookup(n, s.Message)
		catalog = xid.Version
		if xid.JudgedPerOccurrence(n) {
			why = fmt.Sprintf("XID %s (%s, catalog bucket %s) was judged %s by the monitor from its line and the XIDs beside it", s.Code, e.Summary(), e.Bucket, severity)
		} else {
			severity, action = e.Severity, e.Action
			why = fmt.Sprintf("XID %s is %s in the XID catalog (%s: %s)", s.Code, e.Severity, e.Bucket, e.Summary())
		}
	}
	switch severity {
	case gpuhealthv1alpha1.SeverityFatal:
		return gpuhealthv1alpha1.VerdictQuarantine, action, catalog, why
	case gpuhealthv1alpha1.SeverityDegraded:
		return gpuhealthv1alpha1.VerdictObserve, action, catalog, why
	default:
		return gpuhealthv1alpha1.VerdictIgnore, action, catalog, why
	}
}

// judge classifies one finding under the policy's rules at now.
func judge(ev *gpuhealthv1alpha1.NodeHealthEvent, rules []gpuhealthv1alpha1.Rule, now time.Time) judgement {
	s := &ev.Spec
	j := judgement{event: ev, rule: DefaultRule}
	var rule *gpuhealthv1alpha1.Rule
	for i := range rules {
		if matches(rules[i].Match, s) {
			rule = &rules[i]
			break
		}
	}
	var why string
	j.verdict, j.action, j.catalog, why = defaultJudgement(s)
	if rule != nil {
		j.rule, j.verdict, j.catalog, j.scope = rule.Name, rule.Verdict, "", rule.Scope
		why = fmt.Sprintf("rule %s says %s", rule.Name, rule.Verdict)
		if rule.Action != "" {
			j.action = rule.Action
		}
	}
	if j.action == "" {
		j.action = gpuhealthv1alpha1.ActionNone
	}

	st := &ev.Status
	switch {
	case j.verdict == gpuhealthv1alpha1.VerdictIgnore:
		j.phase, j.reason = gpuhealthv1alpha1.EventIgnored, why
		return j
	case superseded(ev):
		j.phase, j.reason = gpuhealthv1alpha1.EventSuperseded, why+"; closed at "+st.SupersededAt.UTC().Format(time.RFC3339)
		return j
	case st.Resolved:
		clearAfter := time.Duration(0)
		if rule != nil && rule.Recovery != nil {
			clearAfter = rule.Recovery.ClearAfter.Get(0)
		}
		resolvedAt := now
		if st.ResolvedAt != nil {
			resolvedAt = st.ResolvedAt.Time
		}
		if until := resolvedAt.Add(clearAfter); now.Before(until) {
			j.phase, j.recheckAt = gpuhealthv1alpha1.EventActive, until
			j.reason = fmt.Sprintf("%s; resolved, counts until the %s recovery hysteresis ends", why, clearAfter)
			break
		}
		j.phase, j.reason = gpuhealthv1alpha1.EventResolved, why+"; resolved"
		return j
	default:
		j.phase, j.reason = gpuhealthv1alpha1.EventActive, why
	}
	if j.verdict != gpuhealthv1alpha1.VerdictQuarantine {
		return j
	}
	if rule != nil && rule.Debounce != nil {
		window := rule.Debounce.Window.Get(0)
		st.Occurrences = sample(st, window, now)
		if seen := occurrencesWithin(st, window, now); seen < int64(rule.Debounce.Count) {
			j.reason = fmt.Sprintf("%s; waits for %d occurrences within %s (seen %d)", why, rule.Debounce.Count, window, seen)
			return j
		}
	}
	j.counts = true
	return j
}

// superseded says whether the finding was closed and has not recurred since.
func superseded(ev *gpuhealthv1alpha1.NodeHealthEvent) bool {
	st := &ev.Status
	if st.SupersededAt == nil {
		return false
	}
	if st.SupersededCount > 0 && st.Count > st.SupersededCount {
		// Occurred again since: the count says so even when lastSeen falls
		// in the second it was closed (both are kept to the second).
		return false
	}
	return st.LastSeen == nil || !st.LastSeen.After(st.SupersededAt.Time)
}

// maxOccurrenceSamples bounds status.occurrences (the CRD's MaxItems).
const maxOccurrenceSamples = 32

// sample returns the finding's occurrence samples with the count seen now
// added, and those older than the window dropped but the newest of them,
// which the window counts from. A finding coalesces its occurrences into
// one count, so the operator knows the count only at the times it looked:
// the first sample of a finding seen more than once is its first
// occurrence (count 1 at firstSeen), and between two samples the
// occurrences are taken as spread evenly.
func sample(st *gpuhealthv1alpha1.NodeHealthEventStatus, window time.Duration, now time.Time) []gpuhealthv1alpha1.OccurrenceSample {
	out := slices.Clone(st.Occurrences)
	at := now
	if st.LastSeen != nil {
		at = st.LastSeen.Time
	}
	if len(out) == 0 && st.SupersededCount == 0 && st.Count > 1 && st.FirstSeen != nil && st.FirstSeen.Time.Before(at) {
		out = append(out, gpuhealthv1alpha1.OccurrenceSample{Time: *st.FirstSeen, Count: 1})
	}
	if n := len(out); n == 0 || out[n-1].Count < st.Count {
		out = append(out, gpuhealthv1alpha1.OccurrenceSample{Time: metav1.NewTime(at), Count: st.Count})
	}
	cutoff := now.Add(-window)
	base := -1
	for i, s := range out {
		if !s.Time.After(cutoff) {
			base = i
		}
	}
	if base > 0 {
		out = out[base:]
	}
	for len(out) > maxOccurrenceSamples {
		// The second oldest goes: its occurrences are then spread over a
		// longer gap, which is what a coalesced count does anyway.
		out = slices.Delete(out, 1, 2)
	}
	return out
}

// occurrencesWithin counts the finding's occurrences within the window
// before now: its count less the count at the window's start, read off the
// samples (evenly between two), and never less than the count it had when
// it was last superseded.
func occurrencesWithin(st *gpuhealthv1alpha1.NodeHealthEventStatus, window time.Duration, now time.Time) int64 {
	cutoff := now.Add(-window)
	base := float64(st.SupersededCount)
	ss := st.Occurrences
	for i, s := range ss {
		if s.Time.After(cutoff) {
			break
		}
		at := float64(s.Count)
		if i+1 < len(ss) && ss[i+1].Time.After(cutoff) {
			next := ss[i+1]
			span := next.Time.Sub(s.Time.Time)
			if span > 0 {
				at += float64(next.Count-s.Count) * float64(cutoff.Sub(s.Time.Time)) / float64(span)
			}
		}
		base = max(base, at)
	}
	return max(int64(math.Ceil(float64(st.Count)-base-1e-9)), 0)
}

// judgeAll judges the node's findings under its policy: each judgement
// carries a copy of the finding with the status it should have, most
// counting and most severe first.
func judgeAll(o *observation) []judgement {
	out := make([]judgement, 0, len(o.findings))
	for _, orig := range o.findings {
		ev := orig.DeepCopy()
		j := judge(ev, o.policy.Spec.Rules, o.now.Time)
		ignoreNonMemberIMEX(o, &j)
		j.orig = orig
		ev.Status.Phase, ev.Status.Classification = j.phase, j.classification(o.policy.Name)
		out = append(out, j)
	}
	sort.SliceStable(out, func(a, b int) bool {
		ja, jb := out[a], out[b]
		if ja.counts != jb.counts {
			return ja.counts
		}
		if sa, sb := severityRank[ja.event.Spec.Severity], severityRank[jb.event.Spec.Severity]; sa != sb {
			return sa > sb
		}
		return ja.event.Name < jb.event.Name
	})
	return out
}

var severityRank = map[gpuhealthv1alpha1.Severity]int{
	gpuhealthv1alpha1.SeverityInfo: 0, gpuhealthv1alpha1.SeverityDegraded: 1, gpuhealthv1alpha1.SeverityFatal: 2,
}

// classification is what judge writes into the event's status.
func (j judgement) classification(policy string) *gpuhealthv1alpha1.Classification {
	reason := j.reason
	if len(reason) > 512 {
		reason = reason[:512]
	}
	return &gpuhealthv1alpha1.Classification{Verdict: j.verdict, Rule: j.rule, CatalogVersion: j.catalog, Policy: policy, Reason: reason}
}

// actionRank orders recommended actions from least to most drastic.
var actionRank = map[gpuhealthv1alpha1.Action]int{
	gpuhealthv1alpha1.ActionNone: 0, gpuhealthv1alpha1.ActionRecertify: 1, gpuhealthv1alpha1.ActionResetGPU: 2,
	gpuhealthv1alpha1.ActionRebootNode: 3, gpuhealthv1alpha1.ActionContactSupport: 4, gpuhealthv1alpha1.ActionReplaceNode: 5,
}

// needsHuman says whether an action sends the node to Failed instead of recertification.
func needsHuman(a gpuhealthv1alpha1.Action) bool {
	return a == gpuhealthv1alpha1.ActionContactSupport || a == gpuhealthv1alpha1.ActionReplaceNode
}
