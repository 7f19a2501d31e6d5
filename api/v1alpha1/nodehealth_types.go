package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// RequestAction is a one-shot manual request a human makes on a NodeHealth.
// +kubebuilder:validation:Enum=Recertify;Release;Maintenance;Approve
type RequestAction string

const (
	// RequestRecertify starts recertification now (from Quarantined, Draining or Failed the
	// node is drained first).
	RequestRecertify RequestAction = "Recertify"
	// RequestRelease returns the node to Healthy without recertification. It is audited.
	RequestRelease RequestAction = "Release"
	// RequestMaintenance takes a Healthy node out for planned maintenance:
	// cordoned and drained under the same budgets and drain settings as a
	// fault, then held in phase Maintenance until a Recertify (the usual way
	// back) or a Release request. It is audited.
	RequestMaintenance RequestAction = "Maintenance"
	// RequestApprove approves the destructive act the node waits for
	// (status.approval; the policy's approval.actions). It is audited.
	RequestApprove RequestAction = "Approve"
)

// ManualRequest is a one-shot request. The operator carries out each id once
// and records it in status.lastRequest; to repeat an action, use a new id.
// +kubebuilder:validation:XValidation:rule="self.action != 'Release' || (has(self.reason) && size(self.reason) > 0)",message="a Release returns the node without recertification and is audited: give a reason"
// +kubebuilder:validation:XValidation:rule="self.action != 'Maintenance' || (has(self.reason) && size(self.reason) > 0)",message="a Maintenance request takes the node out of service and is audited: give a reason"
// +kubebuilder:validation:XValidation:rule="self.action != 'Approve' || (has(self.reason) && size(self.reason) > 0)",message="an Approve request lets a destructive act go ahead and is audited: give a reason"
type ManualRequest struct {
	// action is what is requested: Recertify, Release, Maintenance or
	// Approve.
	// +required
	Action RequestAction `json:"action"`

	// id identifies this request, for example a ticket number or a timestamp.
	// The operator acts on a given id once.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:XValidation:rule="self.matches('^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$')",message="id may contain only letters, digits and . _ - and must start and end with a letter or digit"
	ID string `json:"id"`

	// reason says why, in words that end up in the node's history and Events.
	// +optional
	// +kubebuilder:validation:MaxLength=512
	Reason string `json:"reason,omitempty"`

	// requestedBy names who asked: the user name the apiserver authenticates
	// the writer of the request as (kubectl auth whoami shows it). The
	// install's admission policy refuses a request that names anyone else,
	// and kubectl gpuhealth fills it in. The operator also records the field
	// manager that wrote the request.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	RequestedBy string `json:"requestedBy,omitempty"`
}

// NodeHealthSpec holds the manual controls a human has over one node. The
// operator creates the NodeHealth with an empty spec.
// +kubebuilder:validation:XValidation:rule="!(self.exclude && self.hold)",message="exclude and hold are mutually exclusive: an excluded node is not managed at all, so it cannot be held in quarantine"
// +kubebuilder:validation:XValidation:rule="!(self.hold && has(self.request) && self.request.action == 'Release')",message="a Release request contradicts hold: clear hold first"
type NodeHealthSpec struct {
	// exclude takes the node out of gpuhealth's management: the operator
	// never cordons, taints, drains or labels it while this is true, and
	// findings about it are only recorded.
	// +optional
	// +kubebuilder:default=false
	Exclude bool `json:"exclude"`

	// hold keeps the node where it is once quarantined: it is not drained,
	// recertified or returned to service until hold is cleared.
	// +optional
	// +kubebuilder:default=false
	Hold bool `json:"hold"`

	// request is a one-shot manual request: recertify now, release to
	// Healthy without recertification, or take the node out for planned
	// maintenance.
	// +optional
	Request *ManualRequest `json:"request,omitempty"`
}

