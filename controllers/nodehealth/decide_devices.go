package nodehealth

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/remediation/devicetaint"
	"github.com/gpuhealth/gpuhealth/remediation/fsm"
	"github.com/gpuhealth/gpuhealth/remediation/job"
)

// Defaults of the one-GPU workflow, for a policy without spec.devices (or
// an older stored one without its defaulted fields).
const (
	defaultMaxDevicesPerNode = 2
	defaultDeviceTimeout     = 15 * time.Minute
	defaultDeviceAttempts    = 2
	defaultDeviceBackoff     = time.Minute
	// deviceDrainRecheck is how often a GPU's drain looks again when no
	// pod watch wakes it sooner.
	deviceDrainRecheck = 10 * time.Second
	// deviceRuleRecheck is how often a GPU waiting for its rule to show
	// in the cache looks again (the rule's watch wakes it sooner).
	deviceRuleRecheck = 5 * time.Second
)

// deviceSettings are the policy's devices with its defaults filled in.
type deviceSettings struct {
	gpuhealthv1alpha1.DeviceQuarantineSpec
	timeout, backoff time.Duration
}

func devicesOf(p *gpuhealthv1alpha1.RemediationPolicy) deviceSettings {
	var s deviceSettings
	if p.Spec.Devices != nil {
		s.DeviceQuarantineSpec = *p.Spec.Devices
	}
	if s.Driver == "" {
		s.Driver = devicetaint.DefaultDriver
	}
	if s.DeviceClassName == "" {
		s.DeviceClassName = devicetaint.DefaultDriver
	}
	if s.MaxDevicesPerNode <= 0 {
		s.MaxDevicesPerNode = defaultMaxDevicesPerNode
	}
	if s.MaxAttempts <= 0 {
		s.MaxAttempts = defaultDeviceAttempts
	}
	if s.Effect == "" {
		s.Effect = gpuhealthv1alpha1.DeviceNoSchedule
	}
	s.timeout = s.Timeout.Get(defaultDeviceTimeout)
	s.backoff = s.Backoff.Get(defaultDeviceBackoff)
	return s
}

// ruleEffect is the effect a GPU's rule has: None under a dry run (the
// rule's status then counts what NoExecute would evict), NoExecute only
// once the Eviction API had its chance for the whole drain timeout, and
// NoSchedule otherwise.
func ruleEffect(dryRun, noExecuteNow bool) resourcev1.DeviceTaintEffect {
	switch {
	case dryRun:
		return resourcev1.DeviceTaintEffectNone
	case noExecuteNow:
		return resourcev1.DeviceTaintEffectNoExecute
	}
	return resourcev1.DeviceTaintEffectNoSchedule
}

// deviceAct is what apply does for one GPU: make or update its rule, and
// create its Job with the ResourceClaimTemplate the Job's pod claims the
// GPU through.
type deviceAct struct {
	rule  *resourcev1.DeviceTaintRule
	claim *resourcev1.ResourceClaimTemplate
	job   *batchv1.Job
}

// deviceStepRecord is a GPU's move, for the metrics once written.
type deviceStepRecord struct {
	from, to fsm.DevicePhase
}

// nodeScopeReason says why a counting finding of scope Device is handled
// on its node, "" when it can be handled on its GPU alone. Pure.
func nodeScopeReason(j *judgement, o *observation) string {
	s := &j.event.Spec
	switch {
	case s.Component.Kind != gpuhealthv1alpha1.ComponentGPU:
		return fmt.Sprintf("the finding is about %s %s, not one GPU", s.Component.Kind, componentName(s.Component))
	case j.action == gpuhealthv1alpha1.ActionRebootNode || needsHuman(j.action):
		return fmt.Sprintf("its action %s needs the node", j.action)
	case o.devices == nil:
		return "the GPU's DRA driver was not read"
	}
	if why, missing := o.devices.missing[s.Component.ID]; missing {
		return why
	}
	if _, ok := o.devices.found[s.Component.ID]; !ok {
		return "the GPU was not looked up in its DRA driver's ResourceSlices"
	}
	return ""
}

