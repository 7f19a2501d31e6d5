package v1alpha1_test

import (
	"strings"
	"testing"

	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/util/validation"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
)

func TestEventName(t *testing.T) {
	base := func() gpuhealthv1alpha1.NodeHealthEventSpec {
		return gpuhealthv1alpha1.NodeHealthEventSpec{
			NodeName: "gpu-node-1", Source: "nvml", Check: "XID",
			Component: gpuhealthv1alpha1.Component{Kind: "GPU", ID: "GPU-1"}, Code: "79",
		}
	}
	baseName := func() string { s := base(); return s.EventName() }()

	t.Run("the same finding always gets the same name", func(t *testing.T) {
		g := NewWithT(t)
		s := base()
		s.Severity, s.Message, s.RecommendedAction = "Info", "other words", "None"
		g.Expect(s.EventName()).To(Equal(baseName), "severity, message and action are not part of the identity")
		g.Expect(baseName).To(MatchRegexp(`^gpu-node-1-nvml-xid-[0-9a-f]{10}$`))
	})

	changes := []struct {
		name   string
		change func(*gpuhealthv1alpha1.NodeHealthEventSpec)
	}{
		{"another node", func(s *gpuhealthv1alpha1.NodeHealthEventSpec) { s.NodeName = "gpu-node-2" }},
		{"another source", func(s *gpuhealthv1alpha1.NodeHealthEventSpec) { s.Source = "kmsg" }},
		{"another check", func(s *gpuhealthv1alpha1.NodeHealthEventSpec) { s.Check = "GPULost" }},
		{"another component", func(s *gpuhealthv1alpha1.NodeHealthEventSpec) { s.Component.ID = "GPU-2" }},
		{"another code", func(s *gpuhealthv1alpha1.NodeHealthEventSpec) { s.Code = "48" }},
		{"fields that only differ in where one ends", func(s *gpuhealthv1alpha1.NodeHealthEventSpec) {
			s.Component.ID, s.Code = "GPU-17", "9"
		}},
	}
	for _, c := range changes {
		t.Run("a different finding gets a different name: "+c.name, func(t *testing.T) {
			s := base()
			c.change(&s)
			NewWithT(t).Expect(s.EventName()).NotTo(Equal(baseName))
		})
	}

	t.Run("names stay valid object names for the longest node names", func(t *testing.T) {
		g := NewWithT(t)
		long := strings.Repeat("a", 62) + "." + strings.Repeat("b", 62) + "." + strings.Repeat("c", 62) + "." + strings.Repeat("d", 62)
		a := gpuhealthv1alpha1.EventName(long, "recertification", "Recertification", "", "DCGM_DIAG_FAILED")
		b := gpuhealthv1alpha1.EventName(long+"x", "recertification", "Recertification", "", "DCGM_DIAG_FAILED")
		for _, n := range []string{a, b, baseName} {
			g.Expect(validation.IsDNS1123Subdomain(n)).To(BeEmpty(), n)
		}
		g.Expect(a).NotTo(Equal(b), "shortening the node part never merges two findings")
		g.Expect(gpuhealthv1alpha1.EventName("GPU-Node.Example", "nvml", "XID", "", "79")).To(HavePrefix("gpu-node.example-"))
	})
}

func TestAlternateEventName(t *testing.T) {
	long := strings.Repeat("a", 62) + "." + strings.Repeat("b", 62) + "." + strings.Repeat("c", 62) + "." + strings.Repeat("d", 50)
	cases := []struct {
		name string
		spec gpuhealthv1alpha1.NodeHealthEventSpec
	}{
		{
			name: "a finding of a node with a short name",
			spec: gpuhealthv1alpha1.NodeHealthEventSpec{NodeName: "gpu-node-1", Source: "nvml", Check: "XID", Component: gpuhealthv1alpha1.Component{ID: "GPU-1"}, Code: "79"},
		},
		{
			name: "a finding of a node whose name fills the event name",
			spec: gpuhealthv1alpha1.NodeHealthEventSpec{NodeName: long, Source: "recertification", Check: "Recertification", Code: "DCGM_DIAG_FAILED"},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			name := tc.spec.EventName()
			first, second := tc.spec.AlternateEventName(name, 1), tc.spec.AlternateEventName(name, 2)
			g.Expect(tc.spec.AlternateEventName(name, 1)).To(Equal(first), "the same every time")
			g.Expect(first).NotTo(Equal(name))
			g.Expect(second).NotTo(Equal(first))
			for _, n := range []string{first, second} {
				g.Expect(validation.IsDNS1123Subdomain(n)).To(BeEmpty(), n)
				g.Expect(n).To(MatchRegexp(`-%s-%s-[0-9a-f]{10}-[0-9a-f]{10}$`, tc.spec.Source, strings.ToLower(string(tc.spec.Check))))
				g.Expect(n).To(HaveSuffix(name[len(name)-10:]+n[len(n)-11:]), "the finding's hash, then the alternate's")
				node := n[:len(n)-len("-"+string(tc.spec.Source)+"-"+strings.ToLower(string(tc.spec.Check)))-22]
				g.Expect(tc.spec.NodeName).To(HavePrefix(node), "the node part is the node's name or its start")
			}
			verdict := tc.spec.VerdictEventName()
			g.Expect(tc.spec.AlternateEventName(verdict, 1)).NotTo(Equal(first), "the alternates of the verdict name are its own")
		})
	}
}
