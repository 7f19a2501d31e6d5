package node_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/remediation/node"
)

var quarantineTaint = &corev1.Taint{Key: "gpuhealth.dev/quarantined", Effect: corev1.TaintEffectNoSchedule}

// owned is what the operator's status says it owns: the quarantine taint.
var owned = []corev1.Taint{*quarantineTaint}

// gpuTaint is a taint of the cluster's own, on every GPU node.
var gpuTaint = corev1.Taint{Key: "nvidia.com/gpu", Value: "present", Effect: corev1.TaintEffectNoSchedule}

// newNode creates a Node (deleted after the test) and returns it as stored:
// the apiserver's TaintNodesByCondition admission adds the taint
// node.kubernetes.io/not-ready to a new Node.
func newNode(t *testing.T, g *WithT, spec corev1.NodeSpec) *corev1.Node {
	t.Helper()
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{GenerateName: "gpu-node-"}, Spec: spec}
	g.Expect(k8sClient.Create(context.Background(), n, client.FieldOwner("test-setup"))).To(Succeed())
	t.Cleanup(func() { _ = k8sClient.Delete(context.Background(), n) })
	return n
}

func get(g *WithT, name string) *corev1.Node {
	n := &corev1.Node{}
	g.ExpectWithOffset(1, k8sClient.Get(context.Background(), client.ObjectKey{Name: name}, n)).To(Succeed())
	return n
}

// bump writes the node behind the caller's back, so any copy read before is stale.
func bump(ctx context.Context, g *WithT, c client.Client, name string) {
	n := &corev1.Node{}
	g.ExpectWithOffset(1, c.Get(ctx, client.ObjectKey{Name: name}, n)).To(Succeed())
	if n.Labels == nil {
		n.Labels = map[string]string{}
	}
	n.Labels["bumped"] = n.ResourceVersion
	g.ExpectWithOffset(1, c.Update(ctx, n)).To(Succeed())
}

// writesNothing runs write with a client that counts the writes it sends,
// and checks that it sent none and that the node's resourceVersion stayed.
// (The resourceVersion alone would not tell: the apiserver turns a patch
// that changes nothing into a no-op.)
func writesNothing(g *WithT, name, what string, write func(client.Client) error) {
	rv := get(g, name).ResourceVersion
	writes := 0
	c := interceptor.NewClient(watchClient, interceptor.Funcs{
		Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
			writes++
			return c.Patch(ctx, obj, patch, opts...)
		},
		Update: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
			writes++
			return c.Update(ctx, obj, opts...)
		},
		SubResourcePatch: func(ctx context.Context, c client.Client, sub string, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
			writes++
			return c.SubResource(sub).Patch(ctx, obj, patch, opts...)
		},
		SubResourceUpdate: func(ctx context.Context, c client.Client, sub string, obj client.Object, opts ...client.SubResourceUpdateOption) error {
			writes++
			return c.SubResource(sub).Update(ctx, obj, opts...)
		},
	})
	g.ExpectWithOffset(1, write(c)).To(Succeed())
	g.ExpectWithOffset(1, writes).To(BeZero(), "%s sends no write", what)
	g.ExpectWithOffset(1, get(g, name).ResourceVersion).To(Equal(rv), "%s changes nothing", what)
}

// unchanged turns a write's "changed" into an error.
func unchanged(changed bool, err error) error {
	if err == nil && changed {
		return errors.New("changed the node")
	}
	return err
}