// deviceFindings sorts the counting findings of scope Device: those of a
// GPU handled alone stop counting against the node (their judgement says
// so), by UUID; the others stay and say why. A GPU more than
// maxDevicesPerNode takes the node out, with every finding of the GPUs not
// out yet; while the node is out, every such finding counts against it
// (the reason a GPU could not be handled alone is said first, so it stays
// on the finding once the node is out). Pure.
func (d *decider) deviceFindings(nodeInService bool) map[string][]int {
	o, st, s := d.o, &d.p.status, devicesOf(d.o.policy)
	byUUID := map[string][]int{}
	for i := range d.p.judged {
		j := &d.p.judged[i]
		if !j.counts || j.scope != gpuhealthv1alpha1.ScopeDevice {
			continue
		}
		if why := nodeScopeReason(j, o); why != "" {
			j.reason += "; scope Device, handled on the node: " + why
			continue
		}
		byUUID[j.event.Spec.Component.ID] = append(byUUID[j.event.Spec.Component.ID], i)
	}
	out := len(st.Devices)
	var fresh []string
	for uuid := range byUUID {
		if !slices.ContainsFunc(st.Devices, func(e gpuhealthv1alpha1.DeviceStatus) bool { return e.UUID == uuid }) {
			fresh = append(fresh, uuid)
		}
	}
	if n := out + len(fresh); len(fresh) > 0 && n > int(s.MaxDevicesPerNode) {
		why := fmt.Sprintf("%d of its GPUs would be out of service, more than devices.maxDevicesPerNode %d", n, s.MaxDevicesPerNode)
		for _, uuid := range fresh {
			for _, i := range byUUID[uuid] {
				d.p.judged[i].reason += "; scope Device, handled on the node: " + why
			}
			delete(byUUID, uuid)
		}
		if nodeInService {
			d.nodeEvent(corev1.EventTypeWarning, gpuhealthv1alpha1.ReasonDeviceEscalated, "Quarantine", "the node is taken out of service whole: %s", why)
		}
	}
	if !nodeInService {
		// The node's own workflow covers every GPU, those out alone too.
		for uuid, is := range byUUID {
			for _, i := range is {
				d.p.judged[i].reason += "; scope Device, handled on the node: the node is out of service already"
			}
			delete(byUUID, uuid)
		}
	}
	for uuid, is := range byUUID {
		name := o.devices.found[uuid].Name
		for _, i := range is {
			j := &d.p.judged[i]
			j.counts, j.device = false, uuid
			j.reason += "; handled on GPU " + name + " alone (scope Device)"
		}
	}
	for i := range d.p.judged {
		// The finding's classification says where it is handled.
		if j := &d.p.judged[i]; j.scope == gpuhealthv1alpha1.ScopeDevice {
			j.event.Status.Classification = j.classification(o.policy.Name)
		}
	}
	return byUUID
}

// devices runs the one-GPU workflow of each GPU out of service alone, and
// takes out those a finding newly names, while the node itself is in
// service: a node out of service is handled whole, and its GPUs wait where
// they are (their rules stay). Each GPU moves by its own state machine
// (fsm.DeviceMachine); every move is a note in the node's history and an
// Event.
func (d *decider) devices() {
	st := &d.p.status
	nodeInService := d.machine.Phase() == gpuhealthv1alpha1.PhaseHealthy
	byUUID := d.deviceFindings(nodeInService)
	if !nodeInService {
		d.devicesCondition()
		return
	}
	uuids := make([]string, 0, len(byUUID)+len(st.Devices))
	for _, e := range st.Devices {
		uuids = append(uuids, e.UUID)
	}
	for uuid := range byUUID {
		if !slices.Contains(uuids, uuid) {
			uuids = append(uuids, uuid)
		}
	}
	sort.Strings(uuids)
	for _, uuid := range uuids {
		d.device(uuid, byUUID[uuid])
	}
	d.devicesCondition()
}

