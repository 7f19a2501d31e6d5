package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// ParserType is how a suite step's output becomes a verdict.
// +kubebuilder:validation:Enum=exit-code;dcgm-diag;nccl-tests;ib-perftest
type ParserType string

const (
	// ParserExitCode passes a step whose Job succeeded (its container exited 0).
	ParserExitCode ParserType = "exit-code"
	// ParserDCGMDiag reads the JSON that `dcgmi diag -r <level> -j` prints
	// and passes when no test failed on any GPU.
	ParserDCGMDiag ParserType = "dcgm-diag"
	// ParserNCCLTests reads the report an nccl-tests binary (all_reduce_perf,
	// all_gather_perf, …) prints and passes when no result was wrong and the
	// bus bandwidth at the largest size reaches the threshold for the node's
	// GPU product.
	ParserNCCLTests ParserType = "nccl-tests"
	// ParserIBPerftest reads the report of perftest's bandwidth tools
	// (ib_write_bw, ib_read_bw, ib_send_bw) and passes when the tool printed
	// no error, the Job succeeded and the average bandwidth at the largest
	// message size reaches the threshold for the node's HCA model.
	ParserIBPerftest ParserType = "ib-perftest"
)

// ProductThreshold is the least bus bandwidth one GPU product must reach.
type ProductThreshold struct {
	// product is the GPU product as the node's product label has it, for
	// example NVIDIA-H100-80GB-HBM3.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=128
	Product string `json:"product"`

	// minBusBandwidthGBps is the least out-of-place bus bandwidth, in GB/s,
	// at the report's largest message size.
	// +required
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100000
	MinBusBandwidthGBps int32 `json:"minBusBandwidthGBps"`
}

// NCCLThresholds are the bus bandwidths an nccl-tests step must reach.
type NCCLThresholds struct {
	// productLabel is the node label naming the GPU product. Default
	// nvidia.com/gpu.product (set by NVIDIA's GPU feature discovery).
	// +optional
	// +kubebuilder:default="nvidia.com/gpu.product"
	// +kubebuilder:validation:MaxLength=316
	ProductLabel string `json:"productLabel,omitempty"`

	// products are the thresholds per GPU product.
	// +optional
	// +listType=map
	// +listMapKey=product
	// +kubebuilder:validation:MaxItems=64
	Products []ProductThreshold `json:"products,omitempty"`

	// defaultMinBusBandwidthGBps applies to products not listed. Unset: a
	// node whose product is not listed fails the step, saying so.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100000
	DefaultMinBusBandwidthGBps *int32 `json:"defaultMinBusBandwidthGBps,omitempty"`
}

// HCAModelThreshold is the least bandwidth one HCA model must reach.
type HCAModelThreshold struct {
	// model is the HCA model as the node's model label has it, for example
	// ConnectX-7. A label value, so at most 63 characters.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	Model string `json:"model"`

	// minBandwidthGbps is the least average bandwidth, in Gb/s (10^9 bits
	// per second, the unit link speeds are quoted in: 400 for NDR, 200 for
	// HDR), at the report's largest message size.
	// +required
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100000
	MinBandwidthGbps int32 `json:"minBandwidthGbps"`
}

// IBPerftestThresholds are the bandwidths an ib-perftest step must reach.
// +kubebuilder:validation:XValidation:rule="!has(self.models) || size(self.models) == 0 || has(self.modelLabel)",message="modelLabel is required when models are listed"
type IBPerftestThresholds struct {
	// modelLabel is the node label naming the HCA model. There is no
	// standard one: node-feature-discovery's PCI labels
	// (feature.node.kubernetes.io/pci-<class>_<vendor>.present) name a
	// device's class and vendor, not its model, and NVIDIA's GPU and
	// network operators label no HCA model. An administrator sets it, by
	// hand or with a NodeFeatureRule that matches the PCI device (vendor
	// 15b3, device 1021 for a ConnectX-7). So it has no default and is
	// required when models are listed; unset, with only
	// defaultMinBandwidthGbps, every node gets the default.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=316
	ModelLabel string `json:"modelLabel,omitempty"`

	// models are the thresholds per HCA model.
	// +optional
	// +listType=map
	// +listMapKey=model
	// +kubebuilder:validation:MaxItems=64
	Models []HCAModelThreshold `json:"models,omitempty"`

	// defaultMinBandwidthGbps, in Gb/s, applies to models not listed and to
	// nodes without the model label. Unset: such a node fails the step,
	// saying so.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100000
	DefaultMinBandwidthGbps *int32 `json:"defaultMinBandwidthGbps,omitempty"`
}

// ResultParser says how a step's output becomes a verdict.
// +kubebuilder:validation:XValidation:rule="self.type == 'nccl-tests' || !has(self.nccl)",message="nccl thresholds apply only to the nccl-tests parser"
// +kubebuilder:validation:XValidation:rule="self.type == 'ib-perftest' || !has(self.ibPerftest)",message="ibPerftest thresholds apply only to the ib-perftest parser"
type ResultParser struct {
	// type is exit-code, dcgm-diag, nccl-tests or ib-perftest. Default
	// exit-code.
	// +optional
	// +kubebuilder:default=exit-code
	Type ParserType `json:"type,omitempty"`

	// nccl are the nccl-tests parser's thresholds.
	// +optional
	NCCL *NCCLThresholds `json:"nccl,omitempty"`

	// ibPerftest are the ib-perftest parser's thresholds.
	// +optional
	IBPerftest *IBPerftestThresholds `json:"ibPerftest,omitempty"`
}

