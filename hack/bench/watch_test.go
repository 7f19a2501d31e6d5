package main

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestNodeWatchTimesEachArmedNode(t *testing.T) {
	w := &nodeWatch{nodes: map[string]nodeState{}}
	node := func(name string, cordoned bool) *corev1.Node {
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.NodeSpec{Unschedulable: cordoned}}
	}
	w.update(node("a", false))
	w.update(node("b", false))
	w.update(node("c", true))
	if err := w.arm([]string{"a", "b"}); err != nil {
		t.Fatal(err)
	}
	w.update(node("c", true)) // not armed
	w.update(node("a", true))
	first := w.cordonedAt([]string{"a"})[0]
	w.update(node("a", true)) // seen again: its clock stopped the first time
	if seen, last := w.cordoned(); seen != 1 || !last.Equal(first) || first.IsZero() {
		t.Fatalf("seen %d, last %v (a at %v); want 1 at a's first sight", seen, last, first)
	}
	time.Sleep(time.Millisecond)
	w.update(node("b", true))
	at := w.cordonedAt([]string{"b", "a", "c"})
	if seen, last := w.cordoned(); seen != 2 || !last.Equal(at[0]) || !at[1].Equal(first) || !at[2].IsZero() {
		t.Fatalf("seen %d, last %v, at %v", seen, last, at)
	}
	if err := w.arm([]string{"a"}); err == nil {
		t.Error("arming a cordoned node: want an error")
	}
}
