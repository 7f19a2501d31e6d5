package devicetaint_test

import (
	"context"
	"testing"

	. "github.com/onsi/gomega"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gpuhealth/gpuhealth/remediation/devicetaint"
)

// publish creates an NVIDIA-shaped ResourceSlice of node's eight GPUs on
// the apiserver, removed after the test.
func publish(t *testing.T, g Gomega, node string) []string {
	t.Helper()
	uuids := devicetaint.UUIDs(node)
	s := devicetaint.NVIDIASlice(node, 1, uuids...)
	g.Expect(k8sClient.Create(context.Background(), s)).To(Succeed())
	t.Cleanup(func() { _ = k8sClient.Delete(context.Background(), s) })
	return uuids
}

// On the v1.37 apiserver: GPU 3, known by its UUID, is found in its
// node's slice by field selectors; its rule is created with driver, pool
// and device all set, made again without a write, changed in place when
// the effect changes, and removed on return.
func TestRuleLifecycle(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	uuids := publish(t, g, "dt-node-a")
	publish(t, g, "dt-node-b") // the same driver on another node

	d, err := devicetaint.Find(ctx, k8sClient, devicetaint.DefaultDriver, "dt-node-a", uuids[3])
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(d).To(Equal(devicetaint.Device{Driver: devicetaint.DefaultDriver, Pool: "dt-node-a", Name: "gpu-3", Node: "dt-node-a", UUID: uuids[3]}))
	_, err = devicetaint.Find(ctx, k8sClient, devicetaint.DefaultDriver, "dt-node-a", "GPU-not-here")
	g.Expect(err).To(MatchError(devicetaint.ErrNotPublished))

	want := devicetaint.Rule(d, resourcev1.DeviceTaintEffectNoSchedule, "XID-48")
	live, err := devicetaint.Ensure(ctx, k8sClient, want)
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { _ = k8sClient.Delete(context.Background(), live) })
	got := &resourcev1.DeviceTaintRule{}
	g.Expect(k8sClient.Get(ctx, client.ObjectKey{Name: "gpuhealth-dt-node-a-gpu-3"}, got)).To(Succeed())
	g.Expect(got.Spec.DeviceSelector).To(Equal(&resourcev1.DeviceTaintSelector{Driver: ptr.To("gpu.nvidia.com"), Pool: ptr.To("dt-node-a"), Device: ptr.To("gpu-3")}))
	g.Expect(got.Spec.Taint.Key).To(Equal(devicetaint.TaintKey))
	g.Expect(got.Spec.Taint.TimeAdded).NotTo(BeNil(), "stamped by the apiserver")

	again, err := devicetaint.Ensure(ctx, k8sClient, want)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(again.ResourceVersion).To(Equal(got.ResourceVersion), "nothing to change: nothing written")

	reason, err := devicetaint.Ensure(ctx, k8sClient, devicetaint.Rule(d, resourcev1.DeviceTaintEffectNoSchedule, "XID-79"))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(reason.Spec.Taint.Value).To(Equal("XID-79"))
	g.Expect(reason.Spec.Taint.TimeAdded).To(Equal(got.Spec.Taint.TimeAdded), "a new reason does not restart the eviction clock")

	// Another device whose rule name joins alike: not moved onto it.
	clash := devicetaint.Rule(devicetaint.Device{Driver: d.Driver, Pool: "dt-node", Name: "a-gpu-3", Node: "dt-node"}, resourcev1.DeviceTaintEffectNoSchedule, "XID-48")
	g.Expect(clash.Name).To(Equal(want.Name))
	_, err = devicetaint.Ensure(ctx, k8sClient, clash)
	g.Expect(err).To(MatchError(devicetaint.ErrNameTaken))

	noExecute := devicetaint.Rule(d, resourcev1.DeviceTaintEffectNoExecute, "XID-48")
	changed, err := devicetaint.Ensure(ctx, k8sClient, noExecute)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(changed.Spec.Taint.Effect).To(Equal(resourcev1.DeviceTaintEffectNoExecute))
	g.Expect(changed.Generation).To(BeNumerically(">", got.Generation))

	owned, err := devicetaint.Owned(ctx, k8sClient, "dt-node-a")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(owned).To(HaveLen(1))

	g.Expect(devicetaint.Remove(ctx, k8sClient, want.Name)).To(Succeed())
	g.Expect(apierrors.IsNotFound(k8sClient.Get(ctx, client.ObjectKey{Name: want.Name}, &resourcev1.DeviceTaintRule{}))).To(BeTrue())
	g.Expect(devicetaint.Remove(ctx, k8sClient, want.Name)).To(Succeed(), "gone already is done")
}

