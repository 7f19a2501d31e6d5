package main

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

func TestPodWatchStopsEachVictimsClockWhenItIsFirstEmpty(t *testing.T) {
	w := newPodWatch()
	pod := func(uid, node string, ready bool) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{UID: types.UID(uid), Labels: map[string]string{"app": "drain0"}, CreationTimestamp: metav1.Now()}, Spec: corev1.PodSpec{NodeName: node}}
		if ready {
			p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
		}
		return p
	}
	w.set(pod("a", "victim-0", true), true)
	w.set(pod("b", "victim-1", true), true)
	start := time.Now()
	w.arm([]string{"victim-0", "victim-1"}, "drain0")
	if n := w.emptied(); n != 0 {
		t.Fatalf("%d victims empty before any pod left", n)
	}
	w.set(pod("a", "victim-0", true), false)
	w.set(pod("c", "spare-0", false), true)
	w.set(pod("c", "spare-0", true), true)
	if n := w.emptied(); n != 1 {
		t.Fatalf("%d victims empty, want 1", n)
	}
	// A pod that starts terminating has left; a replacement landing on a
	// victim that had emptied does not restart its clock.
	terminating := pod("b", "victim-1", true)
	terminating.DeletionTimestamp = &metav1.Time{Time: time.Now()}
	w.set(terminating, true)
	w.set(pod("b", "victim-1", true), false)
	w.set(pod("d", "victim-0", true), true)
	perNode, evictions, replacement := w.result(start)
	if n := w.emptied(); n != 2 || len(perNode) != 2 || evictions != 2 {
		t.Fatalf("emptied %d, per node %v, evictions %d; want 2, 2 times, 2", n, perNode, evictions)
	}
	if replacement < 0 || replacement > time.Second {
		t.Fatalf("replacement %s, want a small positive time", replacement)
	}
}

func TestExhaustedSumsTheTimeTheBudgetAllowedNone(t *testing.T) {
	w := newPodWatch()
	start := time.Now()
	w.app = "drain0"
	at := func(ms int, allowed int32) budgetSample {
		return budgetSample{at: start.Add(time.Duration(ms) * time.Millisecond), allowed: allowed}
	}
	// Allowed until 100 ms, none until 400, allowed until 700, none to the end.
	w.budget = []budgetSample{at(100, 0), at(400, 3), at(700, 0), at(2000, 5)}
	if got, want := w.exhausted(start, start.Add(time.Second)), 600*time.Millisecond; got != want {
		t.Fatalf("exhausted %s, want %s", got, want)
	}
}