// device moves one GPU as far as it goes in this pass.
func (d *decider) device(uuid string, findings []int) {
	st := &d.p.status
	i := slices.IndexFunc(st.Devices, func(e gpuhealthv1alpha1.DeviceStatus) bool { return e.UUID == uuid })
	if i < 0 {
		d.quarantineDevice(uuid, findings)
		return
	}
	e := &st.Devices[i]
	for _, k := range findings {
		if name := d.p.judged[k].event.Name; !slices.Contains(e.Findings, name) && len(e.Findings) < 8 {
			e.Findings = append(e.Findings, name)
		}
	}
	for range 4 {
		phase := e.Phase
		switch phase {
		case gpuhealthv1alpha1.DeviceQuarantined:
			d.deviceQuarantined(e)
		case gpuhealthv1alpha1.DeviceDraining:
			d.deviceDraining(e)
		case gpuhealthv1alpha1.DeviceRecertifying:
			if d.deviceRecertifying(e) {
				return // returned: the entry is gone
			}
		case gpuhealthv1alpha1.DeviceFailed:
			d.ensureRule(e, false)
		}
		if e.Phase == phase {
			return
		}
	}
}

// moveDevice fires a GPU's event and records it: phase, since, reason and
// message on its entry, a note in the node's history and an Event.
func (d *decider) moveDevice(e *gpuhealthv1alpha1.DeviceStatus, ev fsm.DeviceEvent, reason, message, eventType string) bool {
	m, err := fsm.NewDevice(e.Phase)
	if err != nil {
		d.p.err = fmt.Errorf("nodehealth %s: GPU %s: %w", d.o.nh.Name, e.UUID, err)
		return false
	}
	from, to, err := m.Fire(context.Background(), ev)
	if err != nil {
		d.p.err = fmt.Errorf("nodehealth %s: GPU %s: %w", d.o.nh.Name, e.UUID, err)
		return false
	}
	now := d.o.now
	e.Phase, e.Since, e.Reason, e.Message = to, now, reason, gpuhealthv1alpha1.Truncate(message, 1024)
	note := fmt.Sprintf("GPU %s: %s → %s: %s", e, from, to, message)
	fsm.Note(&d.p.status, reason, gpuhealthv1alpha1.Truncate(note, 1024), now)
	d.nodeEvent(eventType, reason, string(ev), "%s", note)
	d.p.deviceMoves = append(d.p.deviceMoves, deviceStepRecord{from: from, to: to})
	return true
}

// quarantineDevice takes a GPU out of service: an entry, and its rule,
// which apply makes before the status is written. The device breaker and
// budget are asked first; a GPU they hold back stays in service, and the
// node's condition says why.
func (d *decider) quarantineDevice(uuid string, findings []int) {
	o := d.o
	dev := o.devices.found[uuid]
	js := make([]judgement, 0, len(findings))
	for _, k := range findings {
		js = append(js, d.p.judged[k])
	}
	what := describe(js)
	if b := o.devices.breaker; b != nil && !b.allowed {
		d.deviceHeld(fmt.Sprintf("GPU %s (%s) not taken out: device circuit breaker %s; findings: %s", dev.Name, uuid, b.message, what))
		d.wait(breakerRecheck)
		return
	}
	if b := o.devices.budget; b != nil && (b.err != nil || b.out+d.p.reserveDevices >= b.limit) {
		msg := fmt.Sprintf("GPU %s (%s) not taken out: budget maxUnavailableDevices allows %d GPUs out, %d are", dev.Name, uuid, b.limit, b.out+d.p.reserveDevices)
		if b.err != nil {
			msg = fmt.Sprintf("GPU %s (%s) not taken out: budget maxUnavailableDevices: %v", dev.Name, uuid, b.err)
		}
		d.deviceHeld(msg)
		d.wait(breakerRecheck)
		return
	}
	d.p.reserveDevices++
	first := js[0].event.Spec
	e := gpuhealthv1alpha1.DeviceStatus{
		UUID: uuid, Driver: dev.Driver, Pool: dev.Pool, Device: dev.Name, Phase: fsm.DeviceHealthy,
		OutSince: o.now, Class: deviceClass(first), Rule: devicetaint.RuleName(o.node.Name, dev.Name),
	}
	for _, j := range js[:min(len(js), 8)] {
		e.Findings = append(e.Findings, j.event.Name)
	}
	msg := what
	if d.dryRun() {
		msg = "dry run, a None rule only counts what would be evicted: " + what
	}
	if !d.moveDevice(&e, fsm.DeviceQuarantine, gpuhealthv1alpha1.ReasonDeviceQuarantined, msg, corev1.EventTypeWarning) {
		return
	}
	d.p.status.Devices = append(d.p.status.Devices, e)
	d.ensureRule(&d.p.status.Devices[len(d.p.status.Devices)-1], false)
}

