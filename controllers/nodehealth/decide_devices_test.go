package nodehealth

import (
	"testing"
	"time"

	. "github.com/onsi/gomega"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/remediation/devicetaint"
	"github.com/gpuhealth/gpuhealth/remediation/drain"
	"github.com/gpuhealth/gpuhealth/remediation/fsm"
	"github.com/gpuhealth/gpuhealth/remediation/job"
)

// The one-GPU workflow's rows: every device transition and every reason a
// finding of scope Device is handled on the node instead.

// perGPU makes XID 48 a finding of scope Device (ResetGPU), with a test Job.
func perGPU(o *observation) {
	o.policy.Spec.Rules = []gpuhealthv1alpha1.Rule{{Name: "per-gpu", Match: gpuhealthv1alpha1.RuleMatch{Codes: []string{"48", "79"}},
		Verdict: gpuhealthv1alpha1.VerdictQuarantine, Scope: gpuhealthv1alpha1.ScopeDevice}}
	o.policy.Spec.Devices = &gpuhealthv1alpha1.DeviceQuarantineSpec{Job: &gpuhealthv1alpha1.JobTemplate{Image: "devcert"}}
}

// onGPU names GPU uuid in the finding.
func onGPU(uuid string) func(*gpuhealthv1alpha1.NodeHealthEvent) {
	return func(e *gpuhealthv1alpha1.NodeHealthEvent) {
		e.Spec.Code, e.Spec.Component.ID = "48", uuid
		e.Name = "n-xid-48-" + uuid
	}
}

// published: NVIDIA's driver publishes GPU-0…GPU-7 of node n as gpu-0…7,
// the breaker is closed and the budget has room.
func published(o *observation) {
	o.devices = &observedDevices{found: map[string]devicetaint.Device{}, missing: map[string]string{},
		rules: map[string]*resourcev1.DeviceTaintRule{}, drained: map[string]*drainPass{},
		breaker: &breakerView{allowed: true, message: "closed"}, budget: &deviceBudget{limit: 10}}
	for i := range 8 {
		uuid := "GPU-" + string(rune('0'+i))
		if findingNames(o, uuid) {
			o.devices.found[uuid] = devicetaint.Device{Driver: "gpu.nvidia.com", Pool: "n", Name: "gpu-" + string(rune('0'+i)), Node: "n", UUID: uuid}
		}
	}
}

func findingNames(o *observation, uuid string) bool {
	for _, f := range o.findings {
		if f.Spec.Component.ID == uuid {
			return true
		}
	}
	return false
}

// gpuOut puts GPU-i out alone in phase, since a minute ago, with its
// finding's name and its rule in the cache.
func gpuOut(i int, phase gpuhealthv1alpha1.DevicePhase) func(*observation) {
	return func(o *observation) {
		uuid, name := "GPU-"+string(rune('0'+i)), "gpu-"+string(rune('0'+i))
		since := metav1.NewTime(t0.Add(-time.Minute))
		e := gpuhealthv1alpha1.DeviceStatus{UUID: uuid, Driver: "gpu.nvidia.com", Pool: "n", Device: name, Phase: phase, Since: since, OutSince: since,
			Class: "xid-48", Rule: devicetaint.RuleName("n", name), Findings: []string{"n-xid-48-" + uuid}}
		if phase == gpuhealthv1alpha1.DeviceRecertifying {
			e.Attempt, e.AttemptStartedAt = 1, &since
		}
		o.nh.Status.Devices = append(o.nh.Status.Devices, e)
		if o.devices == nil {
			published(o)
		}
		dev := devicetaint.Device{Driver: "gpu.nvidia.com", Pool: "n", Name: name, Node: "n", UUID: uuid}
		o.devices.found[uuid] = dev
		o.devices.rules[e.Rule] = devicetaint.Rule(dev, resourcev1.DeviceTaintEffectNoSchedule, "xid-48")
	}
}

