package budget

import (
	"testing"

	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/util/intstr"
)

func TestLimit(t *testing.T) {
	cases := []struct {
		name    string
		value   *intstr.IntOrString
		total   int
		want    int
		wantErr bool
	}{
		{name: "a count is taken as it is", value: ptr(intstr.FromInt32(2)), total: 100, want: 2},
		{name: "a percentage rounds up like a PDB", value: ptr(intstr.FromString("10%")), total: 3, want: 1},
		{name: "a percentage of an exact share", value: ptr(intstr.FromString("25%")), total: 8, want: 2},
		{name: "zero percent allows nothing", value: ptr(intstr.FromString("0%")), total: 50, want: 0},
		{name: "nil takes the default", value: nil, total: 20, want: 2},
		{name: "a malformed value fails closed", value: ptr(intstr.FromString("ten")), total: 20, want: 0, wantErr: true},
		{name: "a negative count fails closed", value: ptr(intstr.FromInt32(-1)), total: 20, want: 0, wantErr: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			got, err := Limit(tc.value, tc.total, intstr.FromString("10%"))
			g.Expect(got).To(Equal(tc.want))
			g.Expect(err != nil).To(Equal(tc.wantErr), "err %v", err)
		})
	}
}

func TestDecision(t *testing.T) {
	g := NewWithT(t)
	d := Decision{Name: "maxUnavailable", Limit: 1, Consuming: 2, Total: 3}
	g.Expect(d.Allowed()).To(Equal(0), "never negative")
	g.Expect(d.Message()).To(Equal("2 of 3 nodes unavailable, maxUnavailable 1"))
	g.Expect(Decision{Limit: 3, Consuming: 1}.Allowed()).To(Equal(2))
	scoped := Decision{Name: "maxUnavailablePerClique", Limit: 1, Consuming: 1, Total: 4, Scope: "clique c.1"}
	g.Expect(scoped.Message()).To(Equal("1 of 4 nodes of clique c.1 unavailable, maxUnavailablePerClique 1"))
	g.Expect(d.Full()).To(Equal("no room under maxUnavailable 1"))
	g.Expect(scoped.Full()).To(Equal("no room under maxUnavailablePerClique 1 in clique c.1"))
	more := d
	more.Consuming, more.Total = 1, 40
	g.Expect(more.Full()).To(Equal(d.Full()), "the counts are not part of it")
}

func ptr[T any](v T) *T { return &v }
