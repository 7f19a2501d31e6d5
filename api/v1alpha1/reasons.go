package v1alpha1

import corev1 "k8s.io/api/core/v1"

// Reasons used in NodeHealth status, history, conditions and Events, and
// on the Events gpuhealth publishes. They are CamelCase words; messages
// carry the detail.
const (
	// ReasonManaged: the node is managed by a RemediationPolicy.
	ReasonManaged = "Managed"
	// ReasonExcluded: spec.exclude keeps gpuhealth away from the node.
	ReasonExcluded = "Excluded"
	// ReasonNotSelected: no RemediationPolicy selects the node any more
	// (its labels changed, or its policy was deleted).
	ReasonNotSelected = "NotSelected"
	// ReasonHealthy: no finding counts against the node.
	ReasonHealthy = "Healthy"
	// ReasonFault: a finding that quarantines the node arrived.
	ReasonFault = "Fault"
	// ReasonDryRun: the policy is in dry-run; gpuhealth only records.
	ReasonDryRun = "DryRun"
	// ReasonHeld: spec.hold keeps the node where it is.
	ReasonHeld = "Held"
	// ReasonWaitingForBudget: a budget has no room for another node.
	ReasonWaitingForBudget = "WaitingForBudget"
	// ReasonDraining: pods are being evicted.
	ReasonDraining = "Draining"
	// ReasonBlockedByPDB: a PodDisruptionBudget refuses an eviction.
	ReasonBlockedByPDB = "BlockedByPDB"
	// ReasonForceDeleted: a pod outlived its DeleteAfterTimeout and was deleted.
	ReasonForceDeleted = "ForceDeleted"
	// ReasonNeedsHuman: the findings recommend ContactSupport or ReplaceNode.
	ReasonNeedsHuman = "NeedsHuman"
	// ReasonRemediating: a reset or reboot Job runs.
	ReasonRemediating = "Remediating"
	// ReasonRecertifying: the recertification Job runs.
	ReasonRecertifying = "Recertifying"
	// ReasonSoaking: recertification passed; the soak window runs.
	ReasonSoaking = "Soaking"
	// ReasonWaitingForResolution: recertification passed; condition findings have not cleared.
	ReasonWaitingForResolution = "WaitingForResolution"
	// ReasonRecertified: the node passed recertification and returned.
	ReasonRecertified = "Recertified"
	// ReasonRecertificationFailed: an attempt failed; another follows.
	ReasonRecertificationFailed = "RecertificationFailed"
	// ReasonRecertificationExhausted: the last attempt failed.
	ReasonRecertificationExhausted = "RecertificationExhausted"
	// ReasonBackoff: waiting between recertification attempts.
	ReasonBackoff = "Backoff"
	// ReasonHumanUncordon: a human uncordoned the node, cancelling the workflow.
	ReasonHumanUncordon = "HumanUncordon"
	// ReasonManualRelease: a human released the node without recertification.
	ReasonManualRelease = "ManualRelease"
	// ReasonCircuitBreakerOpen: too many nodes entered quarantine; new quarantines wait.
	ReasonCircuitBreakerOpen = "CircuitBreakerOpen"
	// ReasonManualRecertify: a human asked for recertification.
	ReasonManualRecertify = "ManualRecertify"
	// ReasonMaintenance: a human asked for planned maintenance; the node is
	// drained under the budgets and held until a Recertify or Release.
	ReasonMaintenance = "Maintenance"
	// ReasonHandedOff: a failed node was handed to the system that replaces
	// nodes (policy remediation.handOff).
	ReasonHandedOff = "HandedOff"
	// ReasonHandOffFailed: the hand-off could not be made (no Machine, a
	// template that does not render); the node stays Failed for a human.
	ReasonHandOffFailed = "HandOffFailed"
	// ReasonRebooted: the reboot step saw the node come back with a new boot ID.
	ReasonRebooted = "Rebooted"
	// ReasonJobsDeleted: the node's unfinished remediation and recertification Jobs were deleted.
	ReasonJobsDeleted = "JobsDeleted"
	// ReasonDrainTimedOut: pods that must leave were still on the node past the drain timeout.
	ReasonDrainTimedOut = "DrainTimedOut"
	// ReasonDrainOnTime: the drain is within its timeout, or no pod outlived it.
	ReasonDrainOnTime = "DrainOnTime"
	// ReasonCertifying: a new node's certification suite runs.
	ReasonCertifying = "Certifying"
	// ReasonCertified: the node passed its certification suite.
	ReasonCertified = "Certified"
	// ReasonNotCertified: the node ran workloads when gpuhealth first
	// managed it; its next recertification certifies it.
	ReasonNotCertified = "NotCertified"
	// ReasonCertificationFailed: a certification attempt failed; another follows.
	ReasonCertificationFailed = "CertificationFailed"
	// ReasonCertificationExhausted: the last certification attempt failed.
	ReasonCertificationExhausted = "CertificationExhausted"
	// ReasonCertificationRequested: a human labelled the node gpuhealth.dev/certify.
	ReasonCertificationRequested = "CertificationRequested"
	// ReasonCertificationRefused: a gpuhealth.dev/certify label asked to
	// certify a node that runs workloads; it is not acted on.
	ReasonCertificationRefused = "CertificationRefused"
	// ReasonUncertifiedTaintRemoved: a human removed the uncertified taint, cancelling certification.
	ReasonUncertifiedTaintRemoved = "UncertifiedTaintRemoved"
	// ReasonStepPassed: a suite step passed.
	ReasonStepPassed = "StepPassed"
	// ReasonStepFailed: a suite step failed.
	ReasonStepFailed = "StepFailed"
	// ReasonDiagnosticsCollected: the diagnostics Job before a reset or
	// reboot finished; its log is kept.
	ReasonDiagnosticsCollected = "DiagnosticsCollected"
	// ReasonDiagnosticsFailed: the diagnostics Job failed or ran past its
	// timeout; the reset or reboot goes ahead.
	ReasonDiagnosticsFailed = "DiagnosticsFailed"
	// ReasonStepNotRun: a suite step's Job ended without its pod ever
	// running (not schedulable, its image not pulled, its deadline reached
	// first); it is tried again without spending an attempt.
	ReasonStepNotRun = "StepNotRun"
	// ReasonSuiteNotRun: a suite step never ran in maxNotRun tries. The
	// node is Failed for a human, and not handed off for replacement: the
	// cluster, not the GPU, kept the test from running.
	ReasonSuiteNotRun = "SuiteNotRun"
	// ReasonCliqueCertifying: the multi-node test of a clique whose fabric fault resolved runs.
	ReasonCliqueCertifying = "CliqueCertifying"
	// ReasonCliqueCertified: the clique passed its multi-node test; the fabric taint is lifted.
	ReasonCliqueCertified = "CliqueCertified"
	// ReasonCliqueCertificationFailed: the clique failed its multi-node test; the fabric taint stays.
	ReasonCliqueCertificationFailed = "CliqueCertificationFailed"
)