// A rule of gpuhealth's name that someone else made is neither changed
// nor deleted.
func TestSomeoneElsesRuleIsLeftAlone(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	uuids := publish(t, g, "dt-node-c")
	d, err := devicetaint.Find(ctx, k8sClient, devicetaint.DefaultDriver, "dt-node-c", uuids[0])
	g.Expect(err).NotTo(HaveOccurred())
	theirs := devicetaint.Rule(d, resourcev1.DeviceTaintEffectNoExecute, "maintenance")
	theirs.Labels = nil
	g.Expect(k8sClient.Create(ctx, theirs)).To(Succeed())
	t.Cleanup(func() { _ = k8sClient.Delete(context.Background(), theirs) })

	_, err = devicetaint.Ensure(ctx, k8sClient, devicetaint.Rule(d, resourcev1.DeviceTaintEffectNoSchedule, "XID-48"))
	g.Expect(err).To(MatchError(devicetaint.ErrNotOurs))
	g.Expect(devicetaint.Remove(ctx, k8sClient, theirs.Name)).To(MatchError(devicetaint.ErrNotOurs))
	got := &resourcev1.DeviceTaintRule{}
	g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(theirs), got)).To(Succeed())
	g.Expect(got.Spec.Taint.Effect).To(Equal(resourcev1.DeviceTaintEffectNoExecute), "unchanged")
	owned, err := devicetaint.Owned(ctx, k8sClient, "dt-node-c")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(owned).To(BeEmpty())
}

// A None rule is a dry run: kube-controller-manager's eviction controller
// writes how many pods NoExecute would evict into its status (written
// here as that controller does, to /status), and DryRun reads it back for
// the rule's current generation only.
func TestDryRunStatusReadBack(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	uuids := publish(t, g, "dt-node-d")
	d, err := devicetaint.Find(ctx, k8sClient, devicetaint.DefaultDriver, "dt-node-d", uuids[6])
	g.Expect(err).NotTo(HaveOccurred())
	live, err := devicetaint.Ensure(ctx, k8sClient, devicetaint.Rule(d, resourcev1.DeviceTaintEffectNone, "XID-48"))
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { _ = k8sClient.Delete(context.Background(), live) })
	_, ok := devicetaint.DryRun(live)
	g.Expect(ok).To(BeFalse(), "nothing said yet")

	meta.SetStatusCondition(&live.Status.Conditions, metav1.Condition{
		Type: resourcev1.DeviceTaintConditionEvictionInProgress, Status: metav1.ConditionFalse, Reason: "NoEffect", ObservedGeneration: live.Generation,
		Message: "1 published devices selected. 1 allocated devices selected. 2 pods would be evicted in 1 namespace(s) if the effect was NoExecute. This information will not be updated again. Recreate the DeviceTaintRule to trigger an update.",
	})
	g.Expect(k8sClient.Status().Update(ctx, live)).To(Succeed())
	got := &resourcev1.DeviceTaintRule{}
	g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(live), got)).To(Succeed())
	pods, ok := devicetaint.DryRun(got)
	g.Expect(ok).To(BeTrue())
	g.Expect(pods).To(Equal(2))

	changed, err := devicetaint.Ensure(ctx, k8sClient, devicetaint.Rule(d, resourcev1.DeviceTaintEffectNone, "XID-79"))
	g.Expect(err).NotTo(HaveOccurred())
	_, ok = devicetaint.DryRun(changed)
	g.Expect(ok).To(BeFalse(), "said of the rule's earlier generation")
}
