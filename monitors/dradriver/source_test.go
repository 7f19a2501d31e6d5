package dradriver

import (
	"context"
	"fmt"
	"regexp"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/monitors"
)

// slice is node n's slice of NVIDIA's driver in generation gen: gpu-0…3
// with uuids GPU-<n>-<i>, and the taints given by device.
func slice(node string, gen int64, taints map[int][]resourcev1.DeviceTaint) resourcev1.ResourceSlice {
	s := resourcev1.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%d", node, gen)},
		Spec: resourcev1.ResourceSliceSpec{Driver: DefaultDriver, NodeName: ptr.To(node), Pool: resourcev1.ResourcePool{Name: node, Generation: gen, ResourceSliceCount: 1}}}
	for i := range 4 {
		s.Spec.Devices = append(s.Spec.Devices, resourcev1.Device{Name: fmt.Sprintf("gpu-%d", i), Taints: taints[i],
			Attributes: map[resourcev1.QualifiedName]resourcev1.DeviceAttribute{"uuid": {StringValue: ptr.To(fmt.Sprintf("GPU-%s-%d", node, i))}}})
	}
	return s
}

func xid(v string, effect resourcev1.DeviceTaintEffect) resourcev1.DeviceTaint {
	return resourcev1.DeviceTaint{Key: XIDTaint, Value: v, Effect: effect}
}

func TestFindings(t *testing.T) {
	g := NewWithT(t)
	lost := resourcev1.DeviceTaint{Key: GPULostTaint, Effect: resourcev1.DeviceTaintEffectNoSchedule}
	got := Findings([]resourcev1.ResourceSlice{
		slice("n1", 1, map[int][]resourcev1.DeviceTaint{0: {xid("79", resourcev1.DeviceTaintEffectNoSchedule)}}), // an older generation: the driver's leftover
		slice("n1", 2, map[int][]resourcev1.DeviceTaint{
			1: {xid("48", resourcev1.DeviceTaintEffectNoSchedule)},
			2: {xid("13", resourcev1.DeviceTaintEffectNone)},                                          // the driver ignores it
			3: {xid("4x8", resourcev1.DeviceTaintEffectNoSchedule), lost, {Key: "example.com/other"}}, // not an XID; lost counts
		}),
		slice("n2", 5, map[int][]resourcev1.DeviceTaint{0: {xid("48", resourcev1.DeviceTaintEffectNoSchedule)}}), // another node
	}, DefaultDriver, "n1")
	var keys []string
	for _, f := range got {
		g.Expect(f.Source).To(Equal(gpuhealthv1alpha1.SourceDRADriver))
		g.Expect(f.Component.Kind).To(Equal(gpuhealthv1alpha1.ComponentGPU))
		keys = append(keys, fmt.Sprintf("%s %s %s", f.Check, f.Code, f.Component.ID))
	}
	g.Expect(keys).To(ConsistOf("XID 48 GPU-n1-1", "GPULost GPULost GPU-n1-3"))
}

// TestRunReportsAppearanceAndResolution: a taint is reported once when it
// appears and resolved when it goes.
func TestRunReportsAppearanceAndResolution(t *testing.T) {
	g := NewWithT(t)
	scheme := runtime.NewScheme()
	g.Expect(resourcev1.AddToScheme(scheme)).To(Succeed())
	s := slice("n1", 1, map[int][]resourcev1.DeviceTaint{1: {xid("48", resourcev1.DeviceTaintEffectNoSchedule)}})
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(&s).
		WithIndex(&resourcev1.ResourceSlice{}, "spec.nodeName", func(o client.Object) []string { return []string{*o.(*resourcev1.ResourceSlice).Spec.NodeName} }).
		WithIndex(&resourcev1.ResourceSlice{}, "spec.driver", func(o client.Object) []string { return []string{o.(*resourcev1.ResourceSlice).Spec.Driver} }).
		Build()
	var mu sync.Mutex
	var reported []monitors.Finding
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	src := &Source{NodeName: "n1", Interval: 20 * time.Millisecond, Reader: c}
	done := make(chan error, 1)
	go func() {
		done <- src.Run(ctx, func(f monitors.Finding) { mu.Lock(); reported = append(reported, f); mu.Unlock() })
	}()
	count := func() int { mu.Lock(); defer mu.Unlock(); return len(reported) }
	g.Eventually(count).Should(Equal(1))
	g.Consistently(count, 100*time.Millisecond).Should(Equal(1), "reported once, not each read")
	s.Spec.Devices[1].Taints = nil
	g.Expect(c.Update(ctx, &s)).To(Succeed())
	g.Eventually(count).Should(Equal(2))
	mu.Lock()
	g.Expect(reported[1].Resolved).To(BeTrue())
	g.Expect(reported[1].Code).To(Equal("48"))
	mu.Unlock()
	cancel()
	g.Expect(<-done).To(Succeed())
}

func TestRunNeedsTheAPIServer(t *testing.T) {
	err := (&Source{}).Run(t.Context(), func(monitors.Finding) {})
	NewWithT(t).Expect(err).To(MatchError(monitors.ErrUnavailable))
}

var code = regexp.MustCompile(`^[A-Za-z0-9]+$`)

// FuzzFinding: whatever a driver (or whoever writes the node's slices)
// puts in a taint, a finding comes out only with a component id and a
// code the NodeHealthEvent schema accepts.
func FuzzFinding(f *testing.F) {
	f.Add(XIDTaint, "48", "GPU-0")
	f.Add(XIDTaint, "0048", "GPU-0")
	f.Add(GPULostTaint, "", "GPU-1")
	f.Add(XIDTaint, "-1", "-bad")
	f.Fuzz(func(t *testing.T, key, value, uuid string) {
		fd, ok := finding(resourcev1.DeviceTaint{Key: key, Value: value, Effect: resourcev1.DeviceTaintEffectNoSchedule}, uuid, "gpu-0")
		if !ok {
			return
		}
		if !validComponentID(fd.Component.ID) || fd.Code == "" || len(fd.Code) > 128 {
			t.Fatalf("finding %+v from %q=%q on %q", fd, key, value, uuid)
		}
		if !code.MatchString(fd.Code) {
			t.Fatalf("code %q from %q", fd.Code, value)
		}
	})
}