// FindingRef summarises one active NodeHealthEvent of the node.
type FindingRef struct {
	// name is the NodeHealthEvent's name.
	// +required
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`

	// check is the event's check.
	// +required
	Check Check `json:"check"`

	// code is the event's code.
	// +required
	// +kubebuilder:validation:MaxLength=128
	Code string `json:"code"`

	// severity is the event's severity.
	// +required
	Severity Severity `json:"severity"`

	// verdict is how the policy judged the event.
	// +optional
	Verdict Verdict `json:"verdict,omitempty"`

	// recommendedAction is the event's recommended action.
	// +optional
	RecommendedAction Action `json:"recommendedAction,omitempty"`
}

// BlockedPod is a pod that could not be evicted yet.
type BlockedPod struct {
	// namespace is the pod's namespace.
	// +required
	// +kubebuilder:validation:MaxLength=63
	Namespace string `json:"namespace"`

	// name is the pod's name.
	// +required
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`

	// podDisruptionBudget is the name of the PodDisruptionBudget that refused
	// the eviction, when one did.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	PodDisruptionBudget string `json:"podDisruptionBudget,omitempty"`

	// message is why the pod is still there.
	// +optional
	// +kubebuilder:validation:MaxLength=512
	Message string `json:"message,omitempty"`
}

// DrainStatus is the progress of the node's drain.
type DrainStatus struct {
	// startedAt is when the drain started.
	// +optional
	StartedAt *metav1.Time `json:"startedAt,omitempty"`

	// podsTotal is the number of pods the drain had to remove when it started.
	// +optional
	// +kubebuilder:validation:Minimum=0
	PodsTotal int32 `json:"podsTotal,omitempty"`

	// podsRemaining is the number of those pods still on the node.
	// +optional
	// +kubebuilder:validation:Minimum=0
	PodsRemaining int32 `json:"podsRemaining,omitempty"`

	// podsBlocked is the number of remaining pods whose eviction a
	// PodDisruptionBudget refused the last time it was tried.
	// +optional
	// +kubebuilder:validation:Minimum=0
	PodsBlocked int32 `json:"podsBlocked,omitempty"`

	// blocked lists up to ten blocked pods, sorted by namespace and name.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=10
	Blocked []BlockedPod `json:"blocked,omitempty"`

	// completedAt is when no pod that must leave was left on the node. A
	// ComputeDomain member then still has to leave its domain before it is
	// drained; policy computeDomain.leaveTimeout counts from here. Unset
	// while pods remain.
	// +optional
	CompletedAt *metav1.Time `json:"completedAt,omitempty"`

	// gangs are the gangs with members on the node that the drain stops
	// whole (policy drain.gangs Gang), up to eight, by kind and name.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=8
	Gangs []GangWave `json:"gangs,omitempty"`
}

// GangWave is one gang a drain stops whole: every member, on every node,
// evicted in one wave.
type GangWave struct {
	// kind is the workload kind that marks the gang: PodGroup, JobSet,
	// LeaderWorkerSet, Kubeflow, Volcano, KAI, Coscheduling, Ray, Kueue or
	// Label (one of the policy's gangLabelKeys).
	// +required
	// +kubebuilder:validation:MaxLength=32
	Kind string `json:"kind"`

	// namespace is the gang's namespace: all its members share it.
	// +required
	// +kubebuilder:validation:MaxLength=63
	Namespace string `json:"namespace"`

	// name is the gang's name as its kind marks it: the PodGroup's, the
	// JobSet's, the label's value.
	// +required
	// +kubebuilder:validation:MaxLength=317
	Name string `json:"name"`

	// part tells apart gangs of one object: a JobSet's restart attempt, a
	// LeaderWorkerSet's group index; for kind Label, the label key.
	// +optional
	// +kubebuilder:validation:MaxLength=317
	Part string `json:"part,omitempty"`

	// owner is the object standing for the gang ("JobSet llama"), which
	// gets an Event saying why it was stopped.
	// +optional
	// +kubebuilder:validation:MaxLength=317
	Owner string `json:"owner,omitempty"`

	// size is how many members the wave counted: the gang's running pods
	// created before the drain began.
	// +optional
	// +kubebuilder:validation:Minimum=0
	Size int32 `json:"size,omitempty"`

	// nodes are the nodes the gang spanned, sorted, up to 16.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:items:MaxLength=253
	Nodes []string `json:"nodes,omitempty"`

	// spannedNodes is how many nodes the gang spanned; nodes lists 16.
	// +optional
	// +kubebuilder:validation:Minimum=0
	SpannedNodes int32 `json:"spannedNodes,omitempty"`

	// evictedAt is when the wave was sent: every member not already leaving
	// was evicted then. Unset while it is held.
	// +optional
	EvictedAt *metav1.Time `json:"evictedAt,omitempty"`

	// held says why the wave waits: a member whose PodDisruptionBudget
	// allows no disruption holds the whole gang until the drain timeout.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	Held string `json:"held,omitempty"`
}