// deviceJob adds the last GPU out's test Job of its attempt with result.
func deviceJob(attempt int32, result gpuhealthv1alpha1.JobResult) func(*observation) {
	return func(o *observation) {
		e := &o.nh.Status.Devices[len(o.nh.Status.Devices)-1]
		e.Attempt = attempt
		dev := job.Device{Node: "n", Name: e.Device, UUID: e.UUID, Driver: e.Driver}
		j := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: job.DeviceName(job.DeviceRecertification, dev, attempt, e.AttemptStartedAt.Time), Namespace: o.namespace}}
		switch result {
		case gpuhealthv1alpha1.JobSucceeded:
			j.Status.Conditions = []batchv1.JobCondition{{Type: batchv1.JobComplete, Status: corev1.ConditionTrue}}
		case gpuhealthv1alpha1.JobFailed:
			j.Status.Conditions = []batchv1.JobCondition{{Type: batchv1.JobFailed, Status: corev1.ConditionTrue, Message: "exit 1"}}
		default:
			j.Status.Active = 1
		}
		o.jobs[j.Name] = j
	}
}

func ruleActs(p *plan) []*resourcev1.DeviceTaintRule {
	var out []*resourcev1.DeviceTaintRule
	for _, a := range p.deviceActs {
		if a.rule != nil {
			out = append(out, a.rule)
		}
	}
	return out
}

func deviceJudgement(p *plan, uuid string) judgement {
	for _, j := range p.judged {
		if j.event.Spec.Component.ID == uuid {
			return j
		}
	}
	return judgement{}
}

