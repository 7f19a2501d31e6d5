package v1alpha1

// Source names the part of gpuhealth that produced a finding.
// +kubebuilder:validation:Enum=nvml;dcgm;kmsg;imex;draDriver;services;ib;nodeCondition;operator;recertification;manual
type Source string

const (
	// SourceNVML is the monitor's NVML source (event sets, NVLink counters, fabric state).
	SourceNVML Source = "nvml"
	// SourceDCGM is the monitor's DCGM source (policy violations, health watches, fields).
	SourceDCGM Source = "dcgm"
	// SourceKmsg is the monitor's kernel log source (NVRM Xid and NVSwitch SXid lines).
	SourceKmsg Source = "kmsg"
	// SourceIMEX is the monitor's IMEX source (nvidia-imex-ctl output).
	SourceIMEX Source = "imex"
	// SourceDRADriver is a health taint NVIDIA's DRA driver put on one of
	// its devices (gpu.nvidia.com/xid, gpu-lost), read from the node's
	// ResourceSlices.
	SourceDRADriver Source = "draDriver"
	// SourceServices is the monitor's services source: whether NVIDIA's
	// host services (Fabric Manager, the persistence daemon, a host-managed
	// IMEX daemon) run, read from the host's /proc.
	SourceServices Source = "services"
	// SourceIB is the monitor's ib source: the state, rate and error
	// counters of the node's InfiniBand and RoCE ports, read from the
	// kernel's RDMA sysfs tree.
	SourceIB Source = "ib"
	// SourceNodeCondition is a Node condition the policy lists (for example
	// node-problem-detector's ReadonlyFilesystem), turned into a finding by
	// the operator.
	SourceNodeCondition Source = "nodeCondition"
	// SourceOperator is a finding the operator derives from what the
	// cluster shows about a node: its stack drifting from its pool's, or
	// the scheduler seeing fewer GPUs than the node should have.
	SourceOperator Source = "operator"
	// SourceRecertification is the operator's recertification Job.
	SourceRecertification Source = "recertification"
	// SourceManual is a human who recorded a finding by hand.
	SourceManual Source = "manual"
)

// Check names what was checked: the kind of fault a finding is about.
// +kubebuilder:validation:Enum=XID;SXID;GPULost;ECC;NVLinkErrors;NVLinkDown;Fabric;NVSwitch;IMEXDaemon;IMEXDomain;PCIe;InfoROM;Thermal;Power;Throttled;PCIeDegraded;MemoryRepair;ThermalMargin;NVLinkDegraded;Service;NIC;NodeCondition;GPUMissing;Drift;Recertification;Manual
type Check string