// JobResult is the outcome of a recertification or remediation Job, and
// of a suite step or attempt.
// +kubebuilder:validation:Enum=Pending;Running;Succeeded;Failed;NotRun;Superseded;Cancelled
type JobResult string

const (
	// JobPending means the Job is created and its pod has not started.
	JobPending JobResult = "Pending"
	// JobRunning means the Job's pod runs.
	JobRunning JobResult = "Running"
	// JobSucceeded means the Job completed successfully.
	JobSucceeded JobResult = "Succeeded"
	// JobFailed means the Job ran and failed (the test said no), or ran
	// past its deadline.
	JobFailed JobResult = "Failed"
	// JobNotRun means a step's Job ended without its pod ever running, in
	// each of its tries (policy maxNotRun); for an attempt, that one of its
	// steps did. Nothing was tested: it says nothing about the GPUs.
	JobNotRun JobResult = "NotRun"
	// JobSuperseded means an attempt was overtaken by a new finding before
	// the node could return: the next attempt runs for it.
	JobSuperseded JobResult = "Superseded"
	// JobCancelled means the workflow ended before the attempt did (a
	// human's uncordon or release, a cancelled certification); its
	// unfinished Jobs were deleted.
	JobCancelled JobResult = "Cancelled"
)

// RecertificationStatus is the progress of the node's recertification.
type RecertificationStatus struct {
	// attempt counts recertification attempts since the node was quarantined, starting at 1.
	// +optional
	// +kubebuilder:validation:Minimum=0
	Attempt int32 `json:"attempt,omitempty"`

	// remediation is the step this attempt remediates with, fixed when the
	// attempt reaches it: ResetGPU, RebootNode, or None (the findings asked
	// for neither, or the policy configures no such step). A finding that
	// asks for more during the attempt waits for the next attempt; it never
	// starts a second act beside the running one.
	// +optional
	// +kubebuilder:validation:Enum=None;ResetGPU;RebootNode
	Remediation Action `json:"remediation,omitempty"`

	// diagnosedAt is when this attempt's diagnostics step was done (its
	// Job finished, or went): it is not run again for this attempt.
	// +optional
	DiagnosedAt *metav1.Time `json:"diagnosedAt,omitempty"`

	// remediatedAt is when this attempt's reset or reboot step was done:
	// from then on it is not judged again (its Job may be gone, by its TTL
	// or by hand, and is never made again for this attempt).
	// +optional
	RemediatedAt *metav1.Time `json:"remediatedAt,omitempty"`

	// remediationJob is the name of the reset or reboot Job of this attempt, if any.
	// +optional
	// +kubebuilder:validation:MaxLength=63
	RemediationJob string `json:"remediationJob,omitempty"`

	// remediationStartedAt is when this attempt's reset or reboot step started.
	// +optional
	RemediationStartedAt *metav1.Time `json:"remediationStartedAt,omitempty"`

	// bootID is the node's status.nodeInfo.bootID when this attempt's reboot
	// step started. The reboot is done when the node reports another boot ID
	// and is Ready again; its Job may fail or vanish with its pod meanwhile.
	// Empty when the node reported none: the Job's result is then taken.
	// +optional
	// +kubebuilder:validation:MaxLength=64
	BootID string `json:"bootID,omitempty"`

	// jobName is the name of the recertification Job of this attempt
	// (in the operator's namespace).
	// +optional
	// +kubebuilder:validation:MaxLength=63
	JobName string `json:"jobName,omitempty"`

	// result is the outcome of the current attempt's Job.
	// +optional
	Result JobResult `json:"result,omitempty"`

	// startedAt is when the current attempt started.
	// +optional
	StartedAt *metav1.Time `json:"startedAt,omitempty"`

	// completedAt is when the current attempt's Job finished.
	// +optional
	CompletedAt *metav1.Time `json:"completedAt,omitempty"`

	// message explains the result, for example the failing test.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	Message string `json:"message,omitempty"`

	// steps are the results of this attempt's suite steps, in order.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=16
	Steps []StepResult `json:"steps,omitempty"`

	// request is the gpuhealth.dev/certify label value this certification
	// answers, when a human asked for it.
	// +optional
	// +kubebuilder:validation:MaxLength=63
	Request string `json:"request,omitempty"`
}