func TestDecideDevices(t *testing.T) {
	rows := []row{
		{"an XID 48 of scope Device on a published GPU: the GPU alone is quarantined, the node stays in service",
			obs(perGPU, finding(onGPU("GPU-3")), published, breakerClosed), func(g *WithT, p *plan) {
				g.Expect(p.node).To(BeElementOf(nodeUnchanged, nodeInService), "no cordon, no taint")
				g.Expect(p.status.Phase).To(Equal(healthy))
				g.Expect(p.status.Devices).To(HaveLen(1))
				e := p.status.Devices[0]
				g.Expect(e.Phase).To(Equal(gpuhealthv1alpha1.DeviceQuarantined))
				g.Expect(e.Device).To(Equal("gpu-3"))
				g.Expect(e.Rule).To(Equal("gpuhealth-n-gpu-3"))
				g.Expect(p.status.DevicesOut).To(BeEquivalentTo(1))
				rules := ruleActs(p)
				g.Expect(rules).To(HaveLen(1))
				sel := rules[0].Spec.DeviceSelector
				g.Expect([]string{*sel.Driver, *sel.Pool, *sel.Device}).To(Equal([]string{"gpu.nvidia.com", "n", "gpu-3"}))
				g.Expect(rules[0].Spec.Taint.Effect).To(Equal(resourcev1.DeviceTaintEffectNoSchedule))
				g.Expect(rules[0].Spec.Taint.Value).To(Equal("xid-48"))
				g.Expect(p.reserveDevices).To(Equal(1))
				g.Expect(p.reserveBreaker).To(BeFalse(), "the node's breaker is not asked")
				j := deviceJudgement(p, "GPU-3")
				g.Expect(j.counts).To(BeFalse())
				g.Expect(j.reason).To(ContainSubstring("handled on GPU gpu-3 alone"))
				c := meta.FindStatusCondition(p.status.Conditions, gpuhealthv1alpha1.NodeHealthDevicesOutOfServiceCondition)
				g.Expect(c.Status).To(Equal(metav1.ConditionTrue))
				g.Expect(c.Message).To(ContainSubstring("gpu-3 (GPU-3) Quarantined"))
				g.Expect(p.status.History[len(p.status.History)-1].Message).To(ContainSubstring("GPU gpu-3 (GPU-3): Healthy → Quarantined"))
				g.Expect(reasonsOf(p.announce)).To(ContainElement("Warning DeviceQuarantined"))
				g.Expect(p.deviceMoves).To(Equal([]deviceStepRecord{{from: fsm.DeviceHealthy, to: gpuhealthv1alpha1.DeviceQuarantined}}))
			}},
		{"quarantined, its rule in the cache: the GPU drains",
			obs(perGPU, finding(onGPU("GPU-0")), gpuOut(0, gpuhealthv1alpha1.DeviceQuarantined)), func(g *WithT, p *plan) {
				g.Expect(p.status.Devices[0].Phase).To(Equal(gpuhealthv1alpha1.DeviceDraining))
				g.Expect(p.status.Devices[0].Since.Time).To(Equal(t0))
				g.Expect(p.node).To(Equal(nodeInService))
				g.Expect(p.nodeMessage).To(Equal("no finding counts against the node; 1 GPU out of service alone: gpu-0 (Draining)"), "the Node's GPUHealthy names it")
				g.Expect(ruleActs(p)).To(BeEmpty(), "the rule is there")
			}},
		{"quarantined, its rule not in the cache yet: made again, and the GPU waits",
			obs(perGPU, finding(onGPU("GPU-0")), gpuOut(0, gpuhealthv1alpha1.DeviceQuarantined), func(o *observation) {
				o.devices.rules = map[string]*resourcev1.DeviceTaintRule{}
			}), func(g *WithT, p *plan) {
				g.Expect(p.status.Devices[0].Phase).To(Equal(gpuhealthv1alpha1.DeviceQuarantined))
				g.Expect(ruleActs(p)).To(HaveLen(1))
				g.Expect(p.requeue).To(Equal(deviceRuleRecheck))
			}},
		{"draining, two pods still hold the GPU: it waits and says so",
			obs(perGPU, finding(onGPU("GPU-0")), gpuOut(0, gpuhealthv1alpha1.DeviceDraining), func(o *observation) {
				o.devices.drained["GPU-0"] = &drainPass{result: drain.Result{Total: 2, Remaining: 2, Blocked: 1}}
			}), func(g *WithT, p *plan) {
				e := p.status.Devices[0]
				g.Expect(e.Phase).To(Equal(gpuhealthv1alpha1.DeviceDraining))
				g.Expect(e.PodsLeft).To(BeEquivalentTo(2))
				g.Expect(e.Message).To(ContainSubstring("2 pods hold the GPU, 1 blocked by a PodDisruptionBudget"))
				g.Expect(p.requeue).To(Equal(deviceDrainRecheck))
			}},
		{"drained: attempt 1 starts, its Job claiming the GPU by uuid",
			obs(perGPU, finding(onGPU("GPU-0")), gpuOut(0, gpuhealthv1alpha1.DeviceDraining), func(o *observation) {
				o.devices.drained["GPU-0"] = &drainPass{result: drain.Result{Total: 1}}
			}), func(g *WithT, p *plan) {
				e := p.status.Devices[0]
				g.Expect(e.Phase).To(Equal(gpuhealthv1alpha1.DeviceRecertifying))
				g.Expect(e.Attempt).To(BeEquivalentTo(1))
				var claims, jobs int
				for _, a := range p.deviceActs {
					if a.claim != nil {
						claims++
						sel := a.claim.Spec.Spec.Devices.Requests[0].Exactly.Selectors[0].CEL.Expression
						g.Expect(sel).To(Equal(`device.attributes["gpu.nvidia.com"].uuid == "GPU-0"`))
					}
					if a.job != nil {
						jobs++
						g.Expect(a.job.Labels[job.DeviceLabel]).To(Equal("gpu-0"))
						g.Expect(*a.job.Spec.Template.Spec.ResourceClaims[0].ResourceClaimTemplateName).To(Equal(a.claim.Name))
					}
				}
				g.Expect([]int{claims, jobs}).To(Equal([]int{1, 1}))
			}},
		{"the test passed: the GPU returns, its finding is closed, its rule goes after the write",
			obs(perGPU, finding(onGPU("GPU-0")), gpuOut(0, gpuhealthv1alpha1.DeviceRecertifying), deviceJob(1, gpuhealthv1alpha1.JobSucceeded)), func(g *WithT, p *plan) {
				g.Expect(p.status.Devices).To(BeEmpty())
				g.Expect(p.status.DevicesOut).To(BeZero())
				g.Expect(p.returnDevices).To(HaveLen(1))
				g.Expect(p.returnDevices[0].Rule).To(Equal("gpuhealth-n-gpu-0"))
				g.Expect(deviceJudgement(p, "GPU-0").event.Status.Phase).To(Equal(gpuhealthv1alpha1.EventSuperseded))
				g.Expect(p.node).To(BeElementOf(nodeUnchanged, nodeInService))
				g.Expect(reasonsOf(p.announce)).To(ContainElement("Normal DeviceReturned"))
				g.Expect(meta.IsStatusConditionTrue(p.status.Conditions, gpuhealthv1alpha1.NodeHealthDevicesOutOfServiceCondition)).To(BeFalse())
			}},
		{"the test failed in attempt 1 of 2: attempt 2",
			obs(perGPU, finding(onGPU("GPU-0")), gpuOut(0, gpuhealthv1alpha1.DeviceRecertifying), deviceJob(1, gpuhealthv1alpha1.JobFailed)), func(g *WithT, p *plan) {
				e := p.status.Devices[0]
				g.Expect(e.Phase).To(Equal(gpuhealthv1alpha1.DeviceRecertifying))
				g.Expect(e.Attempt).To(BeEquivalentTo(2))
				g.Expect(e.AttemptStartedAt.Time).To(Equal(t0.Add(defaultDeviceBackoff)), "after the backoff")
				g.Expect(p.requeue).To(Equal(defaultDeviceBackoff))
			}},
		{"attempt 2 within its backoff: no Job yet",
			obs(perGPU, finding(onGPU("GPU-0")), gpuOut(0, gpuhealthv1alpha1.DeviceRecertifying), func(o *observation) {
				e := &o.nh.Status.Devices[0]
				e.Attempt, e.AttemptStartedAt = 2, &metav1.Time{Time: t0.Add(30 * time.Second)}
			}), func(g *WithT, p *plan) {
				g.Expect(p.deviceActs).To(BeEmpty())
				g.Expect(p.status.Devices[0].Message).To(ContainSubstring("after the backoff"))
				g.Expect(p.requeue).To(Equal(30 * time.Second))
			}},
		{"the test failed in the last attempt: Failed, still tainted",
			obs(perGPU, finding(onGPU("GPU-0")), gpuOut(0, gpuhealthv1alpha1.DeviceRecertifying), deviceJob(2, gpuhealthv1alpha1.JobFailed)), func(g *WithT, p *plan) {
				e := p.status.Devices[0]
				g.Expect(e.Phase).To(Equal(gpuhealthv1alpha1.DeviceFailed))
				g.Expect(p.returnDevices).To(BeEmpty())
				g.Expect(reasonsOf(p.announce)).To(ContainElement("Warning DeviceFailed"))
				g.Expect(meta.FindStatusCondition(p.status.Conditions, gpuhealthv1alpha1.NodeHealthDevicesOutOfServiceCondition).Message).To(ContainSubstring("gpu-0 (GPU-0) Failed"))
				g.Expect(p.node).To(BeElementOf(nodeUnchanged, nodeInService))
			}},
		{"a RebootNode finding of scope Device: the node is quarantined, saying why",
			obs(perGPU, finding(func(e *gpuhealthv1alpha1.NodeHealthEvent) { e.Spec.Code = "79" }), published, breakerClosed), func(g *WithT, p *plan) {
				g.Expect(p.node).To(Equal(nodeFence))
				g.Expect(p.status.Devices).To(BeEmpty())
				g.Expect(deviceJudgement(p, "GPU-0").reason).To(ContainSubstring("handled on the node: its action RebootNode needs the node"))
			}},
		{"a GPU no DRA driver publishes: the node is quarantined, saying why",
			obs(perGPU, finding(onGPU("GPU-5")), published, breakerClosed, func(o *observation) {
				delete(o.devices.found, "GPU-5")
				o.devices.missing["GPU-5"] = "GPU GPU-5 is not published by DRA driver gpu.nvidia.com on the node"
			}), func(g *WithT, p *plan) {
				g.Expect(p.node).To(Equal(nodeFence))
				g.Expect(deviceJudgement(p, "GPU-5").reason).To(ContainSubstring("not published by DRA driver"))
			}},
		{"a second GPU with maxDevicesPerNode 1: the node is quarantined, the first GPU's rule stays",
			obs(perGPU, finding(onGPU("GPU-0")), finding(onGPU("GPU-1")), gpuOut(0, gpuhealthv1alpha1.DeviceFailed), breakerClosed, func(o *observation) {
				o.policy.Spec.Devices.MaxDevicesPerNode = 1
				o.devices.found["GPU-1"] = devicetaint.Device{Driver: "gpu.nvidia.com", Pool: "n", Name: "gpu-1", Node: "n", UUID: "GPU-1"}
			}), func(g *WithT, p *plan) {
				g.Expect(p.node).To(Equal(nodeFence))
				g.Expect(p.status.Devices).To(HaveLen(1))
				g.Expect(deviceJudgement(p, "GPU-1").reason).To(ContainSubstring("2 of its GPUs would be out of service, more than devices.maxDevicesPerNode 1"))
				g.Expect(deviceJudgement(p, "GPU-0").counts).To(BeFalse(), "the GPU out already stays out alone")
				g.Expect(reasonsOf(p.announce)).To(ContainElement("Warning DeviceEscalated"))
			}},
		{"a finding of scope Device on a node out of service: the node's workflow has it, the GPUs out wait",
			obs(perGPU, inPhase(draining), fenced, finding(onGPU("GPU-2")), gpuOut(1, gpuhealthv1alpha1.DeviceDraining), func(o *observation) {
				o.devices.found["GPU-2"] = devicetaint.Device{Driver: "gpu.nvidia.com", Pool: "n", Name: "gpu-2", Node: "n", UUID: "GPU-2"}
				o.drain = &drainPass{result: drain.Result{Total: 1, Remaining: 1}}
			}), func(g *WithT, p *plan) {
				g.Expect(deviceJudgement(p, "GPU-2").counts).To(BeTrue())
				g.Expect(deviceJudgement(p, "GPU-2").reason).To(ContainSubstring("the node is out of service already"))
				g.Expect(p.status.Devices).To(HaveLen(1))
				g.Expect(p.status.Devices[0].Phase).To(Equal(gpuhealthv1alpha1.DeviceDraining))
			}},
		{"the node already out because of it: the finding keeps saying maxDevicesPerNode, no Event again",
			obs(perGPU, inPhase(quarantined), fenced, room, finding(onGPU("GPU-0")), finding(onGPU("GPU-1")), gpuOut(0, gpuhealthv1alpha1.DeviceDraining), func(o *observation) {
				o.policy.Spec.Devices.MaxDevicesPerNode = 1
				o.devices.found["GPU-1"] = devicetaint.Device{Driver: "gpu.nvidia.com", Pool: "n", Name: "gpu-1", Node: "n", UUID: "GPU-1"}
			}), func(g *WithT, p *plan) {
				g.Expect(deviceJudgement(p, "GPU-1").reason).To(ContainSubstring("more than devices.maxDevicesPerNode 1"))
				g.Expect(deviceJudgement(p, "GPU-1").counts).To(BeTrue())
				g.Expect(deviceJudgement(p, "GPU-0").reason).To(ContainSubstring("the node is out of service already"))
				g.Expect(reasonsOf(p.announce)).NotTo(ContainElement("Warning DeviceEscalated"))
			}},
		{"the device breaker is open: the GPU stays in service, the condition says why",
			obs(perGPU, finding(onGPU("GPU-3")), published, func(o *observation) {
				o.devices.breaker = &breakerView{allowed: false, message: "open: 40 GPUs in 10m0s"}
			}), func(g *WithT, p *plan) {
				g.Expect(p.status.Devices).To(BeEmpty())
				g.Expect(p.node).To(BeElementOf(nodeUnchanged, nodeInService))
				c := meta.FindStatusCondition(p.status.Conditions, gpuhealthv1alpha1.NodeHealthDevicesOutOfServiceCondition)
				g.Expect(c.Reason).To(Equal(gpuhealthv1alpha1.ReasonDeviceHeld))
				g.Expect(c.Message).To(ContainSubstring("device circuit breaker open: 40 GPUs"))
			}},
		{"maxUnavailableDevices is full: the GPU stays in service",
			obs(perGPU, finding(onGPU("GPU-3")), published, func(o *observation) { o.devices.budget = &deviceBudget{limit: 4, out: 4} }), func(g *WithT, p *plan) {
				g.Expect(p.status.Devices).To(BeEmpty())
				g.Expect(meta.FindStatusCondition(p.status.Conditions, gpuhealthv1alpha1.NodeHealthDevicesOutOfServiceCondition).Message).
					To(ContainSubstring("budget maxUnavailableDevices allows 4 GPUs out, 4 are"))
			}},
		{"dry run: a None rule, and what it would have evicted is reported",
			obs(perGPU, dryRun, finding(onGPU("GPU-0")), gpuOut(0, gpuhealthv1alpha1.DeviceQuarantined), func(o *observation) {
				r := o.devices.rules["gpuhealth-n-gpu-0"]
				r.Spec.Taint.Effect = resourcev1.DeviceTaintEffectNone
				r.Generation = 1
				r.Status.Conditions = []metav1.Condition{{Type: resourcev1.DeviceTaintConditionEvictionInProgress, Status: metav1.ConditionFalse, ObservedGeneration: 1,
					Reason: "NoEffect", Message: "1 published devices selected. 1 allocated devices selected. 3 pods would be evicted in 1 namespace(s) if the effect was NoExecute."}}
			}), func(g *WithT, p *plan) {
				e := p.status.Devices[0]
				g.Expect(e.Phase).To(Equal(gpuhealthv1alpha1.DeviceQuarantined), "a dry run never drains")
				g.Expect(*e.WouldEvict).To(BeEquivalentTo(3))
				g.Expect(ruleActs(p)).To(BeEmpty(), "the None rule is as wanted")
			}},
		{"NoExecute policy past the drain timeout: the rule's effect becomes NoExecute",
			obs(perGPU, finding(onGPU("GPU-0")), gpuOut(0, gpuhealthv1alpha1.DeviceDraining), func(o *observation) {
				o.policy.Spec.Devices.Effect = gpuhealthv1alpha1.DeviceNoExecute
				o.policy.Spec.Drain.Timeout = dur("30m")
				o.nh.Status.Devices[0].Since = metav1.NewTime(t0.Add(-31 * time.Minute))
				o.devices.drained["GPU-0"] = &drainPass{result: drain.Result{Total: 1, Remaining: 1, Blocked: 1}}
			}), func(g *WithT, p *plan) {
				rules := ruleActs(p)
				g.Expect(rules).To(HaveLen(1))
				g.Expect(rules[0].Spec.Taint.Effect).To(Equal(resourcev1.DeviceTaintEffectNoExecute))
			}},
		{"NoExecute policy within the drain timeout: still NoSchedule, the Eviction API has its chance",
			obs(perGPU, finding(onGPU("GPU-0")), gpuOut(0, gpuhealthv1alpha1.DeviceDraining), func(o *observation) {
				o.policy.Spec.Devices.Effect = gpuhealthv1alpha1.DeviceNoExecute
				o.policy.Spec.Drain.Timeout = dur("30m")
				o.devices.drained["GPU-0"] = &drainPass{result: drain.Result{Total: 1, Remaining: 1, Blocked: 1}}
			}), func(g *WithT, p *plan) {
				g.Expect(ruleActs(p)).To(BeEmpty())
				g.Expect(p.requeue).To(Equal(deviceDrainRecheck))
			}},
		{"a human uncordons a quarantined node: its GPUs out alone return with it",
			obs(perGPU, inPhase(quarantined), fenced, finding(onGPU("GPU-0")), gpuOut(0, gpuhealthv1alpha1.DeviceFailed), func(o *observation) {
				o.uncordonedBy = "alice"
				o.node.Spec.Unschedulable = false
			}), func(g *WithT, p *plan) {
				g.Expect(p.status.Phase).To(Equal(healthy))
				g.Expect(p.status.Devices).To(BeEmpty())
				g.Expect(p.returnDevices).To(HaveLen(1))
				g.Expect(reasonsOf(p.announce)).To(ContainElement("Normal DeviceReleased"))
			}},
	}
	for _, r := range rows {
		t.Run(r.name, func(t *testing.T) {
			r.check(NewWithT(t), decide(r.obs))
		})
	}
}

