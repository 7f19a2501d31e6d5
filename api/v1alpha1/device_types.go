package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// RuleScope is what a rule's quarantine takes out of service: the whole
// node, or only the GPU its finding names.
// +kubebuilder:validation:Enum=Node;Device
type RuleScope string

const (
	// ScopeNode quarantines, drains and recertifies the whole node.
	ScopeNode RuleScope = "Node"
	// ScopeDevice quarantines, drains and recertifies only the GPU the
	// finding names, through a DeviceTaintRule, while the node stays in
	// service; it falls back to the node's workflow when the GPU cannot be
	// handled alone (see DeviceQuarantineSpec).
	ScopeDevice RuleScope = "Device"
)

// DeviceTaintEffect is the effect of the DeviceTaintRule that quarantines a GPU.
// +kubebuilder:validation:Enum=NoSchedule;NoExecute
type DeviceTaintEffect string

const (
	// DeviceNoSchedule stops new allocations of the GPU; the pods holding
	// it are evicted through the Eviction API, honouring their
	// PodDisruptionBudgets.
	DeviceNoSchedule DeviceTaintEffect = "NoSchedule"
	// DeviceNoExecute also has kube-controller-manager delete the pods
	// still holding the GPU once the drain's timeout has passed (a plain
	// delete, past PodDisruptionBudgets): the Eviction API always has its
	// chance first.
	DeviceNoExecute DeviceTaintEffect = "NoExecute"
)

// DeviceQuarantineSpec is how one GPU is taken out of service alone, for
// findings of rules with scope Device, on nodes whose GPUs a DRA driver
// publishes as devices in ResourceSlices.
type DeviceQuarantineSpec struct {
	// driver is the DRA driver whose ResourceSlices publish the GPUs, each
	// device with a uuid attribute. Default gpu.nvidia.com (NVIDIA's DRA
	// driver: pool = node, devices gpu-<minor>).
	// +optional
	// +kubebuilder:default="gpu.nvidia.com"
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:XValidation:rule="self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$')",message="driver must be a DNS subdomain such as gpu.nvidia.com"
	Driver string `json:"driver,omitempty"`

	// deviceClassName is the DeviceClass a recertification Job's claim
	// asks for, narrowed to the one GPU by its uuid. Default gpu.nvidia.com.
	// +optional
	// +kubebuilder:default="gpu.nvidia.com"
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:XValidation:rule="self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$')",message="deviceClassName must be a DNS subdomain such as gpu.nvidia.com"
	DeviceClassName string `json:"deviceClassName,omitempty"`

	// maxDevicesPerNode is how many GPUs of one node may be out of service
	// alone; a finding on one more GPU takes the whole node out instead
	// (more than that many bad GPUs points at the node: its board, its
	// power, its driver). Default 2.
	// +optional
	// +kubebuilder:default=2
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=64
	MaxDevicesPerNode int32 `json:"maxDevicesPerNode,omitempty"`

	// effect is the DeviceTaintRule's effect: NoSchedule (default) or
	// NoExecute, which also deletes what still holds the GPU once the
	// drain's timeout has passed. A dry-run policy writes the effect None
	// instead, and reports how many pods NoExecute would evict.
	// +optional
	// +kubebuilder:default="NoSchedule"
	Effect DeviceTaintEffect `json:"effect,omitempty"`

	// reset runs first in each recertification attempt, on the GPU alone
	// (its Job claims exactly that GPU, by uuid, and tolerates the
	// quarantine), for example nvidia-smi -r -i $(GPUHEALTH_GPU_UUID).
	// It is the step "devreset" of the install's Job rules. Unset: no reset.
	// +optional
	Reset *JobTemplate `json:"reset,omitempty"`

	// job is the per-GPU recertification test, judged by its exit code,
	// run on the GPU alone like reset (step "devcert"). Unset: the GPU
	// returns once its findings are resolved.
	// +optional
	Job *JobTemplate `json:"job,omitempty"`

	// timeout is each Job's deadline. Default 15m.
	// +optional
	// +kubebuilder:default="15m"
	// +kubebuilder:validation:XValidation:rule="self.matches('^([0-9]+([.][0-9]+)?(ns|us|µs|ms|s|m|h))+$') && duration(self) >= duration('1s') && duration(self) <= duration('8760h')",message="timeout must be a duration from 1s to 8760h (a year) such as 30s, 5m or 1h"
	Timeout *Duration `json:"timeout,omitempty"`

	// backoff is the wait after a failed attempt before the next. Default 1m.
	// +optional
	// +kubebuilder:default="1m"
	// +kubebuilder:validation:XValidation:rule="self == '0' || self.matches('^([0-9]+([.][0-9]+)?(ns|us|µs|ms|s|m|h))+$') && (duration(self) == duration('0s') || duration(self) >= duration('1s')) && duration(self) <= duration('8760h')",message="backoff must be 0 or a duration from 1s to 8760h (a year) such as 0s, 30s or 5m"
	Backoff *Duration `json:"backoff,omitempty"`

	// maxAttempts is how many failed attempts leave the GPU Failed: still
	// tainted, named in the node's status, for a human. Default 2.
	// +optional
	// +kubebuilder:default=2
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=20
	MaxAttempts int32 `json:"maxAttempts,omitempty"`
}

