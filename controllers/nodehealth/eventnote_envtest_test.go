package nodehealth

import (
	"context"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/internal/eventnote"
)

// The longest notes are the ones that matter (a verdict, the nodes a
// breaker held), and the apiserver refuses a note over 1,024 bytes: the
// operator's recorder cuts the whole note, on a rune boundary, and the
// Event arrives.
func TestLongEventNotesArriveCut(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "long-note-node"}}
	if err := k8sClient.Create(ctx, node); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = k8sClient.Delete(context.Background(), node) })
	// "→" is three bytes: a byte cut at 1,024 splits one.
	note := "Quarantined → Draining: " + strings.Repeat("→", 600)

	// Without the cut, the apiserver refuses the Event.
	cs := kubernetes.NewForConfigOrDie(testEnv.Config)
	raw := &eventsv1.Event{
		ObjectMeta: metav1.ObjectMeta{Namespace: metav1.NamespaceDefault, GenerateName: "uncut-"},
		EventTime:  metav1.NowMicro(), ReportingController: FieldManager, ReportingInstance: "test",
		Action: "Drain", Reason: gpuhealthv1alpha1.ReasonDrainTimedOut, Type: corev1.EventTypeWarning,
		Regarding: corev1.ObjectReference{Kind: "Node", Name: node.Name, UID: node.UID, APIVersion: "v1"},
		Note:      note,
	}
	if _, err := cs.EventsV1().Events(metav1.NamespaceDefault).Create(ctx, raw, metav1.CreateOptions{}); !apierrors.IsInvalid(err) {
		t.Fatalf("an Event with a %d-byte note: got %v, want Invalid", len(note), err)
	}

	b := events.NewBroadcaster(&events.EventSinkImpl{Interface: cs.EventsV1()})
	stop := make(chan struct{})
	defer close(stop)
	b.StartRecordingToSink(stop)
	rec := b.NewRecorder(testScheme, FieldManager)
	publish(eventnote.Bounded(rec), []announcement{{regarding: node, eventType: corev1.EventTypeWarning,
		reason: gpuhealthv1alpha1.ReasonDrainTimedOut, action: "Drain", note: note}})

	var got string
	deadline := time.Now().Add(30 * time.Second)
	for got == "" && time.Now().Before(deadline) {
		var l eventsv1.EventList
		if err := k8sClient.List(ctx, &l, client.InNamespace(metav1.NamespaceDefault)); err != nil {
			t.Fatal(err)
		}
		for _, e := range l.Items {
			if e.Regarding.Name == node.Name && e.Reason == gpuhealthv1alpha1.ReasonDrainTimedOut {
				got = e.Note
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	if got == "" {
		t.Fatal("the Event with the long note never arrived")
	}
	if len(got) > eventnote.Limit || !utf8.ValidString(got) || !strings.HasPrefix(note, got) {
		t.Errorf("note arrived as %d bytes (valid UTF-8 %v, a prefix of the note %v); want a prefix of at most %d bytes",
			len(got), utf8.ValidString(got), strings.HasPrefix(note, got), eventnote.Limit)
	}
	if len(got) < eventnote.Limit-2 {
		t.Errorf("note cut to %d bytes; want all but the split rune of %d", len(got), eventnote.Limit)
	}
}
