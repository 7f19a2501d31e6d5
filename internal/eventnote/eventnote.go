// Package eventnote keeps every Event's note within what the apiserver
// accepts.
//
// events.k8s.io/v1 refuses an Event whose note is longer than 1,024 bytes,
// and the recorder drops a refused Event after logging it. The notes that
// run long are the ones that matter most: a failed step's verdict, a
// circuit breaker naming the nodes it held, a drain naming the pods it
// could not evict. Cutting each message to 1,024 bytes is not enough (a
// prefix is added around it), so the whole note is cut, once, here.
package eventnote

import (
	"fmt"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/events"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
)

// Limit is the longest note, in bytes, the apiserver accepts on an Event
// (events.k8s.io/v1 validation: "can have at most 1024 characters", counted
// in bytes).
const Limit = 1024

// Bounded wraps rec so that every note is cut to Limit bytes, on a rune
// boundary, before it is sent.
func Bounded(rec events.EventRecorder) events.EventRecorder { return bounded{rec} }

type bounded struct{ rec events.EventRecorder }

// Eventf formats the note, cuts it and hands it on verbatim.
func (b bounded) Eventf(regarding, related runtime.Object, eventType, reason, action, note string, args ...any) {
	if len(args) > 0 {
		note = fmt.Sprintf(note, args...)
	}
	b.rec.Eventf(regarding, related, eventType, reason, action, "%s", gpuhealthv1alpha1.Truncate(note, Limit))
}