// SuiteStep is one step of a certification or recertification suite: a Job
// on the node and how its output is judged.
type SuiteStep struct {
	// name identifies the step in status, metrics and the Job's name.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=16
	// +kubebuilder:validation:XValidation:rule="self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')",message="step name must be lowercase letters, digits and '-', starting and ending with a letter or digit"
	Name string `json:"name"`

	// job is the Job to run on the node.
	// +required
	Job JobTemplate `json:"job"`

	// timeout is the Job's deadline; past it the step fails. Default 30m.
	// +optional
	// +kubebuilder:default="30m"
	// +kubebuilder:validation:XValidation:rule="self.matches('^([0-9]+([.][0-9]+)?(ns|us|µs|ms|s|m|h))+$') && duration(self) >= duration('1s') && duration(self) <= duration('8760h')",message="timeout must be a duration from 1s to 8760h (a year) such as 30s, 5m or 1h"
	Timeout *Duration `json:"timeout,omitempty"`

	// parser judges the step's output. Default exit-code.
	// +optional
	// +kubebuilder:default={type: exit-code}
	Parser ResultParser `json:"parser"`
}

// UncertifiedTaintKey is the taint (NoSchedule) that holds a node out of
// service until its certification passes. Nodes are not cordoned for it, so
// DaemonSets and the certification Jobs still run there.
const UncertifiedTaintKey = "gpuhealth.dev/uncertified"

// CertifyLabel on a Node asks for its certification: any value not yet
// certified (status.certificate.request) is one request.
const CertifyLabel = "gpuhealth.dev/certify"

// CertificationSpec is how a new node proves itself before it first takes work.
type CertificationSpec struct {
	// newNodes certifies nodes as they join the managed set: a node that
	// runs no workload pod when gpuhealth first manages it gets the
	// gpuhealth.dev/uncertified:NoSchedule taint until its suite passes. A
	// node that already runs workloads is recorded as not certified and is
	// certified by its next recertification. Default false.
	// +optional
	// +kubebuilder:default=false
	NewNodes bool `json:"newNodes"`

	// steps are the suite, run in order; the first failure fails the
	// attempt. Empty: a node to certify passes at once.
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=16
	Steps []SuiteStep `json:"steps,omitempty"`

	// maxAttempts is how many failed attempts send the node to Failed. Default 3.
	// +optional
	// +kubebuilder:default=3
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=20
	MaxAttempts int32 `json:"maxAttempts,omitempty"`

	// maxNotRun is how many times, in one attempt, a step's Job may end
	// without its pod ever running (not schedulable, its image not pulled,
	// its deadline reached first) before the node is Failed with
	// SuiteNotRun for a human. Such a try spends no attempt: nothing was
	// tested. Default 3.
	// +optional
	// +kubebuilder:default=3
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=20
	MaxNotRun int32 `json:"maxNotRun,omitempty"`

	// backoff is the wait after a failed attempt before the next. Default 5m.
	// +optional
	// +kubebuilder:default="5m"
	// +kubebuilder:validation:XValidation:rule="self == '0' || self.matches('^([0-9]+([.][0-9]+)?(ns|us|µs|ms|s|m|h))+$') && (duration(self) == duration('0s') || duration(self) >= duration('1s')) && duration(self) <= duration('8760h')",message="backoff must be 0 or a duration from 1s to 8760h (a year) such as 0s, 30s or 5m"
	Backoff *Duration `json:"backoff,omitempty"`

	// countAgainstBudget makes Certifying nodes count against
	// budgets.maxUnavailable (and the per-domain and per-clique budgets).
	// Default false: a new node was never in service, so certifying it takes
	// nothing away.
	// +optional
	// +kubebuilder:default=false
	CountAgainstBudget bool `json:"countAgainstBudget"`
}

