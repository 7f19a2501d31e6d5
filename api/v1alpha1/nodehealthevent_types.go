package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Component identifies the piece of hardware or the service a finding is about.
type Component struct {
	// kind is the kind of component: GPU, NVLink, NVSwitch, IMEX, Service, NIC or Node.
	// +required
	Kind ComponentKind `json:"kind"`

	// id identifies the component on its node: a GPU UUID ("GPU-8f6c…"), an
	// NVLink link ("GPU-8f6c…/link-3"), an NVSwitch PCI bus id, or empty for
	// the node as a whole.
	// +optional
	// +kubebuilder:validation:MaxLength=256
	// +kubebuilder:validation:XValidation:rule="self.matches('^[A-Za-z0-9][A-Za-z0-9._:/-]*$')",message="component id may contain only letters, digits and . _ : / - (for example GPU-8f6c2b1e-…/link-3)"
	ID string `json:"id,omitempty"`

	// instance is the MIG instance on the GPU the finding names, as the
	// driver prints it: "GPU-I:01" or "GPU-I:01 GPU-CI:02". The component
	// stays the GPU: a fault on one instance is the GPU's.
	// +optional
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:XValidation:rule="self.matches('^GPU-I:[0-9]{1,3}( GPU-CI:[0-9]{1,3})?$')",message="instance must be \"GPU-I:<n>\" or \"GPU-I:<n> GPU-CI:<n>\""
	Instance string `json:"instance,omitempty"`
}

// NodeHealthEventSpec is the finding itself. It is immutable once created: a
// repeat of the same finding updates the status, a different finding is a
// different object.
// +kubebuilder:validation:XValidation:rule="self.check != 'XID' || self.code.matches('^[0-9]{1,5}$')",message="code of an XID finding must be the XID number (1 to 5 digits, for example \"79\")"
// +kubebuilder:validation:XValidation:rule="self.check != 'SXID' || self.code.matches('^[0-9]{1,5}$')",message="code of an SXID finding must be the SXid number (for example \"20034\")"
// +kubebuilder:validation:XValidation:rule="self.component.kind != 'GPU' || (has(self.component.id) && size(self.component.id) > 0)",message="component.id is required when component.kind is GPU (use the GPU UUID)"
// +kubebuilder:validation:XValidation:rule="self.component.kind != 'NVLink' || (has(self.component.id) && self.component.id.matches('/link-[0-9]+$'))",message="component.id of an NVLink component must end in /link-<n> (for example GPU-8f6c…/link-3)"
type NodeHealthEventSpec struct {
	// nodeName is the name of the Node the finding is about. A monitor may
	// only write findings about the node it runs on.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:XValidation:rule="self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$')",message="nodeName must be a valid node name: lowercase letters, digits, '-' and '.', starting and ending with a letter or digit"
	NodeName string `json:"nodeName"`

	// source is the part of gpuhealth that produced the finding.
	// +required
	Source Source `json:"source"`

	// check is the kind of fault the finding is about.
	// +required
	Check Check `json:"check"`

	// component is the hardware or service the finding is about.
	// +required
	Component Component `json:"component"`

	// code is the fault's code within its check: the XID number ("79"), a
	// DCGM error name ("DCGM_FR_NVLINK_CRC_ERROR_THRESHOLD"), a counter name
	// ("CRC_FLIT"), a state ("NOT_COMPLETED").
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=128
	// +kubebuilder:validation:XValidation:rule="self.matches('^[A-Za-z0-9][A-Za-z0-9_.:-]*$')",message="code may contain only letters, digits and _ . : - (for example \"79\" or \"DCGM_FR_NVLINK_DOWN\")"
	Code string `json:"code"`

	// severity says how bad the finding is: Fatal, Degraded or Info.
	// +required
	Severity Severity `json:"severity"`

	// recommendedAction is what the finding's producer recommends doing. The
	// RemediationPolicy decides what is actually done.
	// +optional
	// +kubebuilder:default=None
	RecommendedAction Action `json:"recommendedAction,omitempty"`

	// message is the human-readable description, such as the kernel log line
	// or the counter rate that crossed its threshold.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	Message string `json:"message,omitempty"`
}

// EventPhase is where a NodeHealthEvent stands.
// +kubebuilder:validation:Enum=Active;Resolved;Ignored;Superseded
type EventPhase string

const (
	// EventActive means the fault is present and counts toward the node's state.
	EventActive EventPhase = "Active"
	// EventResolved means the producer reported the fault cleared.
	EventResolved EventPhase = "Resolved"
	// EventIgnored means the policy ignores this finding.
	EventIgnored EventPhase = "Ignored"
	// EventSuperseded means a later finding or a completed recertification replaced it.
	EventSuperseded EventPhase = "Superseded"
)

// Classification records how the operator judged a finding.
type Classification struct {
	// verdict is what the operator decided: Quarantine, Observe or Ignore.
	// +required
	Verdict Verdict `json:"verdict"`

	// rule is the name of the RemediationPolicy rule that matched, or
	// "default" when the built-in table decided.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Rule string `json:"rule"`

	// catalogVersion is the version of the built-in XID table used, when it was used.
	// +optional
	// +kubebuilder:validation:MaxLength=64
	CatalogVersion string `json:"catalogVersion,omitempty"`

	// policy is the name of the RemediationPolicy that judged the finding.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	Policy string `json:"policy,omitempty"`

	// reason explains the verdict in a sentence, for example why a finding
	// waits for its debounce count.
	// +optional
	// +kubebuilder:validation:MaxLength=512
	Reason string `json:"reason,omitempty"`
}