// NodeHealth condition types.
const (
	// NodeHealthManagedCondition says whether gpuhealth manages the node.
	NodeHealthManagedCondition = "Managed"
	// NodeHealthDrainTimedOutCondition is True while a draining node has
	// pods that must leave past the drain timeout and the policy's
	// drain.onTimeout is Wait. Named for the problem because it is alerted on.
	NodeHealthDrainTimedOutCondition = "DrainTimedOut"
	// NodeHealthDeadMemberListedCondition is True while a dead, fenced
	// ComputeDomain member is still listed by NVIDIA's driver, so that its
	// peers keep holding it. Named for the problem because it is alerted on.
	NodeHealthDeadMemberListedCondition = "DeadMemberListed"
	// NodeHealthCertifiedCondition says whether the node holds a
	// certificate (status.certificate): True once a certification or
	// recertification suite passed, False for a node that is not certified.
	NodeHealthCertifiedCondition = "Certified"
	// NodeHealthAwaitingApprovalCondition is True while the node's next act
	// waits for a human's approval (the policy's approval.actions). Named
	// for the wait because it is alerted on.
	NodeHealthAwaitingApprovalCondition = "AwaitingApproval"
)

// Reasons of the approval of destructive acts.
const (
	// ReasonAwaitingApproval: the node's next act waits for a request Approve.
	ReasonAwaitingApproval = "AwaitingApproval"
	// ReasonApproved: a request Approve let the act go ahead.
	ReasonApproved = "Approved"
	// ReasonApprovalTimedOut: nobody approved in time; the policy says proceed.
	ReasonApprovalTimedOut = "ApprovalTimedOut"
	// ReasonNotWaitingForApproval: nothing waits for approval any more.
	ReasonNotWaitingForApproval = "NotWaitingForApproval"
)

// Reasons of the ComputeDomain rules.
const (
	// ReasonLeavingComputeDomain: drained; the node waits to leave its ComputeDomain.
	ReasonLeavingComputeDomain = "LeavingComputeDomain"
	// ReasonComputeDomainLeft: the node left its ComputeDomain.
	ReasonComputeDomainLeft = "ComputeDomainLeft"
	// ReasonNotDraining: the drain that waited for the node to leave its ComputeDomain ended otherwise.
	ReasonNotDraining = "NotDraining"
	// ReasonComputeDomainLeaveStuck: the node did not leave its ComputeDomain within leaveTimeout.
	ReasonComputeDomainLeaveStuck = "ComputeDomainLeaveStuck"
	// ReasonMemberQuarantined: a ComputeDomain member was taken out of service (Event on the domain).
	ReasonMemberQuarantined = "MemberQuarantined"
	// ReasonMemberLeft: a member's last trace left the domain (Event on the domain).
	ReasonMemberLeft = "MemberLeft"
	// ReasonMemberWaitingForBudget: a quarantined member waits for a budget (Event on the domain).
	ReasonMemberWaitingForBudget = "MemberWaitingForBudget"
	// ReasonStaleDaemonPodDeleted: a dead member's daemon pod was deleted.
	ReasonStaleDaemonPodDeleted = "StaleDaemonPodDeleted"
	// ReasonDeadMemberStillListed: a dead member is still listed by the
	// driver (a clique or status.nodes entry) after its daemon pod went.
	ReasonDeadMemberStillListed = "DeadMemberStillListed"
	// ReasonDeadMemberLabelRemoved: the policy's releaseDeadMemberLabel
	// removed a dead member's ComputeDomain node label.
	ReasonDeadMemberLabelRemoved = "DeadMemberLabelRemoved"
	// ReasonNotDeadMember: the node is not a dead ComputeDomain member (any more).
	ReasonNotDeadMember = "NotDeadMember"
)

