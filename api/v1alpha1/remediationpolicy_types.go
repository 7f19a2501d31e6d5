package v1alpha1

import (
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// Duration is a length of time written as a Go duration ("30s", "5m",
// "1h30m"). Each duration field carries a CEL rule that rejects a malformed or
// negative value at admission with a message naming the field; the length
// bound keeps those rules cheap for the apiserver's CEL cost budget.
// +kubebuilder:validation:MaxLength=32
type Duration string

// Get returns the duration, or def when d is nil or empty. The schema rejects
// strings time.ParseDuration refuses; should one get through anyway (an
// object stored before a rule existed), Get returns def too.
func (d *Duration) Get(def time.Duration) time.Duration {
	if d == nil || *d == "" {
		return def
	}
	v, err := time.ParseDuration(string(*d))
	if err != nil {
		return def
	}
	return v
}

// RuleMatch selects findings. Every list that is set must contain the
// finding's value; an empty match selects every finding.
type RuleMatch struct {
	// sources selects findings from these sources.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=8
	Sources []Source `json:"sources,omitempty"`

	// checks selects findings of these checks.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=16
	Checks []Check `json:"checks,omitempty"`

	// codes selects findings with these codes (for XIDs, the XID numbers as strings).
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=256
	// +kubebuilder:validation:items:MaxLength=128
	// +kubebuilder:validation:items:Pattern=`^[A-Za-z0-9][A-Za-z0-9_.:-]*$`
	Codes []string `json:"codes,omitempty"`

	// severities selects findings of these severities.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=3
	Severities []Severity `json:"severities,omitempty"`
}

// Debounce requires a finding to repeat before its verdict applies.
type Debounce struct {
	// count is how many occurrences are needed within window.
	// +required
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100000
	Count int32 `json:"count"`

	// window is the sliding time window in which count occurrences must fall.
	// +required
	// +kubebuilder:validation:XValidation:rule="self.matches('^([0-9]+([.][0-9]+)?(ns|us|µs|ms|s|m|h))+$') && duration(self) >= duration('1s') && duration(self) <= duration('8760h')",message="window must be a duration from 1s to 8760h (a year) such as 30s, 5m or 24h"
	Window Duration `json:"window"`
}

// Recovery is the hysteresis applied when a finding clears.
type Recovery struct {
	// clearAfter is how long a finding must stay resolved before it stops
	// counting against the node, so a flapping link does not bounce the node
	// in and out of service.
	// +required
	// +kubebuilder:validation:XValidation:rule="self == '0' || self.matches('^([0-9]+([.][0-9]+)?(ns|us|µs|ms|s|m|h))+$') && (duration(self) == duration('0s') || duration(self) >= duration('1s')) && duration(self) <= duration('8760h')",message="clearAfter must be 0 or a duration from 1s to 8760h (a year) such as 0s, 5m or 1h"
	ClearAfter Duration `json:"clearAfter"`
}

// Rule judges the findings it matches. Rules are evaluated in order; the
// first match wins. Findings that no rule matches are judged by the built-in
// XID table and the finding's own severity.
type Rule struct {
	// name identifies the rule in events' classification and in metrics.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:XValidation:rule="self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')",message="rule name must be lowercase letters, digits and '-', starting and ending with a letter or digit"
	Name string `json:"name"`

	// match selects the findings this rule judges.
	// +required
	Match RuleMatch `json:"match"`

	// verdict is what happens to a matching finding: Quarantine, Observe or Ignore.
	// +required
	Verdict Verdict `json:"verdict"`

	// action overrides the finding's recommended action (for example Recertify
	// for XIDs that only need a check, or ReplaceNode).
	// +optional
	Action Action `json:"action,omitempty"`

	// debounce requires the finding to repeat before the verdict applies.
	// Unset: the first occurrence counts.
	// +optional
	Debounce *Debounce `json:"debounce,omitempty"`

	// recovery is the hysteresis when the finding clears. Unset: a resolved
	// finding stops counting at once.
	// +optional
	Recovery *Recovery `json:"recovery,omitempty"`

	// scope is what a quarantine by this rule takes out of service: Node
	// (default) or Device, only the GPU the finding names (policy
	// devices). A finding that cannot be handled on its GPU alone (an
	// action that needs the node, a component that is not a GPU, a GPU no
	// DRA driver publishes, one GPU more than devices.maxDevicesPerNode)
	// takes the node out, saying why.
	// +optional
	Scope RuleScope `json:"scope,omitempty"`
}

// TaintSpec is a taint gpuhealth puts on a node.
type TaintSpec struct {
	// key is the taint key.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=316
	// +kubebuilder:validation:XValidation:rule="self.matches('^([a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$')",message="taint key must be a qualified name such as gpuhealth.dev/quarantined"
	Key string `json:"key"`

	// value is the taint value.
	// +optional
	// +kubebuilder:validation:MaxLength=63
	Value string `json:"value,omitempty"`

	// effect is the taint effect: NoSchedule, PreferNoSchedule or NoExecute.
	// +required
	// +kubebuilder:validation:Enum=NoSchedule;PreferNoSchedule;NoExecute
	Effect corev1.TaintEffect `json:"effect"`
}

// QuarantineSpec is what quarantine does to a node.
type QuarantineSpec struct {
	// cordon marks the node unschedulable. Default true.
	// +optional
	// +kubebuilder:default=true
	Cordon *bool `json:"cordon,omitempty"`

	// taint is added to the node while it is out of service.
	// Default gpuhealth.dev/quarantined:NoSchedule.
	// +optional
	// +kubebuilder:default={key: "gpuhealth.dev/quarantined", effect: "NoSchedule"}
	Taint *TaintSpec `json:"taint,omitempty"`

	// phaseLabel mirrors the node's phase in the node label
	// gpuhealth.dev/phase. Default true.
	// +optional
	// +kubebuilder:default=true
	PhaseLabel *bool `json:"phaseLabel,omitempty"`
}

// DrainMode is how the pods of a namespace leave a draining node.
// +kubebuilder:validation:Enum=Evict;WaitForCompletion;DeleteAfterTimeout
type DrainMode string

const (
	// DrainEvict evicts pods through the Eviction API, honouring PodDisruptionBudgets.
	DrainEvict DrainMode = "Evict"
	// DrainWaitForCompletion leaves pods alone until they finish by themselves.
	DrainWaitForCompletion DrainMode = "WaitForCompletion"
	// DrainDeleteAfterTimeout evicts pods and deletes those still there after the timeout.
	DrainDeleteAfterTimeout DrainMode = "DeleteAfterTimeout"
)

// DrainTimeoutAction is what becomes of an Evict or WaitForCompletion pod
// still on a draining node once its drain timeout has passed.
// +kubebuilder:validation:Enum=Wait;Delete
type DrainTimeoutAction string

const (
	// DrainTimeoutWait leaves the pod on the node and reports it as timed out;
	// an Evict pod's eviction is still retried.
	DrainTimeoutWait DrainTimeoutAction = "Wait"
	// DrainTimeoutDelete deletes the pod, bypassing PodDisruptionBudgets, as
	// DeleteAfterTimeout does.
	DrainTimeoutDelete DrainTimeoutAction = "Delete"
)

// GangDrain is how the members of a gang (the pods of one multi-node job,
// as its workload kind marks them) leave when one of them is on a
// draining node.
// +kubebuilder:validation:Enum=Pods;Gang
type GangDrain string

const (
	// GangDrainPods drains pod by pod: only the members on the draining
	// node leave; the rest wait for their job's own failure handling.
	GangDrainPods GangDrain = "Pods"
	// GangDrainGang evicts every member of the gang, on every node, in one
	// wave, so every rank gets SIGTERM at the same moment and the job's
	// controller restarts it at once instead of after a collective timeout.
	GangDrainGang GangDrain = "Gang"
)

// KueueGangs is who stops a Kueue-managed gang when one of its members is
// on a draining node.
// +kubebuilder:validation:Enum=Gang;Kueue
type KueueGangs string

const (
	// KueueGangsGang stops it as drain.gangs says for any gang: under Gang,
	// one wave of evictions; Kueue keeps the workload admitted and its job
	// controller recreates the pods.
	KueueGangsGang KueueGangs = "Gang"
	// KueueGangsKueue leaves it to Kueue: only the members on the draining
	// node leave, and Kueue reacts as it is configured to (a topology-
	// assigned workload's node replacement on the quarantine taint,
	// waitForPodsReady's recovery timeout).
	KueueGangsKueue KueueGangs = "Kueue"
)

// NamespaceDrain sets the drain mode for some namespaces.
// +kubebuilder:validation:XValidation:rule="has(self.namespace) != has(self.namespaceSelector)",message="set exactly one of namespace and namespaceSelector"
type NamespaceDrain struct {
	// namespace is one namespace this entry applies to.
	// +optional
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:XValidation:rule="self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')",message="namespace must be a valid namespace name (lowercase letters, digits and '-')"
	Namespace string `json:"namespace,omitempty"`

	// namespaceSelector selects the namespaces this entry applies to by label.
	// A selector that does not parse (an operator other than In, NotIn,
	// Exists and DoesNotExist, say) makes the policy Ready=False with
	// reason InvalidSelector.
	// +optional
	NamespaceSelector *metav1.LabelSelector `json:"namespaceSelector,omitempty"`

	// mode is how pods in these namespaces leave the node.
	// +required
	Mode DrainMode `json:"mode"`

	// timeout overrides the drain timeout (drain.timeout) for these
	// namespaces, whatever their mode: once it has passed since the drain
	// began, DeleteAfterTimeout deletes the pods still there, and Evict and
	// WaitForCompletion pods still there get drain.onTimeout.
	// +optional
	// +kubebuilder:validation:XValidation:rule="self.matches('^([0-9]+([.][0-9]+)?(ns|us|µs|ms|s|m|h))+$') && duration(self) >= duration('1s') && duration(self) <= duration('8760h')",message="timeout must be a duration from 1s to 8760h (a year) such as 30s, 5m or 1h"
	Timeout *Duration `json:"timeout,omitempty"`

	// gangs overrides drain.gangs for these namespaces.
	// +optional
	Gangs GangDrain `json:"gangs,omitempty"`
}

// DrainSpec is how a quarantined node is emptied.
type DrainSpec struct {
	// defaultMode applies to namespaces no entry of namespaces matches. Default Evict.
	// +optional
	// +kubebuilder:default=Evict
	DefaultMode DrainMode `json:"defaultMode,omitempty"`

	// namespaces sets the drain mode per namespace; the first matching entry wins.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=64
	Namespaces []NamespaceDrain `json:"namespaces,omitempty"`

	// skipNamespaces are namespaces whose pods are never removed. DaemonSet
	// and mirror (static) pods are never removed in any namespace.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=63
	SkipNamespaces []string `json:"skipNamespaces,omitempty"`

	// timeout is how long a drain may take, counted from its start, in every
	// mode; an entry of namespaces can override it. Once it has passed,
	// DeleteAfterTimeout deletes the pods still there, and Evict pods (a
	// PodDisruptionBudget refusing their eviction, or any other reason) and
	// WaitForCompletion pods still there get onTimeout. Pods already
	// terminating are left to finish. Default 1h.
	// +optional
	// +kubebuilder:default="1h"
	// +kubebuilder:validation:XValidation:rule="self.matches('^([0-9]+([.][0-9]+)?(ns|us|µs|ms|s|m|h))+$') && duration(self) >= duration('1s') && duration(self) <= duration('8760h')",message="timeout must be a duration from 1s to 8760h (a year) such as 30s, 5m or 1h"
	Timeout *Duration `json:"timeout,omitempty"`

	// onTimeout is what becomes of Evict and WaitForCompletion pods still on
	// the node past their drain timeout: Wait leaves them there (evictions
	// are still retried) and reports them as timed out; Delete deletes them,
	// bypassing PodDisruptionBudgets, as DeleteAfterTimeout does.
	// DeleteAfterTimeout namespaces delete either way. Default Wait.
	// +optional
	// +kubebuilder:default=Wait
	OnTimeout DrainTimeoutAction `json:"onTimeout,omitempty"`

	// evictionsPerSecond limits eviction requests across all draining nodes. Default 20.
	// +optional
	// +kubebuilder:default=20
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1000
	EvictionsPerSecond int32 `json:"evictionsPerSecond,omitempty"`

	// maxConcurrentEvictions limits eviction requests in flight across all
	// draining nodes. Default 16.
	// +optional
	// +kubebuilder:default=16
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1000
	MaxConcurrentEvictions int32 `json:"maxConcurrentEvictions,omitempty"`

	// gangs is how the members of a gang leave when one of them runs on a
	// draining node: Pods (the default) evicts only the node's pods; Gang
	// evicts every member on every node in one wave, through the Eviction
	// API. A wave waits while any member's PodDisruptionBudget allows no
	// disruption (the whole gang stays, the member is reported), until the
	// drain timeout; then the members the budgets allow go, and onTimeout
	// applies to the node's own pods as ever. Members on other nodes leave
	// their nodes in service and spend no budget. Only Evict and
	// DeleteAfterTimeout namespaces have waves; an entry of namespaces can
	// override it.
	// +optional
	// +kubebuilder:default=Pods
	Gangs GangDrain `json:"gangs,omitempty"`

	// gangLabelKeys are label keys that name a gang beyond the kinds
	// gpuhealth knows (the core PodGroup, JobSet, LeaderWorkerSet, Kubeflow,
	// Volcano, KAI, coscheduling, Ray, Kueue): pods of one namespace with
	// the same value of one of these keys are one gang.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=8
	// +kubebuilder:validation:items:MaxLength=317
	// +kubebuilder:validation:items:XValidation:rule="self.matches('^([a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$')",message="each gang label key must be a label key such as example.com/gang"
	GangLabelKeys []string `json:"gangLabelKeys,omitempty"`

	// gangGracePeriod is the least grace period a gang wave gives each
	// member it evicts, for a checkpoint all ranks write together on
	// SIGTERM: a member whose own terminationGracePeriodSeconds is shorter
	// is evicted with this one instead (the eviction's
	// DeleteOptions.gracePeriodSeconds, which the kubelet honours). It
	// never shortens a pod's own. Unset: each pod's own.
	// +optional
	// +kubebuilder:validation:XValidation:rule="self.matches('^([0-9]+([.][0-9]+)?(ns|us|µs|ms|s|m|h))+$') && duration(self) >= duration('1s') && duration(self) <= duration('24h')",message="gangGracePeriod must be a duration from 1s to 24h such as 5m"
	GangGracePeriod *Duration `json:"gangGracePeriod,omitempty"`

	// kueue is who stops a gang Kueue manages (its pods carry Kueue's
	// labels) when drain.gangs is Gang: Gang (the default) stops it with a
	// wave like any gang; Kueue leaves it to Kueue, draining only the
	// node's own members.
	// +optional
	// +kubebuilder:default=Gang
	Kueue KueueGangs `json:"kueue,omitempty"`
}

// JobTemplate is a Job gpuhealth runs on a node (recertification, GPU reset,
// node reboot). The operator pins the pod to the node, makes it tolerate the
// quarantine taint and gpuhealth's other taints, and sets the deadline; the
// rest comes from here, within the install's Job rules (chart values jobs:
// allowed images, service accounts and privileged steps, and no valueFrom),
// which admission enforces and without which the operator does not act on
// the policy.
type JobTemplate struct {
	// image is the container image; it must start with one of the
	// install's allowed prefixes (chart value jobs.allowedImagePrefixes).
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=512
	Image string `json:"image"`

	// imagePullPolicy is the container's image pull policy.
	// +optional
	// +kubebuilder:validation:Enum=Always;IfNotPresent;Never
	ImagePullPolicy corev1.PullPolicy `json:"imagePullPolicy,omitempty"`

	// command is the container's entrypoint.
	// +optional
	// +listType=atomic
	Command []string `json:"command,omitempty"`

	// args are the container's arguments.
	// +optional
	// +listType=atomic
	Args []string `json:"args,omitempty"`

	// env are the container's environment variables, literal values only:
	// valueFrom is refused (it would read the operator's namespace).
	// +optional
	// +listType=map
	// +listMapKey=name
	Env []corev1.EnvVar `json:"env,omitempty"`

	// resources are the container's resource requests and limits, for
	// example nvidia.com/gpu: 8 so the test sees every GPU.
	// +optional
	Resources *corev1.ResourceRequirements `json:"resources,omitempty"`

	// serviceAccountName is the pod's service account, one the install
	// allows (chart value jobs.allowedServiceAccounts), whose token is
	// mounted. Unset: gpuhealth-job, which has no RBAC and no token.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	ServiceAccountName string `json:"serviceAccountName,omitempty"`

	// priorityClassName is the pod's priority class.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	PriorityClassName string `json:"priorityClassName,omitempty"`

	// privileged runs the container privileged (needed for GPU reset and
	// reboot); allowed only in the steps the install names (chart value
	// jobs.privilegedSteps, default reset and reboot).
	// +optional
	Privileged bool `json:"privileged,omitempty"`

	// hostPID runs the pod in the host's PID namespace (needed for reboot
	// through nsenter); allowed only where privileged is.
	// +optional
	HostPID bool `json:"hostPID,omitempty"`

	// labels are added to the pod.
	// +optional
	Labels map[string]string `json:"labels,omitempty"`

	// annotations are added to the pod.
	// +optional
	Annotations map[string]string `json:"annotations,omitempty"`
}

// RecertificationSpec is how a drained node proves it is fit again.
// +kubebuilder:validation:XValidation:rule="!(has(self.job) && has(self.steps))",message="set job (one exit-code step) or steps, not both"
type RecertificationSpec struct {
	// steps are the recertification suite, run in order after the reset or
	// reboot step; the first failure fails the attempt. Each step's output
	// is judged by its parser (exit-code, dcgm-diag, nccl-tests or ib-perftest).
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=16
	Steps []SuiteStep `json:"steps,omitempty"`

	// job is a one-step suite judged by its exit code, the form before
	// steps existed. Unset with no steps: a node returns after the soak
	// window once all its findings are resolved, without a test.
	// +optional
	Job *JobTemplate `json:"job,omitempty"`

	// timeout is job's deadline; past it the attempt fails. Default 30m.
	// +optional
	// +kubebuilder:default="30m"
	// +kubebuilder:validation:XValidation:rule="self.matches('^([0-9]+([.][0-9]+)?(ns|us|µs|ms|s|m|h))+$') && duration(self) >= duration('1s') && duration(self) <= duration('8760h')",message="timeout must be a duration from 1s to 8760h (a year) such as 30s, 5m or 1h"
	Timeout *Duration `json:"timeout,omitempty"`

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

	// soakWindow is how long after a successful Job the node must see no new
	// quarantining finding before it returns to service. Default 10m.
	// +optional
	// +kubebuilder:default="10m"
	// +kubebuilder:validation:XValidation:rule="self == '0' || self.matches('^([0-9]+([.][0-9]+)?(ns|us|µs|ms|s|m|h))+$') && (duration(self) == duration('0s') || duration(self) >= duration('1s')) && duration(self) <= duration('8760h')",message="soakWindow must be 0 or a duration from 1s to 8760h (a year) such as 0s, 30s or 10m"
	SoakWindow *Duration `json:"soakWindow,omitempty"`

	// requireFabricHealthy keeps the node out until its fabric and IMEX
	// findings are resolved too. Default true.
	// +optional
	// +kubebuilder:default=true
	RequireFabricHealthy *bool `json:"requireFabricHealthy,omitempty"`
}

// RemediationStep is a Job run before recertification for findings that
// recommend it.
type RemediationStep struct {
	// job is the Job to run on the node.
	// +required
	Job JobTemplate `json:"job"`

	// timeout is the Job's deadline. Default 30m.
	// +optional
	// +kubebuilder:default="30m"
	// +kubebuilder:validation:XValidation:rule="self.matches('^([0-9]+([.][0-9]+)?(ns|us|µs|ms|s|m|h))+$') && duration(self) >= duration('1s') && duration(self) <= duration('8760h')",message="timeout must be a duration from 1s to 8760h (a year) such as 30s, 5m or 1h"
	Timeout *Duration `json:"timeout,omitempty"`
}

// DiagnosticsStep collects what a node knows about its GPUs before a reset
// or reboot wipes it, for the hardware vendor: a Job on the node whose log
// is the evidence, kept for retain after it finished.
type DiagnosticsStep struct {
	// job is the Job to run on the node; its log is what is kept. The
	// documented default runs `nvidia-smi -q -x` and the kernel's log
	// (dmesg, which needs privileged) and cuts what it prints to 8 MiB.
	// +required
	Job JobTemplate `json:"job"`

	// timeout is the Job's deadline: the reset or reboot waits for it at
	// most this long, and goes ahead whatever the diagnostics' outcome.
	// Default 10m.
	// +optional
	// +kubebuilder:default="10m"
	// +kubebuilder:validation:XValidation:rule="self.matches('^([0-9]+([.][0-9]+)?(ns|us|µs|ms|s|m|h))+$') && duration(self) >= duration('1s') && duration(self) <= duration('8760h')",message="timeout must be a duration from 1s to 8760h (a year) such as 30s, 5m or 1h"
	Timeout *Duration `json:"timeout,omitempty"`

	// retain is how long the finished Job and its pod (with its log) are
	// kept: the Job's ttlSecondsAfterFinished. Default 168h (a week); at
	// most 720h.
	// +optional
	// +kubebuilder:default="168h"
	// +kubebuilder:validation:XValidation:rule="self.matches('^([0-9]+([.][0-9]+)?(ns|us|µs|ms|s|m|h))+$') && duration(self) >= duration('1m') && duration(self) <= duration('720h')",message="retain must be a duration from 1m to 720h (30 days) such as 24h or 168h"
	Retain *Duration `json:"retain,omitempty"`
}

// RemediationSpec lists the optional steps run before recertification.
type RemediationSpec struct {
	// diagnostics runs once per attempt before its reset or reboot step
	// (before that step's approval is asked for): the evidence of what the
	// node knew before it was wiped. Unset: no diagnostics.
	// +optional
	Diagnostics *DiagnosticsStep `json:"diagnostics,omitempty"`

	// resetGPU runs for findings whose action is ResetGPU. Unset: such
	// findings go straight to recertification.
	// +optional
	ResetGPU *RemediationStep `json:"resetGPU,omitempty"`

	// rebootNode runs for findings whose action is RebootNode. Unset: such
	// findings go straight to recertification.
	// +optional
	RebootNode *RemediationStep `json:"rebootNode,omitempty"`

	// handOff hands a node that ends Failed because it must be replaced
	// (a finding recommends ReplaceNode, or its recertification attempts
	// are exhausted) to the system that replaces nodes. Unset: the node
	// waits in Failed for a human.
	// +optional
	HandOff *HandOffSpec `json:"handOff,omitempty"`
}

// HandOffType is how a failed node is handed off.
// +kubebuilder:validation:Enum=ClusterAPI;Template;Condition
type HandOffType string

const (
	// HandOffClusterAPI annotates the node's Cluster API Machine (found
	// through the node's cluster.x-k8s.io/machine and
	// cluster.x-k8s.io/cluster-namespace annotations, and only when the
	// Machine's status.nodeRef names the node) with
	// cluster.x-k8s.io/remediate-machine, which a MachineHealthCheck
	// treats as unhealthy, so the Machine's owner replaces it.
	HandOffClusterAPI HandOffType = "ClusterAPI"
	// HandOffTemplate creates an object from spec.template (for example a
	// provider's repair request), owned by the NodeHealth.
	HandOffTemplate HandOffType = "Template"
	// HandOffCondition relies on the node condition GPUHealthy=False, for
	// tools that act on node conditions (for example Karpenter's node
	// repair); its lastTransitionTime does not move while the node stays
	// unhealthy.
	HandOffCondition HandOffType = "Condition"
)

// HandOffSpec is how a node that must be replaced is handed off.
// +kubebuilder:validation:XValidation:rule="(self.type == 'Template') == has(self.template)",message="template is required for type Template and allowed only there"
// +kubebuilder:validation:XValidation:rule="!has(self.template) || (self.template.apiVersion.contains('/') && !['batch/', 'apps/', 'rbac.authorization.k8s.io/', 'gpuhealth.dev/'].exists(g, self.template.apiVersion.startsWith(g)))",message="a hand-off template may not create objects of the core, batch, apps, rbac.authorization.k8s.io or gpuhealth.dev API groups"
type HandOffSpec struct {
	// type is ClusterAPI, Template or Condition.
	// +required
	Type HandOffType `json:"type"`

	// template is the object to create for type Template, with apiVersion,
	// kind and metadata.name: a kind the install allows (chart value
	// operator.handOff.rules, which also grants the RBAC to get, create and
	// delete it), never one of the core, batch, apps,
	// rbac.authorization.k8s.io or gpuhealth.dev groups, nor in the
	// operator's namespace. In every string value the placeholders
	// {{.NodeName}}, {{.Reason}} (ReplaceNode, RecertificationExhausted or
	// CertificationExhausted) and {{.Message}} are replaced literally (no
	// template engine runs; any other {{ is refused), up to 64 KiB in all.
	// The object is created once per failure, owned by the NodeHealth, so
	// it is deleted with it; its status is shown in the NodeHealth's
	// status.handOff.
	// +optional
	// +kubebuilder:pruning:PreserveUnknownFields
	// +kubebuilder:validation:EmbeddedResource
	Template *runtime.RawExtension `json:"template,omitempty"`
}

// BudgetsSpec limits how many nodes are out of service at once. Each value is
// a count ("2") or a percentage ("10%") of the managed nodes in scope, rounded
// up like a PodDisruptionBudget's maxUnavailable. Budgets gate draining and
// recertification; fatal faults always cordon.
type BudgetsSpec struct {
	// maxUnavailable limits nodes draining or recertifying across all managed nodes. Default 10%.
	// +optional
	// +kubebuilder:default="10%"
	// +kubebuilder:validation:XIntOrString
	// +kubebuilder:validation:XValidation:rule="type(self) == int ? self >= 0 : self.matches('^(100|[1-9]?[0-9])%$')",message="maxUnavailable must be a non-negative count (2) or a percentage from 0% to 100% (\"10%\")"
	MaxUnavailable *intstr.IntOrString `json:"maxUnavailable,omitempty"`

	// maxUnavailablePerComputeDomain limits the members of one ComputeDomain
	// that drain or recertify at once; a percentage is of the domain's
	// members (including those out of service). Default 1.
	// +optional
	// +kubebuilder:default=1
	// +kubebuilder:validation:XIntOrString
	// +kubebuilder:validation:XValidation:rule="type(self) == int ? self >= 0 : self.matches('^(100|[1-9]?[0-9])%$')",message="maxUnavailablePerComputeDomain must be a non-negative count (1) or a percentage from 0% to 100% (\"25%\")"
	MaxUnavailablePerComputeDomain *intstr.IntOrString `json:"maxUnavailablePerComputeDomain,omitempty"`

	// maxUnavailablePerClique limits the nodes of one NVLink clique (node
	// label nvidia.com/gpu.clique, an NVL72 rack) that drain or recertify at
	// once; a percentage is of the clique's managed nodes. Default 1.
	// +optional
	// +kubebuilder:default=1
	// +kubebuilder:validation:XIntOrString
	// +kubebuilder:validation:XValidation:rule="type(self) == int ? self >= 0 : self.matches('^(100|[1-9]?[0-9])%$')",message="maxUnavailablePerClique must be a non-negative count (1) or a percentage from 0% to 100% (\"25%\")"
	MaxUnavailablePerClique *intstr.IntOrString `json:"maxUnavailablePerClique,omitempty"`

	// maxUnavailableDevices limits the GPUs out of service alone (rules
	// of scope Device) across the managed nodes at once; a percentage is
	// of their GPUs, counted as 8 per node. Default 5%.
	// +optional
	// +kubebuilder:default="5%"
	// +kubebuilder:validation:XIntOrString
	// +kubebuilder:validation:XValidation:rule="type(self) == int ? self >= 0 : self.matches('^(100|[1-9]?[0-9])%$')",message="maxUnavailableDevices must be a non-negative count (4) or a percentage from 0% to 100% (\"5%\")"
	MaxUnavailableDevices *intstr.IntOrString `json:"maxUnavailableDevices,omitempty"`
}

// ComputeDomainSpec is how gpuhealth keeps NVIDIA ComputeDomains (multi-node
// NVLink jobs) consistent while it takes their members out of service.
// Without the ComputeDomain CRDs in the cluster only the node labels count.
type ComputeDomainSpec struct {
	// leaveTimeout is how long a drained member may take to leave its
	// ComputeDomain (node label, daemon pod and clique entry gone) before
	// the NodeHealth gets the condition ComputeDomainLeaveStuck and a
	// Warning Event. The node stays in Draining either way. Default 10m.
	// +optional
	// +kubebuilder:default="10m"
	// +kubebuilder:validation:XValidation:rule="self.matches('^([0-9]+([.][0-9]+)?(ns|us|µs|ms|s|m|h))+$') && duration(self) >= duration('1s') && duration(self) <= duration('8760h')",message="leaveTimeout must be a duration from 1s to 8760h (a year) such as 30s, 5m or 1h"
	LeaveTimeout *Duration `json:"leaveTimeout,omitempty"`

	// deadMemberGracePeriod is how long a fenced member must have been
	// NotReady (by its Ready condition's last transition) before its stale
	// ComputeDomain daemon pod is deleted so that the surviving members
	// drop it. Default 5m.
	// +optional
	// +kubebuilder:default="5m"
	// +kubebuilder:validation:XValidation:rule="self == '0' || self.matches('^([0-9]+([.][0-9]+)?(ns|us|µs|ms|s|m|h))+$') && (duration(self) == duration('0s') || duration(self) >= duration('1s')) && duration(self) <= duration('8760h')",message="deadMemberGracePeriod must be 0 or a duration from 1s to 8760h (a year) such as 0s, 5m or 1h"
	DeadMemberGracePeriod *Duration `json:"deadMemberGracePeriod,omitempty"`

	// notReadyIsDead lets a fenced member that is NotReady past the grace
	// period count as dead without the node.kubernetes.io/out-of-service
	// taint. Leave it false unless a NotReady node here is known to be
	// powered off: a partitioned node that still runs its IMEX daemon would
	// otherwise lose its peers. Default false.
	// +optional
	// +kubebuilder:default=false
	NotReadyIsDead bool `json:"notReadyIsDead"`

	// releaseDeadMemberLabel lets gpuhealth remove the
	// resource.nvidia.com/computeDomain label from a dead member (fenced and
	// dead by the rules above). On NVIDIA's driver v25.12 and later deleting
	// the dead node's daemon pod is not enough: the DaemonSet re-creates it
	// on the node at once, and the driver keeps the node's clique entry while
	// a pod object is bound there, so the peers hold a dead member. Without
	// the label no daemon pod can be bound there and the driver drops the
	// entry. The driver owns that label (its kubelet plugin sets it when a
	// workload's channel is prepared): removing it is a write to another
	// component's state, and a node that comes back keeps no domain label
	// until a workload is prepared there again. Default false: the node
	// shows DeadMemberListed instead.
	// +optional
	// +kubebuilder:default=false
	ReleaseDeadMemberLabel bool `json:"releaseDeadMemberLabel"`

	// taintDegradedCliques puts gpuhealth.dev/fabric-degraded:NoSchedule on
	// every node of an NVLink clique with a fabric-scoped fault (IMEX domain
	// DOWN, fatal NVSwitch fault, fabric not completed) until it resolves.
	// Default true.
	// +optional
	// +kubebuilder:default=true
	TaintDegradedCliques *bool `json:"taintDegradedCliques,omitempty"`

	// singleReportTaintsClique lets one node's fabric-scoped fault taint its
	// whole clique when that clique is known only from the node's own
	// nvidia.com/gpu.clique label. The node's kubelet may set its own labels
	// to any value, so by default such a clique is tainted only when at
	// least two of its members report a fabric fault. Where NVIDIA's DRA
	// driver names the node in a ComputeDomainClique, the clique comes from
	// the driver and one report suffices whatever this says. Default false.
	// +optional
	SingleReportTaintsClique bool `json:"singleReportTaintsClique,omitempty"`

	// cliqueCertification runs a multi-node test across the healthy nodes
	// of a clique whose fabric fault resolved, and lifts the
	// fabric-degraded taint only when it passes. Unset: the taint is lifted
	// as soon as the fault resolves.
	// +optional
	CliqueCertification *CliqueCertificationSpec `json:"cliqueCertification,omitempty"`
}

// CircuitBreakerSpec stops new quarantines when too many nodes enter
// quarantine at once, which points at a shared cause (a bad driver roll-out,
// a monitor bug) rather than bad hardware. Recoveries always continue.
type CircuitBreakerSpec struct {
	// enabled turns the breaker on. Default true.
	// +optional
	// +kubebuilder:default=true
	Enabled *bool `json:"enabled,omitempty"`

	// threshold is how many managed nodes (count or percentage) may enter
	// quarantine within window before the breaker opens. Default 10%.
	// +optional
	// +kubebuilder:default="10%"
	// +kubebuilder:validation:XIntOrString
	// +kubebuilder:validation:XValidation:rule="type(self) == int ? self >= 1 : self.matches('^(100|[1-9][0-9]?)%$')",message="threshold must be a positive count (5) or a percentage from 1% to 100% (\"10%\")"
	Threshold *intstr.IntOrString `json:"threshold,omitempty"`

	// window is the sliding window over which quarantines are counted. Default 10m.
	// +optional
	// +kubebuilder:default="10m"
	// +kubebuilder:validation:XValidation:rule="self.matches('^([0-9]+([.][0-9]+)?(ns|us|µs|ms|s|m|h))+$') && duration(self) >= duration('1s') && duration(self) <= duration('8760h')",message="window must be a duration from 1s to 8760h (a year) such as 30s, 5m or 1h"
	Window *Duration `json:"window,omitempty"`

	// coolDown is how long the breaker stays open before it closes by itself. Default 30m.
	// +optional
	// +kubebuilder:default="30m"
	// +kubebuilder:validation:XValidation:rule="self.matches('^([0-9]+([.][0-9]+)?(ns|us|µs|ms|s|m|h))+$') && duration(self) >= duration('1s') && duration(self) <= duration('8760h')",message="coolDown must be a duration from 1s to 8760h (a year) such as 30s, 5m or 1h"
	CoolDown *Duration `json:"coolDown,omitempty"`
}

// NetworkSpec is how NIC findings (check NIC: a compute port down,
// flapping, slow or erring, an adapter gone) across many nodes are told
// apart from one node's fault.
type NetworkSpec struct {
	// topologyLabels are node labels that name the switch (or block of
	// switches) a node hangs off, most specific first, for example a leaf
	// label your provisioning sets or Kueue TAS's block label. A node is
	// grouped by the first of them it carries; nodes with none form one
	// group per policy.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=4
	// +kubebuilder:validation:items:MaxLength=316
	// +kubebuilder:validation:items:MinLength=1
	TopologyLabels []string `json:"topologyLabels,omitempty"`

	// circuitBreaker stops quarantines whose every counting finding is a
	// NIC finding once threshold nodes of one group entered quarantine for
	// NIC findings within window: a leaf switch that fails takes every node
	// under it down at once, and draining them all would stop more work
	// than the switch did. Quarantines for other findings, and recoveries,
	// go on. The policy's reset annotation resets it too.
	// +optional
	// +kubebuilder:default={}
	CircuitBreaker NetworkBreakerSpec `json:"circuitBreaker"`
}

// NetworkBreakerSpec is the network circuit breaker's settings.
type NetworkBreakerSpec struct {
	// enabled turns the breaker on. Default true.
	// +optional
	// +kubebuilder:default=true
	Enabled *bool `json:"enabled,omitempty"`

	// threshold is how many nodes of one group (a count, or a percentage
	// of the group's managed nodes) may enter quarantine for NIC findings
	// within window; the next one opens the group's breaker. Default 3:
	// compute NICs of independent nodes fail a few times a week in a
	// fleet of thousands, so a fourth within ten minutes behind one switch
	// (or anywhere, without topology labels) points at what they share.
	// +optional
	// +kubebuilder:default=3
	// +kubebuilder:validation:XIntOrString
	// +kubebuilder:validation:XValidation:rule="type(self) == int ? self >= 1 : self.matches('^(100|[1-9][0-9]?)%$')",message="threshold must be a positive count (3) or a percentage from 1% to 100% (\"25%\")"
	Threshold *intstr.IntOrString `json:"threshold,omitempty"`

	// window is the sliding window quarantines are counted in. Default 10m.
	// +optional
	// +kubebuilder:default="10m"
	// +kubebuilder:validation:XValidation:rule="self.matches('^([0-9]+([.][0-9]+)?(ns|us|µs|ms|s|m|h))+$') && duration(self) >= duration('1s') && duration(self) <= duration('8760h')",message="window must be a duration from 1s to 8760h (a year) such as 30s, 5m or 1h"
	Window *Duration `json:"window,omitempty"`

	// coolDown is how long an open group breaker stays open. Default 30m.
	// +optional
	// +kubebuilder:default="30m"
	// +kubebuilder:validation:XValidation:rule="self.matches('^([0-9]+([.][0-9]+)?(ns|us|µs|ms|s|m|h))+$') && duration(self) >= duration('1s') && duration(self) <= duration('8760h')",message="coolDown must be a duration from 1s to 8760h (a year) such as 30s, 5m or 1h"
	CoolDown *Duration `json:"coolDown,omitempty"`
}

// RemediationPolicySpec is how the nodes it selects are judged and handled.
type RemediationPolicySpec struct {
	// nodeSelector selects the nodes this policy manages.
	// Default: nodes labelled nvidia.com/gpu.present=true.
	// It must name at least one label: an empty selector would manage
	// every node, control-plane and CPU nodes included.
	// +optional
	// +kubebuilder:default={matchLabels: {"nvidia.com/gpu.present": "true"}}
	// +kubebuilder:validation:XValidation:rule="(has(self.matchLabels) && size(self.matchLabels) > 0) || (has(self.matchExpressions) && size(self.matchExpressions) > 0)",message="nodeSelector must name at least one label: an empty selector manages every node, control-plane and CPU nodes included"
	NodeSelector *metav1.LabelSelector `json:"nodeSelector,omitempty"`

	// rules judge findings, first match wins, before the built-in defaults.
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=64
	Rules []Rule `json:"rules,omitempty"`

	// quarantine is what quarantine does to a node.
	// +optional
	// +kubebuilder:default={}
	Quarantine QuarantineSpec `json:"quarantine"`

	// drain is how a quarantined node is emptied.
	// +optional
	// +kubebuilder:default={}
	Drain DrainSpec `json:"drain"`

	// recertification is how a drained node proves it is fit again.
	// +optional
	// +kubebuilder:default={}
	Recertification RecertificationSpec `json:"recertification"`

	// certification is how a new node proves itself before it first takes work.
	// +optional
	// +kubebuilder:default={}
	Certification CertificationSpec `json:"certification"`

	// remediation lists optional reset and reboot steps before recertification.
	// +optional
	Remediation RemediationSpec `json:"remediation,omitempty"`

	// budgets limit how many nodes are out of service at once.
	// +optional
	// +kubebuilder:default={}
	Budgets BudgetsSpec `json:"budgets"`

	// circuitBreaker stops new quarantines in a storm.
	// +optional
	// +kubebuilder:default={}
	CircuitBreaker CircuitBreakerSpec `json:"circuitBreaker"`

	// computeDomain is how members of NVIDIA ComputeDomains are handled.
	// +optional
	// +kubebuilder:default={}
	ComputeDomain ComputeDomainSpec `json:"computeDomain"`

	// devices is how one GPU is taken out of service alone, for rules of
	// scope Device. Unset: the defaults (NVIDIA's DRA driver, at most 2
	// GPUs per node, NoSchedule, no reset or test Job).
	// +optional
	Devices *DeviceQuarantineSpec `json:"devices,omitempty"`

	// conditions turn Node conditions (node-problem-detector's, the
	// kubelet's) into findings. Unset: none.
	// +optional
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=32
	Conditions []NodeConditionRule `json:"conditions,omitempty"`

	// drift compares each node's NVIDIA stack with its pool's. Unset: no
	// drift findings (the inventory is still shown and exported).
	// +optional
	Drift *DriftSpec `json:"drift,omitempty"`

	// gpuCount says how many GPUs nodes should have. Unset: the PCI bus
	// (the monitor) and the nvidia.com/gpu.count label decide.
	// +optional
	GPUCount *GPUCountSpec `json:"gpuCount,omitempty"`

	// network tells a compute-network fault of one node from a failing
	// switch: quarantines for NIC findings alone are counted per group of
	// nodes behind one switch, and a group that loses too many at once is
	// held back as a storm rather than drained.
	// +optional
	// +kubebuilder:default={}
	Network NetworkSpec `json:"network"`

	// dryRun makes the operator decide and record (NodeHealth, Events,
	// metrics) without touching any node or pod.
	// +optional
	// +kubebuilder:default=false
	DryRun bool `json:"dryRun"`

	// approval names the destructive acts a human approves, node by node,
	// before gpuhealth carries them out. Unset: none waits.
	// +optional
	Approval *ApprovalSpec `json:"approval,omitempty"`
}

// ApprovalTimeoutPolicy is what happens to an act nobody approved in time.
// +kubebuilder:validation:Enum=Wait;Proceed
type ApprovalTimeoutPolicy string

const (
	// ApprovalWait keeps the node waiting for approval.
	ApprovalWait ApprovalTimeoutPolicy = "Wait"
	// ApprovalProceed carries out the act once the timeout passed.
	ApprovalProceed ApprovalTimeoutPolicy = "Proceed"
)

// ApprovalSpec says which acts wait for a human's approval. A node whose
// next act is listed stays in its phase with the condition
// AwaitingApproval and one Event until a request Approve (kubectl
// gpuhealth approve NODE --reason …) names who approved it; the approval
// holds for that act and occasion only (one recertification attempt, one
// failure).
type ApprovalSpec struct {
	// actions are the acts that wait: ResetGPU and RebootNode (the
	// remediation step of a recertification attempt) and ReplaceNode (the
	// hand-off of a failed node to the system that replaces nodes).
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=3
	// +kubebuilder:validation:items:Enum=ResetGPU;RebootNode;ReplaceNode
	Actions []Action `json:"actions,omitempty"`

	// timeout is how long a node waits before onTimeout applies. Unset: it
	// waits until approved.
	// +optional
	// +kubebuilder:validation:XValidation:rule="self.matches('^([0-9]+([.][0-9]+)?(ns|us|µs|ms|s|m|h))+$') && duration(self) >= duration('1s') && duration(self) <= duration('8760h')",message="timeout must be a duration from 1s to 8760h (a year) such as 30m or 4h"
	Timeout *Duration `json:"timeout,omitempty"`

	// onTimeout is Wait (keep waiting, the default) or Proceed (carry out
	// the act, recorded as not approved).
	// +optional
	// +kubebuilder:default=Wait
	OnTimeout ApprovalTimeoutPolicy `json:"onTimeout,omitempty"`
}

// BreakerState is the state of the circuit breaker.
// +kubebuilder:validation:Enum=Closed;Open
type BreakerState string

const (
	// BreakerClosed lets quarantines through.
	BreakerClosed BreakerState = "Closed"
	// BreakerOpen stops new quarantines.
	BreakerOpen BreakerState = "Open"
)

// CircuitBreakerStatus is the breaker's current state.
type CircuitBreakerStatus struct {
	// state is Closed or Open.
	// +optional
	State BreakerState `json:"state,omitempty"`

	// since is when the breaker entered its state.
	// +optional
	Since *metav1.Time `json:"since,omitempty"`

	// quarantinesInWindow is how many nodes entered quarantine inside the window.
	// +optional
	// +kubebuilder:validation:Minimum=0
	QuarantinesInWindow int32 `json:"quarantinesInWindow,omitempty"`

	// message explains the state with the numbers that tripped it.
	// +optional
	// +kubebuilder:validation:MaxLength=512
	Message string `json:"message,omitempty"`

	// lastReset is the value of the gpuhealth.dev/reset-circuit-breaker
	// annotation the operator last honoured; a new value resets the breaker once.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	LastReset string `json:"lastReset,omitempty"`
}

// ResetCircuitBreakerAnnotation on a RemediationPolicy asks the operator to
// close its circuit breaker. Any new value is one request.
const ResetCircuitBreakerAnnotation = "gpuhealth.dev/reset-circuit-breaker"

// RemediationPolicyStatus summarises the nodes the policy manages.
type RemediationPolicyStatus struct {
	// observedGeneration is the spec generation the status reflects.
	// +optional
	// +kubebuilder:validation:Minimum=0
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// managedNodes is the number of nodes the policy selects.
	// +optional
	// +kubebuilder:validation:Minimum=0
	ManagedNodes int32 `json:"managedNodes,omitempty"`

	// phases counts the managed nodes by phase.
	// +optional
	Phases map[NodeHealthPhase]int32 `json:"phases,omitempty"`

	// budget counts the maxUnavailable budget over the managed nodes.
	// +optional
	Budget *BudgetStatus `json:"budget,omitempty"`

	// circuitBreaker is the breaker's current state.
	// +optional
	CircuitBreaker *CircuitBreakerStatus `json:"circuitBreaker,omitempty"`

	// conditions are the policy's conditions, such as Ready.
	// +optional
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=8
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// BudgetStatus counts a policy's maxUnavailable budget. The counts are those
// of the policy's last count (at most once a second).
type BudgetStatus struct {
	// limit is maxUnavailable resolved against the managed nodes.
	// +required
	// +kubebuilder:validation:Minimum=0
	Limit int32 `json:"limit"`

	// unavailable is how many managed nodes are Draining or Recertifying
	// (and Certifying, when certification.countAgainstBudget).
	// +required
	// +kubebuilder:validation:Minimum=0
	Unavailable int32 `json:"unavailable"`

	// waiting is how many managed nodes are quarantined and wait for this
	// budget (their status.blockingBudget is maxUnavailable).
	// +optional
	// +kubebuilder:validation:Minimum=0
	Waiting int32 `json:"waiting,omitempty"`
}

// RemediationPolicy says how gpuhealth judges findings and handles the nodes
// it selects: rules, quarantine, drain, remediation and recertification,
// budgets, the circuit breaker and dry-run.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,shortName=rp,categories=gpuhealth
// +kubebuilder:printcolumn:name="Managed",type=integer,JSONPath=`.status.managedNodes`
// +kubebuilder:printcolumn:name="Healthy",type=integer,JSONPath=`.status.phases.Healthy`
// +kubebuilder:printcolumn:name="Unavailable",type=integer,JSONPath=`.status.budget.unavailable`
// +kubebuilder:printcolumn:name="Limit",type=integer,JSONPath=`.status.budget.limit`
// +kubebuilder:printcolumn:name="Waiting",type=integer,JSONPath=`.status.budget.waiting`
// +kubebuilder:printcolumn:name="Breaker",type=string,JSONPath=`.status.circuitBreaker.state`
// +kubebuilder:printcolumn:name="DryRun",type=boolean,JSONPath=`.spec.dryRun`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:printcolumn:name="Message",type=string,JSONPath=`.status.circuitBreaker.message`,priority=1
type RemediationPolicy struct {
	metav1.TypeMeta `json:",inline"`

	// metadata is the standard object metadata.
	// +optional
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec is the policy.
	// +optional
	Spec RemediationPolicySpec `json:"spec,omitempty"`

	// status summarises the managed nodes.
	// +optional
	Status RemediationPolicyStatus `json:"status,omitempty"`
}

// RemediationPolicyList is a list of RemediationPolicies.
//
// +kubebuilder:object:root=true
type RemediationPolicyList struct {
	metav1.TypeMeta `json:",inline"`
	// metadata is the standard list metadata.
	// +optional
	metav1.ListMeta `json:"metadata,omitempty"`
	// items are the RemediationPolicies.
	Items []RemediationPolicy `json:"items"`
}