// CliqueCertificationSpec is the multi-node test an NVLink clique passes
// before the fabric-degraded taint is lifted after a fabric fault resolved.
type CliqueCertificationSpec struct {
	// job is the template of each pod of an Indexed Job with one pod per
	// taking-part node of those this policy manages (placed by required
	// node affinity and pod anti-affinity, tolerating gpuhealth's taints).
	// Completion index 0's output is judged. A ComputeDomain channel
	// claim, when the test needs one, is the template's (through its
	// labels and the user's ResourceClaimTemplate).
	// +required
	Job JobTemplate `json:"job"`

	// parser judges index 0's output. Default nccl-tests.
	// +optional
	// +kubebuilder:default={type: nccl-tests}
	Parser ResultParser `json:"parser"`

	// nodes is how many of the clique's healthy nodes take part: a count or
	// a percentage of them, rounded up. Default 100%.
	// +optional
	// +kubebuilder:default="100%"
	// +kubebuilder:validation:XIntOrString
	// +kubebuilder:validation:XValidation:rule="type(self) == int ? self >= 1 : self.matches('^(100|[1-9][0-9]?)%$')",message="nodes must be a positive count (2) or a percentage from 1% to 100% (\"50%\")"
	Nodes *intstr.IntOrString `json:"nodes,omitempty"`

	// timeout is the Job's deadline. Default 30m.
	// +optional
	// +kubebuilder:default="30m"
	// +kubebuilder:validation:XValidation:rule="self.matches('^([0-9]+([.][0-9]+)?(ns|us|µs|ms|s|m|h))+$') && duration(self) >= duration('1s') && duration(self) <= duration('8760h')",message="timeout must be a duration from 1s to 8760h (a year) such as 30s, 5m or 1h"
	Timeout *Duration `json:"timeout,omitempty"`

	// maxAttempts is how many attempts run before the taint stays for a
	// human (who deletes the clique's Jobs to start over). Default 3.
	// +optional
	// +kubebuilder:default=3
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=20
	MaxAttempts int32 `json:"maxAttempts,omitempty"`

	// backoff is the wait after a failed attempt before the next. Default 5m.
	// +optional
	// +kubebuilder:default="5m"
	// +kubebuilder:validation:XValidation:rule="self == '0' || self.matches('^([0-9]+([.][0-9]+)?(ns|us|µs|ms|s|m|h))+$') && (duration(self) == duration('0s') || duration(self) >= duration('1s')) && duration(self) <= duration('8760h')",message="backoff must be 0 or a duration from 1s to 8760h (a year) such as 0s, 30s or 5m"
	Backoff *Duration `json:"backoff,omitempty"`
}

// Measurement is one value a step measured.
type Measurement struct {
	// name is what was measured, for example busBandwidth.
	// +required
	// +kubebuilder:validation:MaxLength=64
	Name string `json:"name"`

	// value is the measured value as a decimal number.
	// +required
	// +kubebuilder:validation:MaxLength=32
	Value string `json:"value"`

	// unit is the value's unit, for example GB/s.
	// +optional
	// +kubebuilder:validation:MaxLength=16
	Unit string `json:"unit,omitempty"`
}

// StepResult is the outcome of one suite step.
type StepResult struct {
	// name is the step's name.
	// +required
	// +kubebuilder:validation:MaxLength=16
	Name string `json:"name"`

	// parser is how the step's output was judged.
	// +optional
	Parser ParserType `json:"parser,omitempty"`

	// job is the step's Job (in the operator's namespace).
	// +optional
	// +kubebuilder:validation:MaxLength=63
	Job string `json:"job,omitempty"`

	// result is Pending, Running, Succeeded (passed), Failed (the test ran
	// and said no) or NotRun (its Job never ran in maxNotRun tries).
	// +required
	Result JobResult `json:"result"`

	// runningAt is when the step's pod was first seen running (the Job's
	// ready count). A Job that reaches its deadline before that never ran:
	// the try is NotRun, not Failed.
	// +optional
	RunningAt *metav1.Time `json:"runningAt,omitempty"`

	// notRun counts the step's tries whose Job ended without running; the
	// current try's Job name writes its attempt <attempt>t<notRun> when it
	// is not 0.
	// +optional
	// +kubebuilder:validation:Minimum=0
	NotRun int32 `json:"notRun,omitempty"`

	// startedAt is when the step's Job was created.
	// +optional
	StartedAt *metav1.Time `json:"startedAt,omitempty"`

	// completedAt is when the step's verdict was reached.
	// +optional
	CompletedAt *metav1.Time `json:"completedAt,omitempty"`

	// duration is completedAt minus startedAt.
	// +optional
	Duration *metav1.Duration `json:"duration,omitempty"`

	// message explains the verdict, for example the failing DCGM test or the
	// bandwidth against its threshold.
	// +optional
	// +kubebuilder:validation:MaxLength=512
	Message string `json:"message,omitempty"`

	// measurements are the values the step measured.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=16
	Measurements []Measurement `json:"measurements,omitempty"`
}

// Suite names which suite a certificate or step ran in.
// +kubebuilder:validation:Enum=Certification;Recertification
type Suite string

const (
	// SuiteCertification is the new-node suite (policy certification.steps).
	SuiteCertification Suite = "Certification"
	// SuiteRecertification is the suite after a fault (policy recertification.steps).
	SuiteRecertification Suite = "Recertification"
)

// Certificate records the last suite a node passed.
type Certificate struct {
	// time is when the suite passed.
	// +required
	Time metav1.Time `json:"time"`

	// suite is Certification or Recertification.
	// +required
	Suite Suite `json:"suite"`

	// attempt is the attempt that passed.
	// +optional
	// +kubebuilder:validation:Minimum=0
	Attempt int32 `json:"attempt,omitempty"`

	// request is the gpuhealth.dev/certify label value this certification
	// answered, when a human asked for it.
	// +optional
	// +kubebuilder:validation:MaxLength=63
	Request string `json:"request,omitempty"`

	// steps are the results of the suite's steps.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=16
	Steps []StepResult `json:"steps,omitempty"`
}
