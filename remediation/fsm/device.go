package fsm

import (
	"context"
	"errors"
	"fmt"

	"github.com/looplab/fsm"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
)

// DevicePhase is where one GPU out of service alone stands; Healthy is a
// GPU in service, which has no entry in the node's status.
type DevicePhase = gpuhealthv1alpha1.DevicePhase

// DeviceHealthy is the phase of a GPU in service (no status entry).
const DeviceHealthy DevicePhase = "Healthy"

// DeviceEvent is something that moves one GPU from one phase to another.
type DeviceEvent string

const (
	// DeviceQuarantine takes a GPU out of service: its DeviceTaintRule is made.
	DeviceQuarantine DeviceEvent = "Quarantine"
	// DeviceDrain starts evicting the pods that hold the GPU, once the rule exists.
	DeviceDrain DeviceEvent = "Drain"
	// DeviceRecertify starts the GPU's reset and test once nothing holds it.
	DeviceRecertify DeviceEvent = "Recertify"
	// DevicePass returns a GPU that passed its test: the rule is deleted.
	DevicePass DeviceEvent = "Pass"
	// DeviceRetry starts another attempt after a failed one.
	DeviceRetry DeviceEvent = "Retry"
	// DeviceFail leaves a GPU that failed its attempts tainted for a human.
	DeviceFail DeviceEvent = "Fail"
	// DeviceRelease returns a GPU without a test: the node's own workflow
	// covered it (the node was recertified or released), or a human asked.
	DeviceRelease DeviceEvent = "Release"
)

// deviceTransitions is the whole device machine. Everything not listed is illegal.
var deviceTransitions = []struct {
	Event DeviceEvent
	From  []DevicePhase
	To    DevicePhase
}{
	{DeviceQuarantine, []DevicePhase{DeviceHealthy}, gpuhealthv1alpha1.DeviceQuarantined},
	{DeviceDrain, []DevicePhase{gpuhealthv1alpha1.DeviceQuarantined}, gpuhealthv1alpha1.DeviceDraining},
	{DeviceRecertify, []DevicePhase{gpuhealthv1alpha1.DeviceDraining}, gpuhealthv1alpha1.DeviceRecertifying},
	{DeviceRetry, []DevicePhase{gpuhealthv1alpha1.DeviceRecertifying}, gpuhealthv1alpha1.DeviceRecertifying},
	{DevicePass, []DevicePhase{gpuhealthv1alpha1.DeviceRecertifying}, DeviceHealthy},
	{DeviceFail, []DevicePhase{gpuhealthv1alpha1.DeviceRecertifying}, gpuhealthv1alpha1.DeviceFailed},
	{DeviceRelease, []DevicePhase{gpuhealthv1alpha1.DeviceQuarantined, gpuhealthv1alpha1.DeviceDraining,
		gpuhealthv1alpha1.DeviceRecertifying, gpuhealthv1alpha1.DeviceFailed}, DeviceHealthy},
}

// DeviceMachine is the state machine of one GPU, rebuilt from its
// persisted phase at every reconcile.
type DeviceMachine struct {
	f *fsm.FSM
}

// NewDevice rebuilds a GPU's machine at a persisted phase; empty is a GPU
// in service.
func NewDevice(current DevicePhase) (*DeviceMachine, error) {
	if current == "" {
		current = DeviceHealthy
	}
	known := current == DeviceHealthy
	for _, p := range []DevicePhase{gpuhealthv1alpha1.DeviceQuarantined, gpuhealthv1alpha1.DeviceDraining,
		gpuhealthv1alpha1.DeviceRecertifying, gpuhealthv1alpha1.DeviceFailed} {
		known = known || p == current
	}
	if !known {
		return nil, fmt.Errorf("unknown device phase %q", current)
	}
	return &DeviceMachine{f: fsm.NewFSM(string(current), eventsOf(len(deviceTransitions), func(i int) (DeviceEvent, []DevicePhase, DevicePhase) {
		return deviceTransitions[i].Event, deviceTransitions[i].From, deviceTransitions[i].To
	}), nil)}, nil
}

// Phase is the machine's current phase.
func (m *DeviceMachine) Phase() DevicePhase { return DevicePhase(m.f.Current()) }

// Fire moves the machine; an event the phase does not allow returns an
// error and leaves the machine where it was. A move to the phase it is in
// (Retry) is legal.
func (m *DeviceMachine) Fire(ctx context.Context, e DeviceEvent) (from, to DevicePhase, err error) {
	from = m.Phase()
	if err := m.f.Event(ctx, string(e)); err != nil {
		var same fsm.NoTransitionError
		if errors.As(err, &same) {
			return from, from, nil
		}
		return from, from, fmt.Errorf("device event %s is not allowed in phase %s", e, from)
	}
	return from, m.Phase(), nil
}

// DeviceMermaid renders the device machine as a Mermaid state diagram, in
// table order, for docs/architecture.md.
func DeviceMermaid() string {
	out := "stateDiagram-v2\n    [*] --> Healthy\n"
	for _, t := range deviceTransitions {
		for _, f := range t.From {
			out += fmt.Sprintf("    %s --> %s: %s\n", f, t.To, t.Event)
		}
	}
	return out
}