func TestQuarantineAndRelease(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	n := newNode(t, g, corev1.NodeSpec{Taints: []corev1.Taint{gpuTaint}})
	created := n.Spec.Taints
	g.Expect(created).To(ContainElement(gpuTaint))

	g.Expect(node.Quarantine(ctx, k8sClient, n, true, quarantineTaint, "Quarantined")).To(Succeed())
	live := get(g, n.Name)
	g.Expect(live.Spec.Unschedulable).To(BeTrue())
	g.Expect(live.Spec.Taints).To(ConsistOf(append(slices.Clone(created), *quarantineTaint)), "the cluster's taints stay")
	g.Expect(live.Annotations).To(HaveKeyWithValue(node.AppliedAnnotation, "cordon,taint=gpuhealth.dev/quarantined:NoSchedule"))
	g.Expect(live.Labels).To(HaveKeyWithValue(node.PhaseLabel, "Quarantined"))
	g.Expect(node.PreexistingOn(live, quarantineTaint)).To(Equal(node.Preexisting{}), "all of it is ours")

	writesNothing(g, n.Name, "a second Quarantine", func(c client.Client) error {
		return node.Quarantine(ctx, c, live, true, quarantineTaint, "Quarantined")
	})

	g.Expect(node.Quarantine(ctx, k8sClient, live, true, quarantineTaint, "Draining")).To(Succeed())
	live = get(g, n.Name)
	g.Expect(live.Labels).To(HaveKeyWithValue(node.PhaseLabel, "Draining"))
	g.Expect(live.Annotations).To(HaveKeyWithValue(node.AppliedAnnotation, "cordon,taint=gpuhealth.dev/quarantined:NoSchedule"), "a phase change keeps the record")

	g.Expect(node.Release(ctx, k8sClient, live, owned)).To(Succeed())
	live = get(g, n.Name)
	g.Expect(live.Spec.Unschedulable).To(BeFalse())
	g.Expect(live.Spec.Taints).To(ConsistOf(created))
	g.Expect(live.Annotations).NotTo(HaveKey(node.AppliedAnnotation))
	g.Expect(live.Labels).NotTo(HaveKey(node.PhaseLabel))

	writesNothing(g, n.Name, "a second Release", func(c client.Client) error {
		return node.Release(ctx, c, live, owned)
	})
}

// The policy's taint changes while the node is out of service (to a key
// the node already carried: a dedicated-node taint): Release removes the
// taint gpuhealth added, not the one the policy names now, and never the
// node's own.
func TestReleaseRemovesWhatWasAddedNotWhatThePolicyNamesNow(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	dedicated := corev1.Taint{Key: "dedicated", Value: "ml", Effect: corev1.TaintEffectNoSchedule}
	n := newNode(t, g, corev1.NodeSpec{Taints: []corev1.Taint{dedicated, gpuTaint}})
	created := n.Spec.Taints
	g.Expect(node.Quarantine(ctx, k8sClient, n, true, quarantineTaint, "Quarantined")).To(Succeed())
	live := get(g, n.Name)
	// The policy now names the dedicated key: nothing new is added, and
	// the node's own taint is not taken for ours.
	now := &corev1.Taint{Key: dedicated.Key, Effect: dedicated.Effect}
	g.Expect(node.Quarantine(ctx, k8sClient, live, true, now, "Draining")).To(Succeed())
	live = get(g, n.Name)
	g.Expect(live.Annotations).To(HaveKeyWithValue(node.AppliedAnnotation, "cordon,taint=gpuhealth.dev/quarantined:NoSchedule"))
	g.Expect(node.PreexistingOn(live, now).Taints).To(ConsistOf(dedicated), "the dedicated taint was there before")
	g.Expect(node.Release(ctx, k8sClient, live, owned)).To(Succeed())
	live = get(g, n.Name)
	g.Expect(live.Spec.Taints).To(ConsistOf(created), "ours went, the node's own stayed")
	g.Expect(live.Spec.Unschedulable).To(BeFalse())
}

