package devicetaint

import (
	"fmt"
	"strings"
	"testing"

	. "github.com/onsi/gomega"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/utils/ptr"
)

// NVIDIASlice is a ResourceSlice shaped as NVIDIA's DRA driver publishes
// a node's GPUs: driver gpu.nvidia.com, one pool named after the node,
// device gpu-<minor> per GPU with its uuid (a bare name: the driver's
// domain) among its attributes.
func NVIDIASlice(node string, generation int64, uuids ...string) *resourcev1.ResourceSlice {
	s := &resourcev1.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: node + "-gpu.nvidia.com-" + fmt.Sprint(generation)},
		Spec: resourcev1.ResourceSliceSpec{
			Driver:   DefaultDriver,
			Pool:     resourcev1.ResourcePool{Name: node, Generation: generation, ResourceSliceCount: 1},
			NodeName: ptr.To(node),
		},
	}
	for i, u := range uuids {
		s.Spec.Devices = append(s.Spec.Devices, resourcev1.Device{
			Name: fmt.Sprintf("gpu-%d", i),
			Attributes: map[resourcev1.QualifiedName]resourcev1.DeviceAttribute{
				"type":                            {StringValue: ptr.To("gpu")},
				"uuid":                            {StringValue: ptr.To(u)},
				"productName":                     {StringValue: ptr.To("NVIDIA H200")},
				"driverVersion":                   {VersionValue: ptr.To("580.95.5")},
				"resource.kubernetes.io/pciBusID": {StringValue: ptr.To(fmt.Sprintf("0000:%02x:00.0", 0x18+i))},
			},
			Capacity: map[resourcev1.QualifiedName]resourcev1.DeviceCapacity{"memory": {Value: resource.MustParse("141Gi")}},
		})
	}
	return s
}

// UUIDs are eight GPU UUIDs of node.
func UUIDs(node string) []string {
	out := make([]string, 8)
	for i := range out {
		out[i] = fmt.Sprintf("GPU-%08x-0000-4000-8000-%012d", len(node), i)
	}
	return out
}

func TestFindIn(t *testing.T) {
	uuids := UUIDs("n1")
	qualified := NVIDIASlice("n1", 2, uuids...)
	qualified.Spec.Devices[5].Attributes = map[resourcev1.QualifiedName]resourcev1.DeviceAttribute{"gpu.nvidia.com/uuid": {StringValue: ptr.To(uuids[5])}}
	other := NVIDIASlice("n1", 7, uuids...)
	other.Spec.Driver = "gpu.example.com"
	cases := []struct {
		name   string
		slices []resourcev1.ResourceSlice
		uuid   string
		want   string
		found  bool
	}{
		{"GPU 3 of the node's slice", []resourcev1.ResourceSlice{*NVIDIASlice("n1", 1, uuids...)}, uuids[3], "gpu-3", true},
		{"the uuid under the driver's domain", []resourcev1.ResourceSlice{*qualified}, uuids[5], "gpu-5", true},
		{"an older generation of the pool is the driver's leftover", []resourcev1.ResourceSlice{*NVIDIASlice("n1", 1, uuids...), *NVIDIASlice("n1", 2, uuids[4:]...)}, uuids[3], "", false},
		{"the newest generation holds it", []resourcev1.ResourceSlice{*NVIDIASlice("n1", 1, uuids[4:]...), *NVIDIASlice("n1", 2, uuids...)}, uuids[3], "gpu-3", true},
		{"another node's slice", []resourcev1.ResourceSlice{*NVIDIASlice("n2", 1, uuids...)}, uuids[3], "", false},
		{"another driver's slice", []resourcev1.ResourceSlice{*other}, uuids[3], "", false},
		{"another driver's newer pool of the same name does not hide this one", []resourcev1.ResourceSlice{*other, *NVIDIASlice("n1", 2, uuids...)}, uuids[3], "gpu-3", true},
		{"an unknown GPU", []resourcev1.ResourceSlice{*NVIDIASlice("n1", 1, uuids...)}, "GPU-unknown", "", false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			d, ok := findIn(tc.slices, DefaultDriver, "n1", tc.uuid)
			g.Expect(ok).To(Equal(tc.found))
			if ok {
				g.Expect(d).To(Equal(Device{Driver: DefaultDriver, Pool: "n1", Name: tc.want, Node: "n1", UUID: tc.uuid}))
			}
		})
	}
}