// deviceClass is the class of a GPU's finding, the taint's value: the
// check and its code ("xid-48").
func deviceClass(s gpuhealthv1alpha1.NodeHealthEventSpec) string {
	class := strings.ToLower(string(s.Check))
	if s.Code != "" {
		class += "-" + s.Code
	}
	return class
}

// deviceHeld says on the node's condition why a GPU stays in service
// although a finding names it.
func (d *decider) deviceHeld(msg string) {
	d.heldDevices = append(d.heldDevices, msg)
}

// ensureRule asks apply to make (or keep) the GPU's rule, unless the
// cache shows it as wanted.
func (d *decider) ensureRule(e *gpuhealthv1alpha1.DeviceStatus, noExecute bool) {
	want := devicetaint.Rule(devicetaint.Device{Driver: e.Driver, Pool: e.Pool, Name: e.Device, Node: d.o.node.Name, UUID: e.UUID},
		ruleEffect(d.dryRun(), noExecute), e.Class)
	if got := d.o.devices.rules[want.Name]; got != nil && got.Spec.Taint.Effect == want.Spec.Taint.Effect &&
		got.Spec.Taint.Value == want.Spec.Taint.Value && devicetaint.Ours(got) {
		return
	}
	d.p.deviceActs = append(d.p.deviceActs, deviceAct{rule: want})
}

// deviceQuarantined waits for the GPU's rule to show in the cache (so
// nothing new is allocated the GPU), then drains it. Under a dry run it
// stays, with what the None rule's status says would have been evicted.
func (d *decider) deviceQuarantined(e *gpuhealthv1alpha1.DeviceStatus) {
	rule := d.o.devices.rules[e.Rule]
	d.ensureRule(e, false)
	if rule == nil {
		d.wait(deviceRuleRecheck)
		return
	}
	if d.dryRun() {
		if n, ok := devicetaint.DryRun(rule); ok && (e.WouldEvict == nil || *e.WouldEvict != int32(n)) {
			e.WouldEvict = ptrTo(int32(n))
			e.Message = gpuhealthv1alpha1.Truncate(fmt.Sprintf("dry run: quarantining GPU %s would have evicted %d pods", e.Device, n), 1024)
			d.nodeEvent(corev1.EventTypeNormal, gpuhealthv1alpha1.ReasonDryRun, "Quarantine", "dry run: quarantining GPU %s would have evicted %d pods (DeviceTaintRule %s)", e, n, e.Rule)
		} else if !ok {
			d.wait(deviceRuleRecheck)
		}
		return
	}
	d.moveDevice(e, fsm.DeviceDrain, gpuhealthv1alpha1.ReasonDeviceDraining,
		"DeviceTaintRule "+e.Rule+" keeps new work off the GPU; evicting the pods that hold it", corev1.EventTypeNormal)
}