// The node's kubelet may write its own annotations but not its taints: it
// writes the applied annotation to claim an administrator's taint as
// gpuhealth's. Release removes only what the operator's status owns too.
func TestReleaseIgnoresAClaimTheStatusDoesNotOwn(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	dedicated := corev1.Taint{Key: "dedicated", Value: "ml", Effect: corev1.TaintEffectNoExecute}
	n := newNode(t, g, corev1.NodeSpec{Taints: []corev1.Taint{dedicated}})
	created := n.Spec.Taints
	g.Expect(node.Quarantine(ctx, k8sClient, n, true, quarantineTaint, "Quarantined")).To(Succeed())
	live := get(g, n.Name)
	patch := client.MergeFrom(live.DeepCopy())
	live.Annotations[node.AppliedAnnotation] = "cordon,taint=gpuhealth.dev/quarantined:NoSchedule,taint=dedicated:NoExecute"
	g.Expect(k8sClient.Patch(ctx, live, patch)).To(Succeed())
	live = get(g, n.Name)
	g.Expect(node.Release(ctx, k8sClient, live, owned)).To(Succeed())
	live = get(g, n.Name)
	g.Expect(live.Spec.Taints).To(ConsistOf(created), "the administrator's taint stays, ours went")
	g.Expect(live.Annotations).NotTo(HaveKey(node.AppliedAnnotation))
}

func TestReleaseKeepsPreexisting(t *testing.T) {
	humanTaint := corev1.Taint{Key: quarantineTaint.Key, Value: "by-hand", Effect: quarantineTaint.Effect}
	cases := []struct {
		name        string
		spec        corev1.NodeSpec
		wantApplied string
		wantPre     node.Preexisting
	}{
		{
			name:        "a human's cordon and taint are recorded as theirs and stay",
			spec:        corev1.NodeSpec{Unschedulable: true, Taints: []corev1.Taint{humanTaint, gpuTaint}},
			wantApplied: "",
			wantPre:     node.Preexisting{Cordon: true, Taints: []corev1.Taint{humanTaint}},
		},
		{
			name:        "a human's cordon stays, our taint goes",
			spec:        corev1.NodeSpec{Unschedulable: true, Taints: []corev1.Taint{gpuTaint}},
			wantApplied: "taint=gpuhealth.dev/quarantined:NoSchedule",
			wantPre:     node.Preexisting{Cordon: true},
		},
		{
			name:        "a human's taint stays, our cordon goes",
			spec:        corev1.NodeSpec{Taints: []corev1.Taint{humanTaint}},
			wantApplied: "cordon",
			wantPre:     node.Preexisting{Taints: []corev1.Taint{humanTaint}},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			ctx := context.Background()
			n := newNode(t, g, tc.spec)
			created := n.DeepCopy()
			g.Expect(node.Quarantine(ctx, k8sClient, n, true, quarantineTaint, "Quarantined")).To(Succeed())
			live := get(g, n.Name)
			if tc.wantApplied == "" {
				g.Expect(live.Annotations).NotTo(HaveKey(node.AppliedAnnotation), "nothing of ours to record")
			} else {
				g.Expect(live.Annotations).To(HaveKeyWithValue(node.AppliedAnnotation, tc.wantApplied))
			}
			g.Expect(node.PreexistingOn(live, quarantineTaint)).To(Equal(tc.wantPre))
			g.Expect(live.Labels).To(HaveKeyWithValue(node.PhaseLabel, "Quarantined"))

			g.Expect(node.Release(ctx, k8sClient, live, owned)).To(Succeed())
			live = get(g, n.Name)
			g.Expect(live.Spec.Unschedulable).To(Equal(created.Spec.Unschedulable), "Release puts back the cordon as it was")
			g.Expect(live.Spec.Taints).To(ConsistOf(created.Spec.Taints), "Release puts back the taints as they were")
			g.Expect(live.Annotations).NotTo(HaveKey(node.AppliedAnnotation))
			g.Expect(live.Labels).NotTo(HaveKey(node.PhaseLabel))

			writesNothing(g, n.Name, "a second Release", func(c client.Client) error {
				return node.Release(ctx, c, live, owned)
			})
		})
	}
}