// DiagnosticsRecord names a diagnostics Job and what became of it.
type DiagnosticsRecord struct {
	// job is the Job's name, in the operator's namespace: `kubectl logs
	// -n <namespace> job/<job>` prints what it collected.
	// +required
	// +kubebuilder:validation:MaxLength=63
	Job string `json:"job"`

	// before is the act it ran before: ResetGPU or RebootNode.
	// +optional
	// +kubebuilder:validation:Enum=ResetGPU;RebootNode
	Before Action `json:"before,omitempty"`

	// attempt is the recertification attempt it ran in.
	// +optional
	// +kubebuilder:validation:Minimum=0
	Attempt int32 `json:"attempt,omitempty"`

	// result is Pending, Running, Succeeded or Failed (it failed, or ran
	// past its timeout; the reset or reboot went ahead anyway).
	// +optional
	Result JobResult `json:"result,omitempty"`

	// startedAt is when the Job was created.
	// +optional
	StartedAt *metav1.Time `json:"startedAt,omitempty"`

	// completedAt is when the operator saw it finished.
	// +optional
	CompletedAt *metav1.Time `json:"completedAt,omitempty"`

	// keptUntil is when the Job and its log go (its retain after it finished).
	// +optional
	KeptUntil *metav1.Time `json:"keptUntil,omitempty"`

	// message says what became of it.
	// +optional
	// +kubebuilder:validation:MaxLength=512
	Message string `json:"message,omitempty"`
}

// Membership is a node's standing in its ComputeDomain.
// +kubebuilder:validation:Enum=Member;Leaving;Left
type Membership string

const (
	// MembershipMember means the node is an active member of the domain.
	MembershipMember Membership = "Member"
	// MembershipLeaving means the node is draining and some trace of membership remains
	// (node label, daemon pod or clique entry).
	MembershipLeaving Membership = "Leaving"
	// MembershipLeft means every trace of membership is gone.
	MembershipLeft Membership = "Left"
)

// MembershipTrace is one sign that a node still belongs to its ComputeDomain.
// +kubebuilder:validation:Enum=NodeLabel;DaemonPod;CliqueEntry;StatusEntry
type MembershipTrace string

const (
	// TraceNodeLabel is the node label resource.nvidia.com/computeDomain=<uid>,
	// which the DRA driver removes when the node's channel claim is unprepared.
	TraceNodeLabel MembershipTrace = "NodeLabel"
	// TraceDaemonPod is the domain's IMEX daemon pod on the node.
	TraceDaemonPod MembershipTrace = "DaemonPod"
	// TraceCliqueEntry is the node's entry in a ComputeDomainClique's daemons.
	TraceCliqueEntry MembershipTrace = "CliqueEntry"
	// TraceStatusEntry is the node's entry in ComputeDomain status.nodes
	// (drivers without ComputeDomainClique objects).
	TraceStatusEntry MembershipTrace = "StatusEntry"
)

// NodeHealthComputeDomainLeaveStuckCondition is True when a drained node's
// ComputeDomain membership outlived the policy's computeDomain.leaveTimeout;
// the node stays in Draining until every trace is gone. It is named for the
// problem (not positive polarity) because it is how the issue is alerted on.
const NodeHealthComputeDomainLeaveStuckCondition = "ComputeDomainLeaveStuck"

// FabricDegradedTaintKey is the taint gpuhealth puts (NoSchedule) on every
// node of an NVLink clique with a fabric-scoped fault, so that no new
// ComputeDomain lands on the broken rack. Healthy members are not drained.
const FabricDegradedTaintKey = "gpuhealth.dev/fabric-degraded"

// BudgetName names one of the policy's budgets.
// +kubebuilder:validation:Enum=maxUnavailable;maxUnavailablePerComputeDomain;maxUnavailablePerClique
type BudgetName string