func TestDeviceMachine(t *testing.T) {
	g := NewWithT(t)
	m, err := fsm.NewDevice("")
	g.Expect(err).NotTo(HaveOccurred())
	for _, step := range []struct {
		ev fsm.DeviceEvent
		to gpuhealthv1alpha1.DevicePhase
	}{
		{fsm.DeviceQuarantine, gpuhealthv1alpha1.DeviceQuarantined},
		{fsm.DeviceDrain, gpuhealthv1alpha1.DeviceDraining},
		{fsm.DeviceRecertify, gpuhealthv1alpha1.DeviceRecertifying},
		{fsm.DeviceRetry, gpuhealthv1alpha1.DeviceRecertifying},
		{fsm.DeviceFail, gpuhealthv1alpha1.DeviceFailed},
		{fsm.DeviceRelease, fsm.DeviceHealthy},
	} {
		_, to, err := m.Fire(t.Context(), step.ev)
		g.Expect(err).NotTo(HaveOccurred(), string(step.ev))
		g.Expect(to).To(Equal(step.to))
	}
	_, _, err = m.Fire(t.Context(), fsm.DevicePass)
	g.Expect(err).To(MatchError(ContainSubstring("not allowed in phase Healthy")))
	_, err = fsm.NewDevice("Rebooting")
	g.Expect(err).To(HaveOccurred())
}

// A node's kubelet may write nvidia.com/gpu.count on its own Node: what
// one node claims must not size the limits that protect the others
// without bound.
func TestManagedGPUsCapsWhatANodeClaims(t *testing.T) {
	for _, tc := range []struct {
		name  string
		count map[string]string
		want  int
	}{
		{name: "a label is taken as it says", count: map[string]string{"a": "4", "b": "8"}, want: 12},
		{name: "no label or a bad one counts as 8", count: map[string]string{"a": "", "b": "lots", "c": "-3"}, want: 24},
		{name: "a huge claim counts as 16", count: map[string]string{"a": "100000", "b": "8"}, want: 24},
	} {
		t.Run(tc.name, func(t *testing.T) {
			managed := map[string]map[string]string{}
			for node, c := range tc.count {
				managed[node] = map[string]string{}
				if c != "" {
					managed[node][gpusPerNodeLabel] = c
				}
			}
			if got := managedGPUs(managed); got != tc.want {
				t.Errorf("managedGPUs = %d, want %d", got, tc.want)
			}
		})
	}
}