// condition returns the node's GPUHealthy condition.
func condition(g *WithT, n *corev1.Node) corev1.NodeCondition {
	for _, c := range n.Status.Conditions {
		if c.Type == gpuhealthv1alpha1.GPUHealthyNodeCondition {
			return c
		}
	}
	g.ExpectWithOffset(1, n.Status.Conditions).To(ContainElement(HaveField("Type", gpuhealthv1alpha1.GPUHealthyNodeCondition)))
	return corev1.NodeCondition{}
}

func TestSetGPUHealthy(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	n := newNode(t, g, corev1.NodeSpec{})
	t0 := metav1.NewTime(time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC))
	t1, t2 := metav1.NewTime(t0.Add(time.Minute)), metav1.NewTime(t0.Add(2*time.Minute))
	// The kubelet's condition, which gpuhealth's patches keep.
	ready := corev1.NodeCondition{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady", LastHeartbeatTime: t0, LastTransitionTime: t0}
	n.Status.Conditions = []corev1.NodeCondition{ready}
	g.Expect(k8sClient.Status().Update(ctx, n)).To(Succeed())

	g.Expect(node.SetGPUHealthy(ctx, k8sClient, n, corev1.ConditionFalse, "XID", "XID 79 on GPU 3", t0)).To(Succeed())
	live := get(g, n.Name)
	c := condition(g, live)
	g.Expect(c.Status).To(Equal(corev1.ConditionFalse))
	g.Expect(c.LastTransitionTime.Time).To(BeTemporally("==", t0.Time))
	g.Expect(live.Status.Conditions).To(ContainElement(And(HaveField("Type", corev1.NodeReady), HaveField("Reason", ready.Reason))),
		"the kubelet's conditions stay")

	writesNothing(g, n.Name, "the same condition again", func(c client.Client) error {
		return node.SetGPUHealthy(ctx, c, live, corev1.ConditionFalse, "XID", "XID 79 on GPU 3", t1)
	})

	g.Expect(node.SetGPUHealthy(ctx, k8sClient, live, corev1.ConditionFalse, "XID", "XID 79 on GPUs 3 and 5", t1)).To(Succeed())
	c = condition(g, get(g, n.Name))
	g.Expect(c.Message).To(Equal("XID 79 on GPUs 3 and 5"))
	g.Expect(c.LastTransitionTime.Time).To(BeTemporally("==", t0.Time), "only the message changed: no transition")
	g.Expect(c.LastHeartbeatTime.Time).To(BeTemporally("==", t1.Time))

	g.Expect(node.SetGPUHealthy(ctx, k8sClient, live, corev1.ConditionTrue, "Recertified", "", t2)).To(Succeed())
	c = condition(g, get(g, n.Name))
	g.Expect(c.Status).To(Equal(corev1.ConditionTrue))
	g.Expect(c.LastTransitionTime.Time).To(BeTemporally("==", t2.Time), "the status changed: a transition")

	// A node deleted under us is not an error: there is nothing to mark.
	g.Expect(k8sClient.Delete(ctx, live)).To(Succeed())
	g.Expect(node.SetGPUHealthy(ctx, k8sClient, live, corev1.ConditionFalse, "XID", "again", t2)).To(Succeed())
}

func TestFabricTaint(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	n := newNode(t, g, corev1.NodeSpec{Taints: []corev1.Taint{gpuTaint}})
	created := n.Spec.Taints
	withFabric := append(slices.Clone(created), node.FabricTaint)

	changed, err := node.TaintFabric(ctx, k8sClient, n, "clique-a", time.Now())
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(changed).To(BeTrue())
	live := get(g, n.Name)
	g.Expect(live.Spec.Taints).To(ConsistOf(withFabric))
	g.Expect(live.Annotations).To(HaveKeyWithValue(node.FabricAnnotation, "clique-a"))

	writesNothing(g, n.Name, "a second TaintFabric", func(c client.Client) error {
		return unchanged(node.TaintFabric(ctx, c, live, "clique-a", time.Now()))
	})

	changed, err = node.TaintFabric(ctx, k8sClient, live, "clique-b", time.Now())
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(changed).To(BeTrue(), "another clique is recorded")
	live = get(g, n.Name)
	g.Expect(live.Spec.Taints).To(ConsistOf(withFabric), "still one fabric taint")
	g.Expect(live.Annotations).To(HaveKeyWithValue(node.FabricAnnotation, "clique-b"))

	changed, err = node.UntaintFabric(ctx, k8sClient, live)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(changed).To(BeTrue())
	live = get(g, n.Name)
	g.Expect(live.Spec.Taints).To(ConsistOf(created))
	g.Expect(live.Annotations).NotTo(HaveKey(node.FabricAnnotation))

	writesNothing(g, n.Name, "a second UntaintFabric", func(c client.Client) error {
		return unchanged(node.UntaintFabric(ctx, c, live))
	})
}