const (
	// BudgetMaxUnavailable is spec.budgets.maxUnavailable.
	BudgetMaxUnavailable BudgetName = "maxUnavailable"
	// BudgetPerComputeDomain is spec.budgets.maxUnavailablePerComputeDomain.
	BudgetPerComputeDomain BudgetName = "maxUnavailablePerComputeDomain"
	// BudgetPerClique is spec.budgets.maxUnavailablePerClique.
	BudgetPerClique BudgetName = "maxUnavailablePerClique"
)

// ComputeDomainMembership is the node's place in an NVIDIA ComputeDomain.
type ComputeDomainMembership struct {
	// uid is the ComputeDomain's UID (the value of the node label
	// resource.nvidia.com/computeDomain).
	// +required
	// +kubebuilder:validation:MaxLength=64
	UID string `json:"uid"`

	// namespace is the ComputeDomain's namespace, when the object is known.
	// +optional
	// +kubebuilder:validation:MaxLength=63
	Namespace string `json:"namespace,omitempty"`

	// name is the ComputeDomain's name, when the object is known.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name,omitempty"`

	// cliqueID is the NVLink clique ("<ClusterUUID>.<CliqueId>") the node belongs to.
	// +optional
	// +kubebuilder:validation:MaxLength=128
	CliqueID string `json:"cliqueID,omitempty"`

	// membership is the node's standing in the domain: Member, Leaving or Left.
	// +optional
	Membership Membership `json:"membership,omitempty"`

	// domainStatus is the ComputeDomain's own status.status (Ready or NotReady).
	// +optional
	// +kubebuilder:validation:MaxLength=32
	DomainStatus string `json:"domainStatus,omitempty"`

	// traces lists what still ties the node to the domain (node label,
	// daemon pod, clique or status entry); empty once it has left.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=4
	Traces []MembershipTrace `json:"traces,omitempty"`

	// leftAt is when the operator first saw every trace gone.
	// +optional
	LeftAt *metav1.Time `json:"leftAt,omitempty"`

	// deadSince is when the dead period began (the node's NotReady
	// transition) for which gpuhealth deleted the node's stale daemon pods:
	// they are deleted once per dead period, not on every reconcile.
	// +optional
	DeadSince *metav1.Time `json:"deadSince,omitempty"`
}

// Transition is one entry of a node's history.
type Transition struct {
	// from is the phase the node left; empty for the first entry.
	// +optional
	From NodeHealthPhase `json:"from,omitempty"`

	// to is the phase the node entered.
	// +required
	To NodeHealthPhase `json:"to"`

	// reason is a CamelCase word for why.
	// +required
	// +kubebuilder:validation:MaxLength=64
	Reason string `json:"reason"`

	// message explains the transition in a sentence.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	Message string `json:"message,omitempty"`

	// by names who caused the transition when it was a manual request.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	By string `json:"by,omitempty"`

	// time is when the transition happened.
	// +required
	Time metav1.Time `json:"time"`
}

// HandledRequest records the last manual request the operator carried out.
type HandledRequest struct {
	// id is the request's id.
	// +required
	// +kubebuilder:validation:MaxLength=63
	ID string `json:"id"`

	// action is the request's action.
	// +required
	Action RequestAction `json:"action"`

	// by names who asked: the request's requestedBy and the field manager that wrote it.
	// +optional
	// +kubebuilder:validation:MaxLength=512
	By string `json:"by,omitempty"`

	// time is when the operator carried it out.
	// +required
	Time metav1.Time `json:"time"`

	// result says what happened, for example that a Release was refused.
	// +optional
	// +kubebuilder:validation:MaxLength=512
	Result string `json:"result,omitempty"`
}

// OutageCause is why a node is out of service.
// +kubebuilder:validation:Enum=Fault;Maintenance;Certification;Request
type OutageCause string

const (
	// OutageFault means a finding took the node out of service.
	OutageFault OutageCause = "Fault"
	// OutageMaintenance means a human took it out for planned maintenance.
	OutageMaintenance OutageCause = "Maintenance"
	// OutageCertification means a new node (or one a human labelled) is being certified.
	OutageCertification OutageCause = "Certification"
	// OutageRequest means a human asked for a recertification of a healthy node.
	OutageRequest OutageCause = "Request"
)

