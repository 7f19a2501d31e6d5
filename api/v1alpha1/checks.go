package v1alpha1

import (
	"slices"
	"strings"
)

// pointChecks report an occurrence, not a condition: no producer will ever
// say they cleared, so a successful recertification (or a human) closes them.
var pointChecks = []Check{CheckXID, CheckSXID, CheckGPULost, CheckECC, CheckRecertification, CheckManual}

// fabricChecks are the conditions recertification.requireFabricHealthy
// waits for before a node returns.
var fabricChecks = []Check{CheckFabric, CheckNVSwitch, CheckNVLinkDown, CheckIMEXDaemon, CheckIMEXDomain}

// IsPoint says whether the finding reports an occurrence (an XID, an ECC
// error) rather than a condition that a producer resolves.
func (s *NodeHealthEventSpec) IsPoint() bool { return slices.Contains(pointChecks, s.Check) }

// IsFabric says whether the finding is about the NVLink fabric or IMEX, the
// conditions a node waits to clear before it returns when the policy's
// recertification.requireFabricHealthy is set.
func (s *NodeHealthEventSpec) IsFabric() bool { return slices.Contains(fabricChecks, s.Check) }

// IsIMEX says whether the finding is about IMEX, which exists on a node only
// while it is a ComputeDomain member.
func (s *NodeHealthEventSpec) IsIMEX() bool {
	return s.Source == SourceIMEX || s.Check == CheckIMEXDaemon || s.Check == CheckIMEXDomain
}

// IsCliqueFault says whether the finding is about an NVLink clique's shared
// fabric rather than one node: the IMEX domain DOWN, a fatal NVSwitch fault
// (DCGM health or an SXid), or a GPU's fabric not COMPLETED or unhealthy
// (the monitor reports those Fatal; LIMITED_CAPACITY is Degraded and stays a
// node matter). A Fabric Manager that stopped on a node (source services) is
// the node's own: on the systems where it runs on the node, the NVSwitches it
// manages are the node's.
func (s *NodeHealthEventSpec) IsCliqueFault() bool {
	if s.Source == SourceServices {
		return false
	}
	switch s.Check {
	case CheckIMEXDomain:
		return strings.EqualFold(s.Code, "DOWN")
	case CheckNVSwitch, CheckSXID, CheckFabric:
		return s.Severity == SeverityFatal
	}
	return false
}
