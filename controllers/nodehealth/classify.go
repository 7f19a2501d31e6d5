package nodehealth

import (
	"fmt"
	"slices"
	"strconv"
	"time"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/api/xid"
)

// DefaultRule names the built-in judgement in an event's classification.
const DefaultRule = "default"

// judgement is how one finding is judged under a policy at a time.
type judgement struct {
	// event is the finding; the reconcile records its judgement in event.Status.
	event *gpuhealthv1alpha1.NodeHealthEvent
	// orig is the finding as read, so flushEvents patches only what changed.
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
	// recheckAt is when the judgement changes by the passage of time alone
	// (a recovery hysteresis ending); zero when it does not.
	recheckAt time.Time
}

// pointChecks are findings that report an occurrence, not a condition: no
// producer will ever say they cleared, so a successful recertification (or a
// human) closes them.
var pointChecks = []gpuhealthv1alpha1.Check{
	gpuhealthv1alpha1.CheckXID, gpuhealthv1alpha1.CheckSXID, gpuhealthv1alpha1.CheckGPULost,
	gpuhealthv1alpha1.CheckECC, gpuhealthv1alpha1.CheckRecertification, gpuhealthv1alpha1.CheckManual,
}

func isPointCheck(c gpuhealthv1alpha1.Check) bool { return slices.Contains(pointChecks, c) }

// fabricChecks are the conditions recertification.requireFabricHealthy waits for.
var fabricChecks = []gpuhealthv1alpha1.Check{
	gpuhealthv1alpha1.CheckFabric, gpuhealthv1alpha1.CheckNVSwitch, gpuhealthv1alpha1.CheckNVLinkDown,
	gpuhealthv1alpha1.CheckIMEXDaemon, gpuhealthv1alpha1.CheckIMEXDomain,
}

func matches(m gpuhealthv1alpha1.RuleMatch, s *gpuhealthv1alpha1.NodeHealthEventSpec) bool {
	return (len(m.Sources) == 0 || slices.Contains(m.Sources, s.Source)) &&
		(len(m.Checks) == 0 || slices.Contains(m.Checks, s.Check)) &&
		(len(m.Codes) == 0 || slices.Contains(m.Codes, s.Code)) &&
		(len(m.Severities) == 0 || slices.Contains(m.Severities, s.Severity))
}

// defaultJudgement is the built-in table: XIDs by the XID catalog, other
// findings by their own severity (Fatal quarantines, Degraded is observed,
// Info is ignored) and recommended action.
func defaultJudgement(s *gpuhealthv1alpha1.NodeHealthEventSpec) (gpuhealthv1alpha1.Verdict, gpuhealthv1alpha1.Action, string, string) {
	severity, action, catalog := s.Severity, s.RecommendedAction, ""
	why := fmt.Sprintf("%s finding", severity)
	if s.Check == gpuhealthv1alpha1.CheckXID {
		n, err := strconv.Atoi(s.Code)
		if err != nil {
			n = -1
		}
		e := xid.Lookup(n, s.Message)
		severity, action, catalog = e.Severity, e.Action, xid.Version
		why = fmt.Sprintf("XID %s is %s in the XID catalog (%s: %s)", s.Code, e.Severity, e.Bucket, e.Description)
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
		j.rule, j.verdict, j.catalog = rule.Name, rule.Verdict, ""
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
	if rule != nil && rule.Debounce != nil && !debounced(st, rule.Debounce) {
		j.reason = fmt.Sprintf("%s; waits for %d occurrences within %s (seen %d)", why, rule.Debounce.Count, rule.Debounce.Window, max(st.Count, 1))
		return j
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
	return st.LastSeen == nil || !st.LastSeen.After(st.SupersededAt.Time)
}

// debounced says whether a coalesced finding has reached count occurrences
// within window. Individual occurrence times are not kept (a storm is one
// object), so the test is on the finding's mean rate: count ≥ N and
// (lastSeen − firstSeen) × N ≤ window × count, i.e. at least N per window on
// average since it was first seen.
func debounced(st *gpuhealthv1alpha1.NodeHealthEventStatus, d *gpuhealthv1alpha1.Debounce) bool {
	count := max(st.Count, 1)
	if count < int64(d.Count) {
		return false
	}
	if st.FirstSeen == nil || st.LastSeen == nil {
		return true
	}
	span := st.LastSeen.Sub(st.FirstSeen.Time)
	return span*time.Duration(d.Count) <= d.Window.Get(0)*time.Duration(count)
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