// Outage is one stretch of time a node spends out of service.
type Outage struct {
	// since is when the node left service: the first quarantine of a fault,
	// the start of a maintenance or of a certification.
	// +required
	Since metav1.Time `json:"since"`

	// cause is why the node is out of service.
	// +required
	Cause OutageCause `json:"cause"`

	// check is the fault's check (the most drastic finding's), for a fault.
	// +optional
	Check Check `json:"check,omitempty"`

	// code is the fault's code, for a fault.
	// +optional
	// +kubebuilder:validation:MaxLength=128
	Code string `json:"code,omitempty"`

	// action is the fault's recommended action (the most drastic), for a fault.
	// +optional
	Action Action `json:"action,omitempty"`

	// failedAt is when the node first ended Failed in this outage; its
	// repair time was measured then, and is not measured again when a
	// human later returns it.
	// +optional
	FailedAt *metav1.Time `json:"failedAt,omitempty"`
}

// FaultMark is when a class of fault last took the node out of service.
type FaultMark struct {
	// check is the class of fault.
	// +required
	Check Check `json:"check"`

	// time is when a fault of this class last quarantined the node.
	// +required
	Time metav1.Time `json:"time"`
}

// HandOffState is where a hand-off stands.
// +kubebuilder:validation:Enum=HandedOff;Failed
type HandOffState string

const (
	// HandOffDone means the hand-off was made (annotation set, object created,
	// or the node condition left for its consumer).
	HandOffDone HandOffState = "HandedOff"
	// HandOffFailed means it could not be made; message says why.
	HandOffFailed HandOffState = "Failed"
)

// HandOffStatus records the hand-off of a failed node.
type HandOffStatus struct {
	// type is the policy's hand-off type: ClusterAPI, Template or Condition.
	// +required
	Type HandOffType `json:"type"`

	// state is HandedOff or Failed.
	// +required
	State HandOffState `json:"state"`

	// time is when it was made (or failed).
	// +required
	Time metav1.Time `json:"time"`

	// reason is why the node was handed off: ReplaceNode,
	// RecertificationExhausted or CertificationExhausted.
	// +required
	// +kubebuilder:validation:MaxLength=64
	Reason string `json:"reason"`

	// target names what was handed the node: the Machine, the created
	// object, or the node condition.
	// +optional
	// +kubebuilder:validation:MaxLength=512
	Target string `json:"target,omitempty"`

	// targetRef is the Machine or created object, whole: taking the
	// hand-off back acts on exactly it, whatever the policy says by then.
	// +optional
	TargetRef *HandOffRef `json:"targetRef,omitempty"`

	// message explains the hand-off or why it failed.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	Message string `json:"message,omitempty"`

	// targetStatus summarises the target's own status (its conditions or
	// phase), as last read; empty when it has none.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	TargetStatus string `json:"targetStatus,omitempty"`
}