func TestFabricTaintOfSomeoneElse(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	n := newNode(t, g, corev1.NodeSpec{Taints: []corev1.Taint{node.FabricTaint}})
	writesNothing(g, n.Name, "TaintFabric of a node another tool tainted", func(c client.Client) error {
		return unchanged(node.TaintFabric(ctx, c, n, "clique-a", time.Now()))
	})
	writesNothing(g, n.Name, "UntaintFabric of a node another tool tainted", func(c client.Client) error {
		return unchanged(node.UntaintFabric(ctx, c, n))
	})
	g.Expect(get(g, n.Name).Spec.Taints).To(ContainElement(node.FabricTaint), "a fabric taint without our annotation is not ours to touch")
}

// writer is one of the package's writes, to run against a node prepared for
// it (so that it has something to write).
type writer struct {
	name    string
	prefix  string
	prepare func(context.Context, *WithT, *corev1.Node)
	write   func(context.Context, client.Client, *corev1.Node) error
}

var writers = []writer{
	{
		name: "Quarantine", prefix: "quarantining node",
		write: func(ctx context.Context, c client.Client, n *corev1.Node) error {
			return node.Quarantine(ctx, c, n, true, quarantineTaint, "Quarantined")
		},
	},
	{
		name: "Release", prefix: "releasing node",
		prepare: func(ctx context.Context, g *WithT, n *corev1.Node) {
			g.Expect(node.Quarantine(ctx, k8sClient, n, true, quarantineTaint, "Quarantined")).To(Succeed())
		},
		write: func(ctx context.Context, c client.Client, n *corev1.Node) error {
			return node.Release(ctx, c, n, owned)
		},
	},
	{
		name: "SetGPUHealthy", prefix: "setting condition GPUHealthy on node",
		write: func(ctx context.Context, c client.Client, n *corev1.Node) error {
			return node.SetGPUHealthy(ctx, c, n, corev1.ConditionFalse, "XID", "XID 79", metav1.Now())
		},
	},
	{
		name: "TaintFabric", prefix: "tainting node",
		write: func(ctx context.Context, c client.Client, n *corev1.Node) error {
			changed, err := node.TaintFabric(ctx, c, n, "clique-a", time.Now())
			if changed && err != nil {
				return errors.New("TaintFabric says it changed the node and failed")
			}
			return err
		},
	},
	{
		name: "UntaintFabric", prefix: "lifting the fabric-degraded taint from node",
		prepare: func(ctx context.Context, g *WithT, n *corev1.Node) {
			_, err := node.TaintFabric(ctx, k8sClient, n, "clique-a", time.Now())
			g.Expect(err).NotTo(HaveOccurred())
		},
		write: func(ctx context.Context, c client.Client, n *corev1.Node) error {
			changed, err := node.UntaintFabric(ctx, c, n)
			if changed && err != nil {
				return errors.New("UntaintFabric says it changed the node and failed")
			}
			return err
		},
	},
}