// deviceDraining evicts the pods holding the GPU (the pass ran before
// deciding) until none is left. With effect NoExecute, once the drain's
// timeout has passed, the rule's effect becomes NoExecute and
// kube-controller-manager deletes what still holds the GPU.
func (d *decider) deviceDraining(e *gpuhealthv1alpha1.DeviceStatus) {
	s := devicesOf(d.o.policy)
	timeout := d.o.policy.Spec.Drain.Timeout.Get(time.Hour)
	late := !d.o.now.Time.Before(e.Since.Add(timeout))
	d.ensureRule(e, s.Effect == gpuhealthv1alpha1.DeviceNoExecute && late)
	pass := d.o.devices.drained[e.UUID]
	switch {
	case d.o.nh.Spec.Hold:
		e.Message = "spec.hold keeps the GPU's drain where it is"
		return
	case pass == nil:
		d.wait(deviceDrainRecheck)
		return
	case pass.err != nil:
		e.Message = gpuhealthv1alpha1.Truncate(fmt.Sprintf("draining: %d pods hold the GPU; %v", pass.result.Remaining, pass.err), 1024)
		e.PodsLeft = int32(pass.result.Remaining)
		d.wait(deviceDrainRecheck)
		return
	case !pass.result.Done():
		e.PodsLeft = int32(pass.result.Remaining)
		msg := fmt.Sprintf("draining: %d pods hold the GPU", pass.result.Remaining)
		if pass.result.Blocked > 0 {
			msg += fmt.Sprintf(", %d blocked by a PodDisruptionBudget", pass.result.Blocked)
		}
		if m := pass.result.TimedOutMessage(); m != "" {
			msg += "; " + m
		}
		e.Message = gpuhealthv1alpha1.Truncate(msg, 1024)
		d.wait(deviceDrainRecheck)
		if !late {
			d.wait(e.Since.Add(timeout).Sub(d.o.now.Time))
		}
		return
	}
	e.PodsLeft = 0
	e.Attempt, e.AttemptStartedAt = 1, ptrTo(d.o.now)
	d.moveDevice(e, fsm.DeviceRecertify, gpuhealthv1alpha1.ReasonDeviceRecertifying,
		fmt.Sprintf("no pod holds the GPU; attempt 1 of %d", s.MaxAttempts), corev1.EventTypeNormal)
}

// deviceSteps are a GPU's Jobs of an attempt, in order: reset, then test.
func deviceSteps(s deviceSettings) []struct {
	kind job.Kind
	tmpl *gpuhealthv1alpha1.JobTemplate
} {
	var out []struct {
		kind job.Kind
		tmpl *gpuhealthv1alpha1.JobTemplate
	}
	if s.Reset != nil {
		out = append(out, struct {
			kind job.Kind
			tmpl *gpuhealthv1alpha1.JobTemplate
		}{job.DeviceReset, s.Reset})
	}
	if s.Job != nil {
		out = append(out, struct {
			kind job.Kind
			tmpl *gpuhealthv1alpha1.JobTemplate
		}{job.DeviceRecertification, s.Job})
	}
	return out
}

