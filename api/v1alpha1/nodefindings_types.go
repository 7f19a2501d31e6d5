package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
)

// NodeConditionRule turns a Node condition into a finding: while the
// condition has status, the node has an active finding of source
// nodeCondition, check NodeCondition, code the condition's type, carrying
// the condition's reason and message; when it no longer has, the finding
// is resolved. The finding is written Fatal for verdict Quarantine and
// Degraded for Observe, so the built-in judgement gives it that verdict;
// a rule matching source nodeCondition judges it like any other finding.
//
// Who sets a Node condition: the node's kubelet and the node agents that
// write Node status with the node's credentials (node-problem-detector).
// The apiserver's NodeRestriction lets a node's kubelet write only its
// own Node, so a condition can take out only the node it is on.
// +kubebuilder:validation:XValidation:rule="self.type != 'GPUHealthy'",message="GPUHealthy is gpuhealth's own condition, the result of its judgement; it is never an input"
type NodeConditionRule struct {
	// type is the Node condition's type, for example ReadonlyFilesystem.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=128
	// +kubebuilder:validation:XValidation:rule="self.matches('^[A-Za-z0-9][A-Za-z0-9_.-]*$')",message="type must be a condition type: letters, digits and _ . - (it becomes the finding's code)"
	Type string `json:"type"`

	// status is the condition status that means trouble (default "True";
	// "False" for conditions such as Ready or NetworkUnavailable's opposite).
	// +optional
	// +kubebuilder:default="True"
	// +kubebuilder:validation:Enum=True;False;Unknown
	Status corev1.ConditionStatus `json:"status,omitempty"`

	// verdict is what the finding gets: Quarantine or Observe.
	// +optional
	// +kubebuilder:default=Observe
	// +kubebuilder:validation:Enum=Quarantine;Observe
	Verdict Verdict `json:"verdict,omitempty"`

	// action is the finding's recommended action (default None).
	// +optional
	Action Action `json:"action,omitempty"`
}

// DriftProperty is one property of a node's stack compared across its pool.
// +kubebuilder:validation:Enum=driver;cudaDriver;vbios;inforom;fabricManager;imex;ecc;persistence;mig;product;powerLimit;nicFirmware;nicRate
type DriftProperty string

// The properties drift compares. Each is one value per node: a property of
// each GPU (vbios, product, …) is the node's distinct values joined, so a
// node whose GPUs disagree among themselves differs from a pool whose GPUs
// agree.
const (
	DriftDriver        DriftProperty = "driver"
	DriftCUDADriver    DriftProperty = "cudaDriver"
	DriftVBIOS         DriftProperty = "vbios"
	DriftInfoROM       DriftProperty = "inforom"
	DriftFabricManager DriftProperty = "fabricManager"
	DriftIMEX          DriftProperty = "imex"
	DriftECC           DriftProperty = "ecc"
	DriftPersistence   DriftProperty = "persistence"
	DriftMIG           DriftProperty = "mig"
	DriftProduct       DriftProperty = "product"
	DriftPowerLimit    DriftProperty = "powerLimit"
	// DriftNICFirmware is the compute adapters' firmware versions.
	DriftNICFirmware DriftProperty = "nicFirmware"
	// DriftNICRate is the rates of the compute ports that are up: a port
	// that trained below its peers' rate makes its node an outlier.
	DriftNICRate DriftProperty = "nicRate"
)

// DriftProperties are all properties, in the order reports list them.
var DriftProperties = []DriftProperty{
	DriftDriver, DriftCUDADriver, DriftVBIOS, DriftInfoROM, DriftFabricManager, DriftIMEX,
	DriftECC, DriftPersistence, DriftMIG, DriftProduct, DriftPowerLimit, DriftNICFirmware, DriftNICRate,
}

// DriftSpec is how nodes of one pool are compared. A pool is the nodes of
// the policy that have the same values of poolLabelKeys; per property, the
// value more than half of the pool's reporting nodes have is the
// majority, and a node with another value has a Drift finding (source
// operator, code the property) naming its value and the majority's. A pool
// with no such majority, or fewer than minPoolSize nodes reporting the
// property, has no drift findings for it: there is nothing to drift from.
type DriftSpec struct {
	// enabled turns drift detection on (default true when drift is set).
	// +optional
	Enabled *bool `json:"enabled,omitempty"`

	// poolLabelKeys are the Node label keys whose values make a pool.
	// Default: nvidia.com/gpu.product.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=4
	// +kubebuilder:validation:items:MaxLength=317
	PoolLabelKeys []string `json:"poolLabelKeys,omitempty"`

	// properties are the properties compared. Default: all.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=16
	Properties []DriftProperty `json:"properties,omitempty"`

	// verdict is what a drift finding gets: Observe (default: recorded,
	// shown, alerted on) or Quarantine (the node is taken out of service,
	// or, new, never takes work, until its stack matches its pool's).
	// +optional
	// +kubebuilder:default=Observe
	// +kubebuilder:validation:Enum=Quarantine;Observe
	Verdict Verdict `json:"verdict,omitempty"`

	// minPoolSize is the fewest nodes reporting a property for it to be
	// compared (default 3): in a pool of two, neither is the odd one out.
	// +optional
	// +kubebuilder:validation:Minimum=2
	// +kubebuilder:validation:Maximum=10000
	MinPoolSize int32 `json:"minPoolSize,omitempty"`
}

// ExpectedGPUs is how many GPUs a node of one product has.
type ExpectedGPUs struct {
	// product is the value of the node's nvidia.com/gpu.product label.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	Product string `json:"product"`

	// count is how many GPUs such a node has.
	// +required
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=16
	Count int32 `json:"count"`
}

// GPUCountSpec is how many GPUs each node should have, and what a node
// with fewer gets. The monitor compares NVML's list with the PCI bus
// (GPUMissing code PCI, Fatal, reboot first); the operator compares the
// monitor's NVML count with the expected count of the node's product
// (code Expected, Fatal, reboot first) and what the scheduler is offered,
// allocatable nvidia.com/gpu or the GPUs in the node's ResourceSlices,
// with the expected count (code Allocatable or ResourceSlice).
type GPUCountSpec struct {
	// expected counts by product. A node whose product is not listed is
	// expected to have what its PCI bus shows (the monitor's report), or
	// else what its nvidia.com/gpu.count label says.
	// +optional
	// +listType=map
	// +listMapKey=product
	// +kubebuilder:validation:MaxItems=32
	Expected []ExpectedGPUs `json:"expected,omitempty"`

	// schedulerVerdict is what a node whose scheduler view has fewer GPUs
	// than expected gets: Observe (default; a device plugin also hides a
	// GPU it finds unhealthy, which other findings cover) or Quarantine.
	// +optional
	// +kubebuilder:default=Observe
	// +kubebuilder:validation:Enum=Quarantine;Observe
	SchedulerVerdict Verdict `json:"schedulerVerdict,omitempty"`
}