func TestRuleName(t *testing.T) {
	g := NewWithT(t)
	g.Expect(RuleName("gpu-node-7", "gpu-3")).To(Equal("gpuhealth-gpu-node-7-gpu-3"))
	long := strings.Repeat("a", 250)
	a, b := RuleName(long+".x", "gpu-3"), RuleName(long+".y", "gpu-3")
	for _, n := range []string{a, b} {
		g.Expect(len(n)).To(BeNumerically("<=", 253))
		g.Expect(validation.IsDNS1123Subdomain(n)).To(BeEmpty(), n)
		g.Expect(n).To(HaveSuffix("-gpu-3"), "the device stays readable")
	}
	g.Expect(a).NotTo(Equal(b), "two long node names stay apart")
}

func TestRule(t *testing.T) {
	g := NewWithT(t)
	d := Device{Driver: DefaultDriver, Pool: "n1", Name: "gpu-3", Node: "n1", UUID: "GPU-x"}
	r := Rule(d, resourcev1.DeviceTaintEffectNoSchedule, "XID 48: double-bit ECC")
	g.Expect(r.Name).To(Equal("gpuhealth-n1-gpu-3"))
	g.Expect(Ours(r)).To(BeTrue())
	sel := r.Spec.DeviceSelector
	g.Expect(sel).NotTo(BeNil(), "a nil selector selects nothing, and an empty one every device of every driver")
	g.Expect([]*string{sel.Driver, sel.Pool, sel.Device}).To(Equal([]*string{ptr.To(DefaultDriver), ptr.To("n1"), ptr.To("gpu-3")}), "all three set: exactly one device")
	g.Expect(r.Spec.Taint).To(Equal(resourcev1.DeviceTaint{Key: TaintKey, Value: "XID-48--double-bit-ECC", Effect: resourcev1.DeviceTaintEffectNoSchedule}))
	g.Expect(validation.IsValidLabelValue(taintValue(strings.Repeat("é", 40) + "!"))).To(BeEmpty())
	g.Expect(validation.IsValidLabelValue(taintValue("-_." + strings.Repeat("x", 70) + "._-"))).To(BeEmpty())
}

func TestParseWouldEvict(t *testing.T) {
	cases := []struct {
		msg  string
		want int
		ok   bool
	}{
		{"8 published devices selected. 1 allocated devices selected. 3 pods would be evicted in 1 namespace(s) if the effect was NoExecute. This information will not be updated again. Recreate the DeviceTaintRule to trigger an update.", 3, true},
		{"1 published devices selected. 0 allocated devices selected. 0 pods would be evicted in 0 namespace(s) if the effect was NoExecute.", 0, true},
		{"Eviction only happens for the NoExecute effect.", 0, false},
		{"", 0, false},
		{"12345678901 pods would be evicted", 0, false},
	}
	for _, tc := range cases {
		n, ok := parseWouldEvict(tc.msg)
		NewWithT(t).Expect([]any{n, ok}).To(Equal([]any{tc.want, tc.ok}), tc.msg)
	}
}

// FuzzParseWouldEvict: whatever the controller's message, the count is
// never negative, and a count read is written in the message.
func FuzzParseWouldEvict(f *testing.F) {
	f.Add("8 published devices selected. 1 allocated devices selected. 3 pods would be evicted in 1 namespace(s) if the effect was NoExecute.")
	f.Add("Eviction only happens for the NoExecute effect.")
	f.Add("999999999 pods would be evicted")
	f.Fuzz(func(t *testing.T, msg string) {
		n, ok := parseWouldEvict(msg)
		if n < 0 || !ok && n != 0 {
			t.Fatalf("parseWouldEvict(%q) = %d, %v", msg, n, ok)
		}
		if ok && !strings.Contains(msg, fmt.Sprint(n)) {
			t.Fatalf("parseWouldEvict(%q) = %d, not in the message", msg, n)
		}
	})
}
