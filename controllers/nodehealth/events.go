package nodehealth

import (
	"fmt"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/events"
)

// announcement is an Event a plan publishes once its status is written:
// Normal for progress, Warning for faults and blocks; reasons are the
// gpuhealthv1alpha1.Reason… constants.
type announcement struct {
	regarding, related runtime.Object
	eventType          string
	reason, action     string
	note               string
}

// publish sends the announcements.
func publish(rec events.EventRecorder, as []announcement) {
	for _, a := range as {
		rec.Eventf(a.regarding, a.related, a.eventType, a.reason, a.action, "%s", a.note)
	}
}

// nodeEvent announces an Event on the Node, with its NodeHealth as the related object.
func (d *decider) nodeEvent(eventType, reason, action, note string, args ...any) {
	d.p.announce = append(d.p.announce, announcement{regarding: d.o.node, related: d.o.nh, eventType: eventType,
		reason: reason, action: action, note: fmt.Sprintf(note, args...)})
}