// expectWrapped checks that err is the write's own error wrapping a
// Conflict with %w, so the caller can still tell it is one.
func expectWrapped(g *WithT, w writer, n *corev1.Node, err error, is func(error) bool) {
	g.ExpectWithOffset(1, err).To(HaveOccurred())
	g.ExpectWithOffset(1, is(err)).To(BeTrue(), "wrapped with %%w: %v", err)
	g.ExpectWithOffset(1, errors.Unwrap(err)).NotTo(BeNil(), "%v", err)
	g.ExpectWithOffset(1, strings.HasPrefix(err.Error(), w.prefix+" "+n.Name)).To(BeTrue(), "%v", err)
}

func TestStaleCopyConflicts(t *testing.T) {
	for _, w := range writers {
		t.Run(w.name, func(t *testing.T) {
			g := NewWithT(t)
			ctx := context.Background()
			n := newNode(t, g, corev1.NodeSpec{})
			if w.prepare != nil {
				w.prepare(ctx, g, n)
			}
			stale := get(g, n.Name)
			bump(ctx, g, k8sClient, n.Name)
			before := get(g, n.Name)

			expectWrapped(g, w, n, w.write(ctx, k8sClient, stale), apierrors.IsConflict)
			after := get(g, n.Name)
			g.Expect(after.ResourceVersion).To(Equal(before.ResourceVersion), "the stale write did not land")

			// Read again, the same write goes through.
			g.Expect(w.write(ctx, k8sClient, after)).To(Succeed())
			g.Expect(get(g, n.Name).ResourceVersion).NotTo(Equal(before.ResourceVersion))
		})
	}
}

func TestConflictsThroughInterceptor(t *testing.T) {
	for _, w := range writers {
		t.Run(w.name+" races another writer", func(t *testing.T) {
			// The node is written between the writer's read and its
			// patch: the apiserver's own Conflict comes back.
			g := NewWithT(t)
			ctx := context.Background()
			n := newNode(t, g, corev1.NodeSpec{})
			if w.prepare != nil {
				w.prepare(ctx, g, n)
			}
			n = get(g, n.Name)
			raced := 0
			c := interceptor.NewClient(watchClient, interceptor.Funcs{
				Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
					raced++
					bump(ctx, g, c, obj.GetName())
					return c.Patch(ctx, obj, patch, opts...)
				},
				SubResourcePatch: func(ctx context.Context, c client.Client, sub string, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
					raced++
					bump(ctx, g, c, obj.GetName())
					return c.SubResource(sub).Patch(ctx, obj, patch, opts...)
				},
			})
			expectWrapped(g, w, n, w.write(ctx, c, n), apierrors.IsConflict)
			g.Expect(raced).To(Equal(1), "one patch, no retry of its own: the caller reads again")
		})
		t.Run(w.name+" gets a forced error", func(t *testing.T) {
			g := NewWithT(t)
			ctx := context.Background()
			n := newNode(t, g, corev1.NodeSpec{})
			if w.prepare != nil {
				w.prepare(ctx, g, n)
			}
			n = get(g, n.Name)
			var forced error
			fail := func() error { return forced }
			c := interceptor.NewClient(watchClient, interceptor.Funcs{
				Patch: func(context.Context, client.WithWatch, client.Object, client.Patch, ...client.PatchOption) error {
					return fail()
				},
				SubResourcePatch: func(context.Context, client.Client, string, client.Object, client.Patch, ...client.SubResourcePatchOption) error {
					return fail()
				},
			})
			forced = apierrors.NewConflict(corev1.Resource("nodes"), n.Name, errors.New("forced"))
			expectWrapped(g, w, n, w.write(ctx, c, n.DeepCopy()), apierrors.IsConflict)

			forced = apierrors.NewNotFound(corev1.Resource("nodes"), n.Name)
			err := w.write(ctx, c, n.DeepCopy())
			if w.name == "SetGPUHealthy" {
				g.Expect(err).NotTo(HaveOccurred(), "a node gone has no condition to set")
				return
			}
			expectWrapped(g, w, n, err, apierrors.IsNotFound)
		})
	}
}
