// Package v1alpha1 holds the gpuhealth.dev/v1alpha1 API: NodeHealthEvent (one
// finding about one node), NodeHealth (where a node stands in the remediation
// state machine) and RemediationPolicy (how findings are judged and nodes
// handled).
//
// +kubebuilder:object:generate=true
// +groupName=gpuhealth.dev
package v1alpha1