// RemediationPolicy conditions and the reasons on the policy.
const (
	// PolicyReadyCondition says whether the policy is valid and in effect.
	PolicyReadyCondition = "Ready"
	// ReasonValid: the policy's node selector parses.
	ReasonValid = "Valid"
	// ReasonInvalidSelector: the policy's node selector does not parse.
	ReasonInvalidSelector = "InvalidSelector"
	// ReasonJobRulesBreached: a Job template of the policy breaks the
	// install's Job rules (allowed images, service accounts, privileged
	// steps, literal environment), so gpuhealth does not act on the policy:
	// Ready=False on the policy, Managed=False on each node it selects.
	ReasonJobRulesBreached = "JobRulesBreached"
	// ReasonBudgetExhausted: quarantined nodes started waiting for the policy's maxUnavailable budget (Warning Event).
	ReasonBudgetExhausted = "BudgetExhausted"
	// ReasonBudgetAvailable: no node waits for the budget any more (Normal Event).
	ReasonBudgetAvailable = "BudgetAvailable"
)

// Reasons of the fabric-degraded clique taint (Events on the nodes).
const (
	// ReasonFabricDegraded: a clique's nodes were tainted fabric-degraded.
	ReasonFabricDegraded = "FabricDegraded"
	// ReasonFabricRecovered: the fabric-degraded taint was lifted.
	ReasonFabricRecovered = "FabricRecovered"
	// ReasonQuarantineHeld: a finding counts against the node, but its
	// quarantine is held back (circuit breaker open); the Node's
	// GPUHealthy is Unknown, neither a healthy GPU nor one being repaired.
	ReasonQuarantineHeld = "QuarantineHeld"
)

// GPUHealthyNodeCondition is the Node condition gpuhealth keeps: True while
// no finding counts against the node, False with the cause while it is out
// of service, Unknown with ReasonQuarantineHeld while a finding counts but
// gpuhealth holds the quarantine back (the circuit breaker is open). Other tools (schedulers, dashboards) read it.
const GPUHealthyNodeCondition corev1.NodeConditionType = "GPUHealthy"

// The one-GPU workflow (rules of scope Device): reasons of a device's
// status, of the node's history notes and of the Events on the Node.
const (
	// NodeHealthDevicesOutOfServiceCondition is True while some of the
	// node's GPUs are out of service alone (status.devices); its message
	// names them. The node itself stays in service.
	NodeHealthDevicesOutOfServiceCondition = "DevicesOutOfService"

	// ReasonDeviceQuarantined: a GPU was taken out of service alone; its
	// DeviceTaintRule keeps new work off it.
	ReasonDeviceQuarantined = "DeviceQuarantined"
	// ReasonDeviceDraining: the pods holding the GPU are being evicted.
	ReasonDeviceDraining = "DeviceDraining"
	// ReasonDeviceRecertifying: the GPU's reset and test run.
	ReasonDeviceRecertifying = "DeviceRecertifying"
	// ReasonDeviceReturned: the GPU passed and is back in service.
	ReasonDeviceReturned = "DeviceReturned"
	// ReasonDeviceFailed: the GPU failed its attempts and stays out.
	ReasonDeviceFailed = "DeviceFailed"
	// ReasonDeviceReleased: the GPU returned with its node, whose own
	// workflow covered it.
	ReasonDeviceReleased = "DeviceReleased"
	// ReasonDeviceHeld: a GPU's quarantine is held back (its breaker is
	// open, or its budget full).
	ReasonDeviceHeld = "DeviceQuarantineHeld"
	// ReasonDeviceEscalated: a finding of scope Device took the whole node
	// out; the message says why it could not be handled on its GPU alone.
	ReasonDeviceEscalated = "DeviceEscalated"
	// ReasonGangStopped: a drain stopped a gang whole (drain.gangs Gang):
	// every member, on every node, evicted in one wave. On the node and on
	// the gang's owner object.
	ReasonGangStopped = "GangStopped"
	// ReasonGangHeld: a gang's wave waits for a member's
	// PodDisruptionBudget; nothing of the gang is evicted until it allows
	// it or the drain times out.
	ReasonGangHeld = "GangHeld"
	// ReasonNoDevicesOut: every GPU of the node is in service.
	ReasonNoDevicesOut = "NoDevicesOut"
)