// deviceRecertifying runs the attempt's Jobs in order, each on the GPU
// alone. It reports whether the GPU returned (its entry is gone).
func (d *decider) deviceRecertifying(e *gpuhealthv1alpha1.DeviceStatus) bool {
	o, s := d.o, devicesOf(d.o.policy)
	d.ensureRule(e, false)
	started := o.now.Time
	if e.AttemptStartedAt != nil {
		started = e.AttemptStartedAt.Time
	}
	if wait := started.Sub(o.now.Time); wait > 0 {
		e.Message = fmt.Sprintf("attempt %d starts at %s, after the backoff", e.Attempt, started.UTC().Format(time.RFC3339))
		d.wait(wait)
		return false
	}
	dev := job.Device{Node: o.node.Name, Name: e.Device, UUID: e.UUID, Driver: e.Driver, Class: s.DeviceClassName, TaintKey: devicetaint.TaintKey}
	steps := deviceSteps(s)
	for _, step := range steps {
		name := job.DeviceName(step.kind, dev, e.Attempt, started)
		got := o.jobs[name]
		if got == nil {
			env := o.jobEnv
			d.p.deviceActs = append(d.p.deviceActs, deviceAct{
				claim: job.DeviceClaimTemplate(step.kind, dev, o.namespace, e.Attempt, started),
				job:   job.BuildDevice(step.kind, dev, o.namespace, e.Attempt, started, *step.tmpl, s.timeout, env),
			})
			e.Message = fmt.Sprintf("attempt %d: starting Job %s", e.Attempt, name)
			d.wait(s.timeout)
			return false
		}
		switch res, msg := job.Result(got); res {
		case gpuhealthv1alpha1.JobSucceeded:
			continue
		case gpuhealthv1alpha1.JobFailed:
			d.deviceAttemptFailed(e, fmt.Sprintf("Job %s failed: %s", name, msg))
			return false
		default:
			e.Message = fmt.Sprintf("attempt %d: Job %s runs on the GPU", e.Attempt, name)
			d.wait(s.timeout)
			return false
		}
	}
	if len(steps) == 0 {
		for _, name := range e.Findings {
			if d.findingActive(name) {
				e.Message = "no test Job (devices.job): the GPU returns once finding " + name + " is resolved"
				return false
			}
		}
	}
	msg := fmt.Sprintf("attempt %d passed", e.Attempt)
	if len(steps) == 0 {
		msg = "its findings are resolved"
	}
	d.returnDevice(e, fsm.DevicePass, gpuhealthv1alpha1.ReasonDeviceReturned, msg)
	return true
}

// findingActive says whether the named finding still counts as active.
func (d *decider) findingActive(name string) bool {
	for _, j := range d.p.judged {
		if j.event.Name == name {
			return j.phase == gpuhealthv1alpha1.EventActive
		}
	}
	return false
}

// deviceAttemptFailed starts the GPU's next attempt, or leaves it Failed
// (still tainted) once its attempts are spent.
func (d *decider) deviceAttemptFailed(e *gpuhealthv1alpha1.DeviceStatus, why string) {
	s := devicesOf(d.o.policy)
	if e.Attempt >= s.MaxAttempts {
		d.moveDevice(e, fsm.DeviceFail, gpuhealthv1alpha1.ReasonDeviceFailed,
			fmt.Sprintf("attempt %d of %d failed (%s); the GPU stays out of service (DeviceTaintRule %s) for a human", e.Attempt, s.MaxAttempts, why, e.Rule),
			corev1.EventTypeWarning)
		return
	}
	e.Attempt++
	next := metav1.NewTime(d.o.now.Add(s.backoff))
	e.AttemptStartedAt = &next
	d.moveDevice(e, fsm.DeviceRetry, gpuhealthv1alpha1.ReasonDeviceRecertifying,
		fmt.Sprintf("attempt %d failed (%s); attempt %d of %d after %s", e.Attempt-1, why, e.Attempt, s.MaxAttempts, s.backoff), corev1.EventTypeWarning)
	d.wait(s.backoff)
}