const (
	// CheckXID is an NVIDIA driver XID error; the code is the XID number.
	CheckXID Check = "XID"
	// CheckSXID is an NVSwitch SXid error; the code is the SXid number.
	CheckSXID Check = "SXID"
	// CheckGPULost is a GPU that no longer answers (NVML ERROR_GPU_IS_LOST).
	CheckGPULost Check = "GPULost"
	// CheckECC is an ECC memory error count or event.
	CheckECC Check = "ECC"
	// CheckNVLinkErrors is an NVLink error counter (CRC, replay, recovery) rising faster than its threshold.
	CheckNVLinkErrors Check = "NVLinkErrors"
	// CheckNVLinkDown is an NVLink link that is not up.
	CheckNVLinkDown Check = "NVLinkDown"
	// CheckFabric is the GPU's NVLink fabric state or health summary (not COMPLETED, UNHEALTHY, LIMITED_CAPACITY).
	CheckFabric Check = "Fabric"
	// CheckNVSwitch is an NVSwitch fault reported by DCGM health watches.
	CheckNVSwitch Check = "NVSwitch"
	// CheckIMEXDaemon is the node's IMEX daemon not READY.
	CheckIMEXDaemon Check = "IMEXDaemon"
	// CheckIMEXDomain is the node's IMEX domain DOWN or DEGRADED.
	CheckIMEXDomain Check = "IMEXDomain"
	// CheckPCIe is the GPU's PCIe link: replays (retransmissions) over their limit.
	CheckPCIe Check = "PCIe"
	// CheckInfoROM is the GPU's InfoROM (which keeps its ECC and retired-page records) found corrupt.
	CheckInfoROM Check = "InfoROM"
	// CheckThermal is a GPU slowed or over its limits for heat (thermal violations, clocks events).
	CheckThermal Check = "Thermal"
	// CheckPower is the GPU's power telemetry failing.
	CheckPower Check = "Power"
	// CheckThrottled is a GPU whose clocks are held down by a cause other
	// than its workload (HW slowdown, HW or SW thermal slowdown, HW power
	// brake) for most of the judging window; the code names the reason.
	CheckThrottled Check = "Throttled"
	// CheckPCIeDegraded is a GPU whose PCIe link runs below the generation
	// or width it and its slot negotiated, while it is busy; the code is
	// GENERATION or WIDTH.
	CheckPCIeDegraded Check = "PCIeDegraded"
	// CheckMemoryRepair is the GPU's memory repair state: a row remap
	// pending (a GPU reset applies it), a row remap failure, or retired
	// pages pending (GPUs before Ampere).
	CheckMemoryRepair Check = "MemoryRepair"
	// CheckThermalMargin is a GPU running within a few degrees of its
	// slowdown temperature for most of the judging window.
	CheckThermalMargin Check = "ThermalMargin"
	// CheckNVLinkDegraded is an active NVLink running below the speed of
	// the other links of its GPU.
	CheckNVLinkDegraded Check = "NVLinkDegraded"
	// CheckService is one of NVIDIA's host services not running or
	// restarting over and over; the code says which (NotRunning,
	// Restarting). Fabric Manager on an NVSwitch system is CheckFabric.
	CheckService Check = "Service"
	// CheckNIC is a compute-fabric NIC (an InfiniBand HCA or a RoCE port)
	// that is down, flapping, trained below its expected rate, counting
	// link errors faster than their threshold or missing (source ib), or
	// whose driver logged a fault (source kmsg: mlx5 health, command
	// timeouts, firmware resets, module events); the code says which.
	CheckNIC Check = "NIC"
	// CheckNodeCondition is a Node condition the policy lists holding; the
	// code is the condition type.
	CheckNodeCondition Check = "NodeCondition"
	// CheckGPUMissing is a node with fewer GPUs than it should have: NVML
	// lists fewer than the PCI bus or the expected count (code PCI,
	// Expected), or the scheduler sees fewer (code Allocatable,
	// ResourceSlice).
	CheckGPUMissing Check = "GPUMissing"
	// CheckDrift is a node whose stack (driver, VBIOS, Fabric Manager
	// version, ECC mode, …) differs from its pool's majority; the code
	// names the property.
	CheckDrift Check = "Drift"
	// CheckRecertification is the result of a recertification Job.
	CheckRecertification Check = "Recertification"
	// CheckManual is a finding a human recorded.
	CheckManual Check = "Manual"
)

// ComponentKind names the kind of hardware or service a finding is about.
// +kubebuilder:validation:Enum=GPU;NVLink;NVSwitch;IMEX;Service;NIC;Node
type ComponentKind string

const (
	// ComponentGPU is one GPU; the component id is its UUID.
	ComponentGPU ComponentKind = "GPU"
	// ComponentNVLink is one NVLink link; the component id is "<GPU UUID>/link-<n>".
	ComponentNVLink ComponentKind = "NVLink"
	// ComponentNVSwitch is one NVSwitch; the component id is its PCI bus id or UUID.
	ComponentNVSwitch ComponentKind = "NVSwitch"
	// ComponentIMEX is the node's IMEX daemon or the IMEX domain it belongs to.
	ComponentIMEX ComponentKind = "IMEX"
	// ComponentService is one of NVIDIA's host services; the component id
	// is its name (nvidia-fabricmanager, nvidia-persistenced, nvidia-imex).
	ComponentService ComponentKind = "Service"
	// ComponentNIC is one network port or adapter of the compute fabric:
	// the component id is "<RDMA device>/<port>" (mlx5_0/1) for a port,
	// the RDMA device (mlx5_0) or its PCI address for an adapter.
	ComponentNIC ComponentKind = "NIC"
	// ComponentNode is the node as a whole.
	ComponentNode ComponentKind = "Node"
)