// HandOffRef names one object a hand-off acted on.
type HandOffRef struct {
	// apiVersion is the object's group and version.
	// +required
	// +kubebuilder:validation:MaxLength=253
	APIVersion string `json:"apiVersion"`

	// kind is the object's kind.
	// +required
	// +kubebuilder:validation:MaxLength=63
	Kind string `json:"kind"`

	// namespace is the object's namespace; empty for a cluster-scoped one.
	// +optional
	// +kubebuilder:validation:MaxLength=63
	Namespace string `json:"namespace,omitempty"`

	// name is the object's name.
	// +required
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`

	// uid is the object's UID once it was seen: an object of the same
	// name made later is another, and is left alone.
	// +optional
	UID types.UID `json:"uid,omitempty"`
}

// NodeHealthStatus is where the node stands, written by the operator.
type NodeHealthStatus struct {
	// phase is the node's place in the state machine: Healthy, Certifying,
	// Quarantined, Draining, Recertifying, Maintenance or Failed.
	// +optional
	Phase NodeHealthPhase `json:"phase,omitempty"`

	// reason is a CamelCase word for why the node is in its phase or what it waits for.
	// +optional
	// +kubebuilder:validation:MaxLength=64
	Reason string `json:"reason,omitempty"`

	// message explains the phase and what the node waits for, with the numbers a human needs.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	Message string `json:"message,omitempty"`

	// since is when the node entered its phase.
	// +optional
	Since *metav1.Time `json:"since,omitempty"`

	// activeEvents summarises the node's active findings (at most 32, the most severe first).
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=32
	ActiveEvents []FindingRef `json:"activeEvents,omitempty"`

	// drain is the progress of the drain, while draining and after.
	// +optional
	Drain *DrainStatus `json:"drain,omitempty"`

	// recertification is the progress of recertification.
	// +optional
	Recertification *RecertificationStatus `json:"recertification,omitempty"`

	// certification is the progress of a new node's certification.
	// +optional
	Certification *RecertificationStatus `json:"certification,omitempty"`

	// certificate is the last suite (certification or recertification) the
	// node passed, with its step results. Unset: not certified.
	// +optional
	Certificate *Certificate `json:"certificate,omitempty"`

	// certifyRequest is the last gpuhealth.dev/certify label value the
	// operator acted on: it started a certification for it (whatever became
	// of that), so the value is not acted on again.
	// +optional
	// +kubebuilder:validation:MaxLength=63
	CertifyRequest string `json:"certifyRequest,omitempty"`

	// outage is the node's current time out of service: since when, and
	// why (a fault, planned maintenance, a certification or a request).
	// Unset while the node is in service. Repair durations and the goodput
	// metrics are measured from it.
	// +optional
	Outage *Outage `json:"outage,omitempty"`

	// lastFaults is when each class of fault (check) last took the node out
	// of service, for the time between faults.
	// +optional
	// +listType=map
	// +listMapKey=check
	// +kubebuilder:validation:MaxItems=16
	LastFaults []FaultMark `json:"lastFaults,omitempty"`

	// handOff is the hand-off of a failed node to the system that replaces
	// nodes (policy remediation.handOff), once made. It is made once per
	// failure and cleared when the node leaves Failed.
	// +optional
	HandOff *HandOffStatus `json:"handOff,omitempty"`

	// computeDomain is the node's ComputeDomain membership, when it has one.
	// A node that left its domain while out of service keeps the entry
	// (membership Left), so it still counts against the domain's budget
	// until it returns to service.
	// +optional
	ComputeDomain *ComputeDomainMembership `json:"computeDomain,omitempty"`

	// blockingBudget names the budget a quarantined node waits for
	// (maxUnavailable, maxUnavailablePerComputeDomain or
	// maxUnavailablePerClique); the message carries the numbers. Empty when
	// the node does not wait for a budget.
	// +optional
	BlockingBudget BudgetName `json:"blockingBudget,omitempty"`

	// diagnostics is the last diagnostics Job run before a reset or reboot
	// of the node (policy remediation.diagnostics): its log is the
	// evidence of what the node knew, kept until keptUntil.
	// +optional
	Diagnostics *DiagnosticsRecord `json:"diagnostics,omitempty"`

	// preexistingCordon is true when the node was already unschedulable
	// before gpuhealth quarantined it; gpuhealth then never uncordons it.
	// +optional
	PreexistingCordon bool `json:"preexistingCordon,omitempty"`

	// preexistingTaints are taints gpuhealth would add that were already on
	// the node before quarantine; gpuhealth never removes them.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=16
	PreexistingTaints []corev1.Taint `json:"preexistingTaints,omitempty"`

	// ownedTaints are the quarantine taints the policy named while the node
	// was out of service (by key and effect), other than preexisting ones.
	// gpuhealth removes a taint only when both this list, which only the
	// operator writes, and the Node's gpuhealth.dev/applied annotation,
	// which the node's own kubelet can also write, name it: a node may not
	// change its own taints, and cannot get gpuhealth to do it for it.
	// Kept until the node carries nothing of gpuhealth's.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=8
	OwnedTaints []corev1.Taint `json:"ownedTaints,omitempty"`

	// devices are the node's GPUs out of service alone (rules of scope
	// Device), while the node itself stays in service. A GPU back in
	// service has no entry.
	// +optional
	// +listType=map
	// +listMapKey=uuid
	// +kubebuilder:validation:MaxItems=64
	Devices []DeviceStatus `json:"devices,omitempty"`

	// devicesOut counts devices; kubectl get nodehealth shows it.
	// +optional
	// +kubebuilder:validation:Minimum=0
	DevicesOut int32 `json:"devicesOut,omitempty"`

	// history holds the most recent transitions, oldest first (at most 32).
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=32
	History []Transition `json:"history,omitempty"`

	// lastRequest is the last manual request the operator carried out.
	// +optional
	LastRequest *HandledRequest `json:"lastRequest,omitempty"`

	// approval is the destructive act the node waits to have approved, or
	// the last one approved or timed out (the policy's approval.actions).
	// +optional
	Approval *ApprovalStatus `json:"approval,omitempty"`

	// observedGeneration is the spec generation the status reflects.
	// +optional
	// +kubebuilder:validation:Minimum=0
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// conditions are the node's conditions, such as GPUHealthy and Drained.
	// +optional
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=16
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// NodeHealth is where one managed node stands in gpuhealth's state machine
// (Healthy → Quarantined → Draining → Recertifying → Healthy, or Failed; a
// new node Certifying → Healthy). Its
// name is the node's name. Its spec holds a human's manual controls.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,shortName=nh,categories=gpuhealth
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.reason`
// +kubebuilder:printcolumn:name="ComputeDomain",type=string,JSONPath=`.status.computeDomain.name`
// +kubebuilder:printcolumn:name="Clique",type=string,JSONPath=`.status.computeDomain.cliqueID`
// +kubebuilder:printcolumn:name="Attempt",type=integer,JSONPath=`.status.recertification.attempt`
// +kubebuilder:printcolumn:name="GPUs Out",type=integer,JSONPath=`.status.devicesOut`
// +kubebuilder:printcolumn:name="Certified",type=date,JSONPath=`.status.certificate.time`
// +kubebuilder:printcolumn:name="Since",type=date,JSONPath=`.status.since`
// +kubebuilder:printcolumn:name="Message",type=string,JSONPath=`.status.message`,priority=1
type NodeHealth struct {
	metav1.TypeMeta `json:",inline"`

	// metadata is the standard object metadata; the name is the node's name.
	// +optional
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec holds a human's manual controls over the node.
	// +optional
	Spec NodeHealthSpec `json:"spec,omitempty"`

	// status is where the node stands.
	// +optional
	Status NodeHealthStatus `json:"status,omitempty"`
}

// NodeHealthList is a list of NodeHealths.
//
// +kubebuilder:object:root=true
type NodeHealthList struct {
	metav1.TypeMeta `json:",inline"`
	// metadata is the standard list metadata.
	// +optional
	metav1.ListMeta `json:"metadata,omitempty"`
	// items are the NodeHealths.
	Items []NodeHealth `json:"items"`
}

// ApprovalState is where an approval stands.
// +kubebuilder:validation:Enum=Waiting;Approved;TimedOut
type ApprovalState string

const (
	// ApprovalWaiting is an act that waits for a request Approve.
	ApprovalWaiting ApprovalState = "Waiting"
	// ApprovalApproved is an act a request Approve let go ahead.
	ApprovalApproved ApprovalState = "Approved"
	// ApprovalTimedOut is an act nobody approved within the policy's
	// timeout, carried out because its onTimeout is Proceed.
	ApprovalTimedOut ApprovalState = "TimedOut"
)

// ApprovalStatus is one destructive act's approval.
type ApprovalStatus struct {
	// action is the act: ResetGPU, RebootNode or ReplaceNode.
	// +required
	Action Action `json:"action"`

	// subject is the act's occasion, such as "recertification attempt 2
	// (started 2026-12-04T10:00:00Z)"; an approval holds for its subject
	// only.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=256
	Subject string `json:"subject"`

	// state is Waiting, Approved or TimedOut.
	// +required
	State ApprovalState `json:"state"`

	// since is when the node started waiting.
	// +required
	Since metav1.Time `json:"since"`

	// by names who approved: the request's requestedBy and the field
	// manager that wrote it.
	// +optional
	// +kubebuilder:validation:MaxLength=512
	By string `json:"by,omitempty"`

	// reason is the approver's reason.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	Reason string `json:"reason,omitempty"`

	// time is when the act was approved or the wait timed out.
	// +optional
	Time *metav1.Time `json:"time,omitempty"`
}