// returnDevice puts a GPU back in service: its findings are closed, its
// entry goes, and apply deletes its rule once the status is written.
func (d *decider) returnDevice(e *gpuhealthv1alpha1.DeviceStatus, ev fsm.DeviceEvent, reason, msg string) {
	if !d.moveDevice(e, ev, reason, msg, corev1.EventTypeNormal) {
		return
	}
	now := d.o.now
	for i := range d.p.judged {
		j := &d.p.judged[i]
		if !slices.Contains(e.Findings, j.event.Name) || j.phase != gpuhealthv1alpha1.EventActive {
			continue
		}
		s := &j.event.Status
		s.SupersededAt, s.Phase = &now, gpuhealthv1alpha1.EventSuperseded
		s.SupersededCount = s.Count
		s.Occurrences = []gpuhealthv1alpha1.OccurrenceSample{{Time: now, Count: s.Count}}
		j.phase = gpuhealthv1alpha1.EventSuperseded
	}
	d.p.returnDevices = append(d.p.returnDevices, *e.DeepCopy())
	uuid := e.UUID
	d.p.status.Devices = slices.DeleteFunc(d.p.status.Devices, func(x gpuhealthv1alpha1.DeviceStatus) bool { return x.UUID == uuid })
}

// releaseDevices returns every GPU out alone with its node, whose own
// workflow (recertification, a release) covered them.
func (d *decider) releaseDevices(why string) {
	for len(d.p.status.Devices) > 0 {
		e := d.p.status.Devices[0]
		before := len(d.p.status.Devices)
		d.returnDevice(&e, fsm.DeviceRelease, gpuhealthv1alpha1.ReasonDeviceReleased, why)
		if len(d.p.status.Devices) == before {
			return // refused: the error is in the plan
		}
	}
}

// devicesCondition keeps DevicesOutOfService and devicesOut in step with
// the GPUs out alone, and says which GPUs a finding names that are held
// back.
func (d *decider) devicesCondition() {
	st := &d.p.status
	st.DevicesOut = int32(len(st.Devices))
	var parts []string
	for _, e := range st.Devices {
		parts = append(parts, fmt.Sprintf("%s %s (%s)", e, e.Phase, e.Class))
	}
	parts = append(parts, d.heldDevices...)
	switch {
	case len(st.Devices) > 0:
		d.condition(gpuhealthv1alpha1.NodeHealthDevicesOutOfServiceCondition, true, gpuhealthv1alpha1.ReasonDeviceQuarantined,
			fmt.Sprintf("%d out of service alone: %s", len(st.Devices), gpuhealthv1alpha1.FirstN(parts, 8, "; ")))
	case len(d.heldDevices) > 0:
		d.condition(gpuhealthv1alpha1.NodeHealthDevicesOutOfServiceCondition, false, gpuhealthv1alpha1.ReasonDeviceHeld,
			gpuhealthv1alpha1.FirstN(d.heldDevices, 4, "; "))
	default:
		d.clearCondition(gpuhealthv1alpha1.NodeHealthDevicesOutOfServiceCondition, gpuhealthv1alpha1.ReasonNoDevicesOut, "every GPU of the node is in service")
		if c := findCondition(st.Conditions, gpuhealthv1alpha1.NodeHealthDevicesOutOfServiceCondition); c != nil && c.Reason == gpuhealthv1alpha1.ReasonDeviceHeld {
			d.condition(gpuhealthv1alpha1.NodeHealthDevicesOutOfServiceCondition, false, gpuhealthv1alpha1.ReasonNoDevicesOut, "every GPU of the node is in service")
		}
	}
}

// devicesOut names the GPUs out alone for a message: "2 GPUs out of
// service alone: gpu-3 (Draining), gpu-5 (Failed)".
func devicesOut(ds []gpuhealthv1alpha1.DeviceStatus) string {
	parts := make([]string, 0, len(ds))
	for _, e := range ds {
		parts = append(parts, fmt.Sprintf("%s (%s)", e.Device, e.Phase))
	}
	gpus := "GPUs"
	if len(ds) == 1 {
		gpus = "GPU"
	}
	return fmt.Sprintf("%d %s out of service alone: %s", len(ds), gpus, gpuhealthv1alpha1.FirstN(parts, 8, ", "))
}

func findCondition(cs []metav1.Condition, t string) *metav1.Condition {
	for i := range cs {
		if cs[i].Type == t {
			return &cs[i]
		}
	}
	return nil
}

func ptrTo[T any](v T) *T { return &v }