// Severity says how bad a finding is.
// +kubebuilder:validation:Enum=Fatal;Degraded;Info
type Severity string

const (
	// SeverityFatal means the component cannot be trusted with work.
	SeverityFatal Severity = "Fatal"
	// SeverityDegraded means the component works with reduced capacity or reliability.
	SeverityDegraded Severity = "Degraded"
	// SeverityInfo means the finding is recorded for context only.
	SeverityInfo Severity = "Info"
)

// Action is what a finding recommends doing about it.
// +kubebuilder:validation:Enum=None;ResetGPU;RebootNode;Recertify;ReplaceNode;ContactSupport
type Action string

const (
	// ActionNone recommends nothing.
	ActionNone Action = "None"
	// ActionResetGPU recommends a GPU reset before recertification.
	ActionResetGPU Action = "ResetGPU"
	// ActionRebootNode recommends a node reboot before recertification.
	ActionRebootNode Action = "RebootNode"
	// ActionRecertify recommends running recertification only.
	ActionRecertify Action = "Recertify"
	// ActionReplaceNode recommends replacing the hardware; the node goes to Failed.
	ActionReplaceNode Action = "ReplaceNode"
	// ActionContactSupport recommends a human and the vendor; the node goes to Failed.
	ActionContactSupport Action = "ContactSupport"
)

// Verdict is what a RemediationPolicy rule decides about a matching finding.
// +kubebuilder:validation:Enum=Quarantine;Observe;Ignore
type Verdict string

const (
	// VerdictQuarantine takes the node out of service.
	VerdictQuarantine Verdict = "Quarantine"
	// VerdictObserve records the finding and shows it on the NodeHealth without acting.
	VerdictObserve Verdict = "Observe"
	// VerdictIgnore records the finding as ignored.
	VerdictIgnore Verdict = "Ignore"
)

// NodeHealthPhase is a node's place in the remediation state machine.
// +kubebuilder:validation:Enum=Healthy;Certifying;Quarantined;Draining;Recertifying;Maintenance;Failed
type NodeHealthPhase string

const (
	// PhaseHealthy means the node is in service.
	PhaseHealthy NodeHealthPhase = "Healthy"
	// PhaseCertifying means a new node is held out of service (tainted
	// gpuhealth.dev/uncertified, not cordoned) while its certification runs.
	PhaseCertifying NodeHealthPhase = "Certifying"
	// PhaseQuarantined means the node is cordoned and tainted and waits for a budget to drain.
	PhaseQuarantined NodeHealthPhase = "Quarantined"
	// PhaseDraining means workloads are being evicted and the node is leaving its ComputeDomain.
	PhaseDraining NodeHealthPhase = "Draining"
	// PhaseRecertifying means remediation and the recertification Job run on the empty node.
	PhaseRecertifying NodeHealthPhase = "Recertifying"
	// PhaseMaintenance means a human took the node out for planned
	// maintenance: it was cordoned and drained like a faulty node and is
	// held, drained, until a Recertify or Release request.
	PhaseMaintenance NodeHealthPhase = "Maintenance"
	// PhaseFailed means the node needs a human; it stays cordoned until one acts.
	PhaseFailed NodeHealthPhase = "Failed"
)

// UsesBudget says whether a node in this phase counts against the drain
// budgets (maxUnavailable and the per-domain and per-clique ones): it is
// Draining, Recertifying or in Maintenance (drained and out of service for
// as long as the maintenance lasts). ConsumesBudget adds Certifying where
// the policy says so.
func (p NodeHealthPhase) UsesBudget() bool {
	return p == PhaseDraining || p == PhaseRecertifying || p == PhaseMaintenance
}

// ConsumesBudget says whether a node in phase p counts against spec's
// budgets: UsesBudget, or Certifying under certification.countAgainstBudget.
func (spec *RemediationPolicySpec) ConsumesBudget(p NodeHealthPhase) bool {
	return p.UsesBudget() || p == PhaseCertifying && spec.Certification.CountAgainstBudget
}
