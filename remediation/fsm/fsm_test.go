package fsm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
)

func TestLegalTransitions(t *testing.T) {
	cases := []struct {
		from  phase
		event Event
		to    phase
	}{
		{healthy, Certify, certifying},
		{certifying, Certified, healthy},
		{healthy, Quarantine, quarantined},
		{certifying, Quarantine, quarantined},
		{quarantined, Drain, draining},
		{draining, Recertify, recertifying},
		{recertifying, Pass, healthy},
		{recertifying, FailRecertification, quarantined},
		{healthy, Fail, failed},
		{certifying, Fail, failed},
		{quarantined, Fail, failed},
		{draining, Fail, failed},
		{recertifying, Fail, failed},
		{certifying, Cancel, healthy},
		{quarantined, Cancel, healthy},
		{draining, Cancel, healthy},
		{recertifying, Cancel, healthy},
		{maintenance, Cancel, healthy},
		{failed, Cancel, healthy},
		{certifying, Release, healthy},
		{quarantined, Release, healthy},
		{draining, Release, healthy},
		{recertifying, Release, healthy},
		{maintenance, Release, healthy},
		{failed, Release, healthy},
		{failed, Retry, quarantined},
		{maintenance, Recertify, recertifying},
		{draining, Maintain, maintenance},
		{maintenance, Fail, failed},
	}
	for _, tc := range cases {
		t.Run(fmt.Sprintf("%s in %s goes to %s", tc.event, tc.from, tc.to), func(t *testing.T) {
			g := NewWithT(t)
			m, err := New(tc.from)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(m.Can(tc.event)).To(BeTrue())
			from, to, err := m.Fire(context.Background(), tc.event)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(from).To(Equal(tc.from))
			g.Expect(to).To(Equal(tc.to))
			g.Expect(m.Phase()).To(Equal(tc.to))
		})
	}
	// Every (phase, event) pair the table lists is covered above, and nothing else is legal.
	legal := 0
	for _, tr := range Transitions() {
		legal += len(tr.From)
	}
	NewWithT(t).Expect(cases).To(HaveLen(legal))
}

func TestIllegalTransitionsAreRefused(t *testing.T) {
	legal := map[string]bool{}
	for _, tr := range Transitions() {
		for _, f := range tr.From {
			legal[string(f)+"/"+string(tr.Event)] = true
		}
	}
	events := Events()
	illegal := 0
	for _, p := range Phases() {
		for _, e := range events {
			if legal[string(p)+"/"+string(e)] {
				continue
			}
			illegal++
			t.Run(fmt.Sprintf("%s in %s is refused", e, p), func(t *testing.T) {
				g := NewWithT(t)
				m, err := New(p)
				g.Expect(err).NotTo(HaveOccurred())
				g.Expect(m.Can(e)).To(BeFalse())
				_, _, err = m.Fire(context.Background(), e)
				var ite *IllegalTransitionError
				g.Expect(errors.As(err, &ite)).To(BeTrue(), "got %v", err)
				g.Expect(ite.Phase).To(Equal(p))
				g.Expect(m.Phase()).To(Equal(p), "an illegal event leaves the machine where it was")
			})
		}
	}
	// Named examples the design calls out, so a change to the table shows here.
	for _, named := range []string{"Healthy/Drain", "Healthy/Recertify", "Quarantined/Pass", "Failed/Drain", "Healthy/Cancel", "Draining/Pass", "Failed/Pass"} {
		NewWithT(t).Expect(legal[named]).To(BeFalse(), named)
	}
	NewWithT(t).Expect(illegal).To(BeNumerically(">=", 5))
}

func TestNewRejectsUnknownPhases(t *testing.T) {
	g := NewWithT(t)
	_, err := New("Rebooting")
	g.Expect(err).To(MatchError(ContainSubstring(`unknown phase "Rebooting"`)))
	m, err := New("")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(m.Phase()).To(Equal(healthy), "a node not judged yet starts Healthy")
}

func TestRecordKeepsABoundedHistory(t *testing.T) {
	g := NewWithT(t)
	status := &gpuhealthv1alpha1.NodeHealthStatus{}
	start := time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC)
	for i := range MaxHistory + 5 {
		now := metav1.NewTime(start.Add(time.Duration(i) * time.Minute))
		Record(status, healthy, quarantined, "XID79", fmt.Sprintf("entry %d", i), "", now)
	}
	g.Expect(status.History).To(HaveLen(MaxHistory))
	g.Expect(status.History[0].Message).To(Equal("entry 5"), "the oldest entries go first")
	g.Expect(status.History[MaxHistory-1].Message).To(Equal(fmt.Sprintf("entry %d", MaxHistory+4)))
	g.Expect(status.Phase).To(Equal(quarantined))
	g.Expect(status.Reason).To(Equal("XID79"))
	g.Expect(status.Since.Time).To(Equal(start.Add(time.Duration(MaxHistory+4) * time.Minute)))
}

func TestArchitectureDocShowsTheMachine(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "architecture.md"))
	if err != nil {
		t.Fatal(err)
	}
	NewWithT(t).Expect(string(doc)).To(ContainSubstring("```mermaid\n"+Mermaid()+"```"),
		"docs/architecture.md must embed fsm.Mermaid() exactly; paste the new diagram")
}

func TestArchitectureDocShowsTheDeviceMachine(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "architecture.md"))
	if err != nil {
		t.Fatal(err)
	}
	NewWithT(t).Expect(string(doc)).To(ContainSubstring("```mermaid\n"+DeviceMermaid()+"```"),
		"docs/architecture.md must embed fsm.DeviceMermaid() exactly; paste the new diagram")
}