// TransitionRef names a NodeHealth transition.
type TransitionRef struct {
	// from is the phase the node left.
	// +required
	From NodeHealthPhase `json:"from"`

	// to is the phase the node entered.
	// +required
	To NodeHealthPhase `json:"to"`

	// time is when the transition happened.
	// +required
	Time metav1.Time `json:"time"`
}

// NodeHealthEventStatus is what the monitor and the operator know about the
// finding over time.
// +kubebuilder:validation:XValidation:rule="!has(self.resolvedAt) || (has(self.resolved) && self.resolved)",message="resolvedAt may only be set when resolved is true"
// +kubebuilder:validation:XValidation:rule="!has(self.firstSeen) || !has(self.lastSeen) || self.lastSeen >= self.firstSeen",message="lastSeen must not be before firstSeen"
type NodeHealthEventStatus struct {
	// count is how many times the finding was seen. Repeats inside one
	// coalescing window are folded into one update.
	// +optional
	// +kubebuilder:validation:Minimum=0
	Count int64 `json:"count,omitempty"`

	// firstSeen is when the finding was first seen.
	// +optional
	FirstSeen *metav1.Time `json:"firstSeen,omitempty"`

	// lastSeen is when the finding was last seen.
	// +optional
	LastSeen *metav1.Time `json:"lastSeen,omitempty"`

	// resolved is true when the producer reports the fault cleared (a counter
	// rate back under its threshold, fabric back to COMPLETED, IMEX READY).
	// +optional
	Resolved bool `json:"resolved,omitempty"`

	// resolvedAt is when the producer reported the fault cleared.
	// +optional
	ResolvedAt *metav1.Time `json:"resolvedAt,omitempty"`

	// phase is where the finding stands: Active, Resolved, Ignored or Superseded.
	// +optional
	Phase EventPhase `json:"phase,omitempty"`

	// classification records how the operator judged the finding.
	// +optional
	Classification *Classification `json:"classification,omitempty"`

	// supersededAt is when a completed recertification, a manual release or a
	// human's uncordon closed this finding. A later occurrence (lastSeen after
	// it) makes the finding active again.
	// +optional
	SupersededAt *metav1.Time `json:"supersededAt,omitempty"`

	// observedBy is the NodeHealth transition this finding caused, if any.
	// +optional
	ObservedBy *TransitionRef `json:"observedBy,omitempty"`

	// occurrences are the counts the operator saw and when, oldest first,
	// kept for findings a debounce rule judges: occurrences within the
	// rule's window are the count less the newest sample at least a window
	// old. Samples older than the window are dropped but that newest one;
	// at most 32 are kept (the second oldest goes first, so a full list
	// counts more, never fewer). Written by the operator.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=32
	Occurrences []OccurrenceSample `json:"occurrences,omitempty"`

	// supersededCount is the count when the finding was last superseded:
	// a debounce counts only occurrences after it. Written by the operator.
	// +optional
	// +kubebuilder:validation:Minimum=0
	SupersededCount int64 `json:"supersededCount,omitempty"`
}

// OccurrenceSample is a finding's count as the operator saw it at a time.
type OccurrenceSample struct {
	// time is the finding's lastSeen when the count was seen.
	// +required
	Time metav1.Time `json:"time"`

	// count is the finding's count then.
	// +required
	// +kubebuilder:validation:Minimum=0
	Count int64 `json:"count"`
}

// NodeHealthEvent is one finding about one node: an XID, an NVLink error
// rate, a fabric or IMEX fault. Its name is derived from node, source, check,
// component and code (see EventName), so a repeat updates count and lastSeen
// instead of creating a new object.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,shortName=nhe,categories=gpuhealth
// +kubebuilder:selectablefield:JSONPath=`.spec.nodeName`
// +kubebuilder:selectablefield:JSONPath=`.spec.check`
// +kubebuilder:printcolumn:name="Node",type=string,JSONPath=`.spec.nodeName`
// +kubebuilder:printcolumn:name="Source",type=string,JSONPath=`.spec.source`
// +kubebuilder:printcolumn:name="Check",type=string,JSONPath=`.spec.check`
// +kubebuilder:printcolumn:name="Code",type=string,JSONPath=`.spec.code`
// +kubebuilder:printcolumn:name="Severity",type=string,JSONPath=`.spec.severity`
// +kubebuilder:printcolumn:name="Action",type=string,JSONPath=`.spec.recommendedAction`
// +kubebuilder:printcolumn:name="Count",type=integer,JSONPath=`.status.count`
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:printcolumn:name="Component",type=string,JSONPath=`.spec.component.id`,priority=1
// +kubebuilder:printcolumn:name="Instance",type=string,JSONPath=`.spec.component.instance`,priority=1
// +kubebuilder:printcolumn:name="Message",type=string,JSONPath=`.spec.message`,priority=1
type NodeHealthEvent struct {
	metav1.TypeMeta `json:",inline"`

	// metadata is the standard object metadata.
	// +optional
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec is the finding. It is immutable once created.
	// +required
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec is immutable: a NodeHealthEvent records one finding; a different finding is a new NodeHealthEvent"
	Spec NodeHealthEventSpec `json:"spec"`

	// status is what is known about the finding over time.
	// +optional
	Status NodeHealthEventStatus `json:"status,omitempty"`
}

// NodeHealthEventList is a list of NodeHealthEvents.
//
// +kubebuilder:object:root=true
type NodeHealthEventList struct {
	metav1.TypeMeta `json:",inline"`
	// metadata is the standard list metadata.
	// +optional
	metav1.ListMeta `json:"metadata,omitempty"`
	// items are the NodeHealthEvents.
	Items []NodeHealthEvent `json:"items"`
}
