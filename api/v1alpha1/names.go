package v1alpha1

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"strings"
)

// eventNameHashLen is the number of hex digits of the identity hash in an
// event name: 40 bits, so a collision between two findings of one node needs
// about a million distinct findings on that node (the operator bounds events
// per node far below that).
const eventNameHashLen = 10

// maxNameLen is the length of a DNS subdomain, the longest object name.
const maxNameLen = 253

// EventName returns the deterministic name of the NodeHealthEvent for a
// finding. Every producer of the same finding (same node, source, check,
// component id and code) computes the same name, so a repeat becomes an update
// of the existing object and a stale cache meets AlreadyExists instead of
// creating a duplicate.
//
// The name is "<node>-<source>-<check>-<hash>" in lowercase, with the node part
// shortened when needed so that the whole fits the 253 characters of a DNS
// subdomain; the hash covers every identity field, so shortening never merges
// two findings. The monitor's admission policy
// (config/monitor/admission_policy.yaml) admits a monitor's create only under
// a name of this shape for the node its token is bound to, or of
// AlternateEventName's.
func EventName(nodeName string, source Source, check Check, componentID, code string) string {
	return eventName(nodeName, source, check, hash(nodeName, string(source), string(check), componentID, code))
}

// AlternateEventName returns the n-th (from 1) name a finding falls back to
// when the object under its name, EventName's or VerdictEventName's, is
// another finding's: name with "-<hash>" added, the hash covering name and
// n, and the node part shortened further when needed to fit. It has the
// same "<node>-<source>-<check>-" start as name, so the monitor's admission
// policy admits it for the same node.
func (s *NodeHealthEventSpec) AlternateEventName(name string, n int) string {
	tail := name
	if i := strings.LastIndexByte(name, '-'); i >= 0 {
		tail = name[i+1:]
	}
	return eventName(s.NodeName, s.Source, s.Check, tail+"-"+hash(name, strconv.Itoa(n)))
}

// eventName is "<node>-<source>-<check>-<tail>" in lowercase, with the node
// part cut (and stripped of the '.' and '-' the cut leaves at its end) so
// that the whole fits a DNS subdomain.
func eventName(nodeName string, source Source, check Check, tail string) string {
	suffix := "-" + strings.ToLower(string(source)) + "-" + strings.ToLower(string(check)) + "-" + tail
	node := strings.ToLower(nodeName)
	if limit := maxNameLen - len(suffix); len(node) > limit {
		node = strings.TrimRight(node[:limit], ".-")
	}
	return node + suffix
}

// hash is the first eventNameHashLen hex digits of the SHA-256 of fields
// joined by NUL.
func hash(fields ...string) string {
	sum := sha256.Sum256([]byte(strings.Join(fields, "\x00")))
	return hex.EncodeToString(sum[:])[:eventNameHashLen]
}

// EventName returns the deterministic name of the NodeHealthEvent that records this finding.
func (s *NodeHealthEventSpec) EventName() string {
	return EventName(s.NodeName, s.Source, s.Check, s.Component.ID, s.Code)
}

// VerdictEventName is EventName with the finding's severity and recommended
// action in the identity: the name for findings whose verdict differs from
// one occurrence to the next (an XID judged from its line), so that an
// occurrence judged Fatal is never counted into an object that says Info.
func (s *NodeHealthEventSpec) VerdictEventName() string {
	return EventName(s.NodeName, s.Source, s.Check, s.Component.ID, s.Code+"\x00"+string(s.Severity)+"\x00"+string(s.RecommendedAction))
}
