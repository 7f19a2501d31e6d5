package v1alpha1

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
)

// eventNameHashLen is the number of hex digits of the identity hash in an
// event name: 40 bits, so a collision between two findings of one node needs
// about a million distinct findings on that node (the operator bounds events
// per node far below that).
const eventNameHashLen = 10

// EventName returns the deterministic name of the NodeHealthEvent for a
// finding. Every producer of the same finding (same node, source, check,
// component id and code) computes the same name, so a repeat becomes an update
// of the existing object and a stale cache meets AlreadyExists instead of
// creating a duplicate.
//
// The name is "<node>-<source>-<check>-<hash>" in lowercase, with the node part
// shortened when needed so that the whole fits the 253 characters of a DNS
// subdomain; the hash covers every identity field, so shortening never merges
// two findings.
func EventName(nodeName string, source Source, check Check, componentID, code string) string {
	sum := sha256.Sum256([]byte(strings.Join([]string{nodeName, string(source), string(check), componentID, code}, "\x00")))
	suffix := "-" + strings.ToLower(string(source)) + "-" + strings.ToLower(string(check)) + "-" + hex.EncodeToString(sum[:])[:eventNameHashLen]
	node := strings.ToLower(nodeName)
	if limit := 253 - len(suffix); len(node) > limit {
		node = strings.TrimRight(node[:limit], ".-")
	}
	return node + suffix
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