// DevicePhase is where one GPU taken out of service alone stands.
// +kubebuilder:validation:Enum=Quarantined;Draining;Recertifying;Failed
type DevicePhase string

const (
	// DeviceQuarantined is a GPU whose DeviceTaintRule is being made; nothing new is
	// allocated the GPU once it exists.
	DeviceQuarantined DevicePhase = "Quarantined"
	// DeviceDraining is a GPU whose holders (pods whose claims hold it) are evicted.
	DeviceDraining DevicePhase = "Draining"
	// DeviceRecertifying is a GPU whose reset and test Jobs run.
	DeviceRecertifying DevicePhase = "Recertifying"
	// DeviceFailed is a GPU that failed its attempts and stays tainted for a human.
	DeviceFailed DevicePhase = "Failed"
)

// DeviceStatus is one GPU out of service alone. A GPU back in service has
// no entry.
type DeviceStatus struct {
	// uuid is the GPU's UUID, as its findings and the driver name it.
	// +required
	// +kubebuilder:validation:MaxLength=128
	UUID string `json:"uuid"`

	// driver is the DRA driver that publishes the GPU.
	// +required
	// +kubebuilder:validation:MaxLength=63
	Driver string `json:"driver"`

	// pool is the driver's pool the GPU is in (NVIDIA's: the node's name).
	// +required
	// +kubebuilder:validation:MaxLength=253
	Pool string `json:"pool"`

	// device is the GPU's name in the pool (NVIDIA's: gpu-<minor>).
	// +required
	// +kubebuilder:validation:MaxLength=63
	Device string `json:"device"`

	// phase is Quarantined, Draining, Recertifying or Failed.
	// +required
	Phase DevicePhase `json:"phase"`

	// since is when the GPU entered its phase.
	// +required
	Since metav1.Time `json:"since"`

	// outSince is when the GPU went out of service (goodput counts from it).
	// +required
	OutSince metav1.Time `json:"outSince"`

	// reason is a CamelCase word for the phase.
	// +optional
	// +kubebuilder:validation:MaxLength=64
	Reason string `json:"reason,omitempty"`

	// message says what the GPU waits for, with the numbers a human needs.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	Message string `json:"message,omitempty"`

	// findings are the NodeHealthEvents that took the GPU out.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=8
	Findings []string `json:"findings,omitempty"`

	// class is the finding's class, the taint's value.
	// +optional
	// +kubebuilder:validation:MaxLength=63
	Class string `json:"class,omitempty"`

	// rule is the DeviceTaintRule that keeps the GPU out of service.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	Rule string `json:"rule,omitempty"`

	// attempt is the recertification attempt, from 1.
	// +optional
	// +kubebuilder:validation:Minimum=0
	Attempt int32 `json:"attempt,omitempty"`

	// attemptStartedAt is when the attempt began (after a failed one, when
	// it begins: the backoff's end); its Jobs' names carry it.
	// +optional
	AttemptStartedAt *metav1.Time `json:"attemptStartedAt,omitempty"`

	// podsLeft is how many pods still held the GPU at the last drain pass.
	// +optional
	PodsLeft int32 `json:"podsLeft,omitempty"`

	// wouldEvict is, under a dry-run policy, how many pods the quarantine
	// would have evicted, as kube-controller-manager counted them for the
	// None rule.
	// +optional
	WouldEvict *int32 `json:"wouldEvict,omitempty"`
}

// String names the GPU for messages: its device and UUID.
func (d DeviceStatus) String() string { return d.Device + " (" + d.UUID + ")" }
