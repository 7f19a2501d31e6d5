package nodehealth_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
)

// policyLoadTimeout bounds the wait for the apiserver to load the policy and
// its binding; it does so from an informer, within about a second.
const policyLoadTimeout = time.Minute

// nodeSeq makes NodeHealth names unique across the suite.
var nodeSeq atomic.Int64

// release is a Release request with id, naming by as its requester.
func release(id, by string) *gpuhealthv1alpha1.ManualRequest {
	return &gpuhealthv1alpha1.ManualRequest{Action: gpuhealthv1alpha1.RequestRelease, ID: id, Reason: "false alarm", RequestedBy: by}
}

// write is a change an identity makes to the NodeHealth called name, and
// applied says, from the object as the admin reads it afterwards, whether
// it took effect.
type write struct {
	do      func(ctx context.Context, c client.Client, name string) error
	applied func(nh *gpuhealthv1alpha1.NodeHealth) bool
}

// update reads the NodeHealth, changes it and updates it.
func update(change func(*gpuhealthv1alpha1.NodeHealth), applied func(*gpuhealthv1alpha1.NodeHealth) bool) write {
	return write{
		do: func(ctx context.Context, c client.Client, name string) error {
			nh := &gpuhealthv1alpha1.NodeHealth{}
			if err := c.Get(ctx, client.ObjectKey{Name: name}, nh); err != nil {
				return err
			}
			change(nh)
			return c.Update(ctx, nh)
		},
		applied: applied,
	}
}

// setRequest makes req the NodeHealth's request.
func setRequest(req *gpuhealthv1alpha1.ManualRequest) write {
	return update(func(nh *gpuhealthv1alpha1.NodeHealth) { nh.Spec.Request = req.DeepCopy() },
		func(nh *gpuhealthv1alpha1.NodeHealth) bool { return equalRequests(nh.Spec.Request, req) })
}

// patchRequest merge-patches spec.request, as kubectl gpuhealth and
// kubectl patch do.
func patchRequest(req *gpuhealthv1alpha1.ManualRequest) write {
	return write{
		do: func(ctx context.Context, c client.Client, name string) error {
			patch := fmt.Sprintf(`{"spec":{"request":{"action":%q,"id":%q,"reason":%q,"requestedBy":%q}}}`, req.Action, req.ID, req.Reason, req.RequestedBy)
			return c.Patch(ctx, &gpuhealthv1alpha1.NodeHealth{ObjectMeta: metav1.ObjectMeta{Name: name}}, client.RawPatch(types.MergePatchType, []byte(patch)))
		},
		applied: func(nh *gpuhealthv1alpha1.NodeHealth) bool { return equalRequests(nh.Spec.Request, req) },
	}
}

// createWithRequest creates another NodeHealth, with req in its spec.
func createWithRequest(req *gpuhealthv1alpha1.ManualRequest) write {
	return write{
		do: func(ctx context.Context, c client.Client, name string) error {
			return c.Create(ctx, &gpuhealthv1alpha1.NodeHealth{
				ObjectMeta: metav1.ObjectMeta{Name: name + "-created"},
				Spec:       gpuhealthv1alpha1.NodeHealthSpec{Request: req},
			})
		},
		applied: func(*gpuhealthv1alpha1.NodeHealth) bool {
			return true // read by name+"-created" in the test
		},
	}
}

// bobsRecertify is the Recertify request r1 in bob's name.
func bobsRecertify() *gpuhealthv1alpha1.ManualRequest {
	return &gpuhealthv1alpha1.ManualRequest{Action: gpuhealthv1alpha1.RequestRecertify, ID: "r1", RequestedBy: "bob"}
}

func equalRequests(a, b *gpuhealthv1alpha1.ManualRequest) bool {
	return (a == nil) == (b == nil) && (a == nil || *a == *b)
}

func TestRequestPolicy(t *testing.T) {
	awaitPolicy(t)
	refused := func(as *identity, by string) string {
		return fmt.Sprintf("spec.request.requestedBy must be the user name you are authenticated as, %s (kubectl auth whoami shows it; kubectl gpuhealth fills it in), not %s", as.user, by)
	}
	cases := []struct {
		name string
		// before is a request bob made before the write; nil: none.
		before *gpuhealthv1alpha1.ManualRequest
		as     *identity
		write  write
		// created: the write creates name+"-created" rather than
		// changing the NodeHealth.
		created bool
		wantErr string // "": admitted; else Forbidden with this text
	}{
		{name: "alice asks for a release in her own name", as: alice, write: setRequest(release("r1", "alice"))},
		{name: "alice asks for a release by merge patch in her own name", as: alice, write: patchRequest(release("r1", "alice"))},
		{name: "alice may not ask for a release in bob's name", as: alice, write: setRequest(release("r1", "bob")), wantErr: refused(alice, `"bob"`)},
		{name: "alice may not ask for a release by merge patch in bob's name", as: alice, write: patchRequest(release("r1", "bob")), wantErr: refused(alice, `"bob"`)},
		{name: "alice may not ask for a release in no one's name", as: alice, write: setRequest(release("r1", "")), wantErr: refused(alice, "empty")},
		{
			name: "alice may not change the reason of bob's request", before: release("r1", "bob"), as: alice,
			write:   setRequest(&gpuhealthv1alpha1.ManualRequest{Action: gpuhealthv1alpha1.RequestRelease, ID: "r1", Reason: "other words", RequestedBy: "bob"}),
			wantErr: refused(alice, `"bob"`),
		},
		{
			name: "alice may not turn bob's request into a release", before: bobsRecertify(), as: alice,
			write: setRequest(release("r1", "bob")), wantErr: refused(alice, `"bob"`),
		},
		{name: "alice replaces bob's request with her own", before: release("r1", "bob"), as: alice, write: setRequest(release("r2", "alice"))},
		{name: "alice removes bob's request", before: release("r1", "bob"), as: alice, write: setRequest(nil)},
		{
			name: "alice holds a node while bob's request is in its spec", before: bobsRecertify(), as: alice,
			write: update(func(nh *gpuhealthv1alpha1.NodeHealth) { nh.Spec.Hold = true },
				func(nh *gpuhealthv1alpha1.NodeHealth) bool {
					return nh.Spec.Hold && equalRequests(nh.Spec.Request, bobsRecertify())
				}),
		},
		{
			name: "alice may not hold a node and change bob's request in one write", before: bobsRecertify(), as: alice,
			write: update(func(nh *gpuhealthv1alpha1.NodeHealth) { nh.Spec.Hold, nh.Spec.Request.ID = true, "r2" },
				func(nh *gpuhealthv1alpha1.NodeHealth) bool { return nh.Spec.Hold }),
			wantErr: refused(alice, `"bob"`),
		},
		{
			name: "alice excludes a node while bob's request is in its spec", before: release("r1", "bob"), as: alice,
			write: update(func(nh *gpuhealthv1alpha1.NodeHealth) { nh.Spec.Exclude = true },
				func(nh *gpuhealthv1alpha1.NodeHealth) bool {
					return nh.Spec.Exclude && equalRequests(nh.Spec.Request, release("r1", "bob"))
				}),
		},
		{name: "alice may not create a NodeHealth with a request in bob's name", as: alice, write: createWithRequest(release("r1", "bob")), created: true, wantErr: refused(alice, `"bob"`)},
		{name: "alice creates a NodeHealth with a request in her own name", as: alice, write: createWithRequest(release("r1", "alice")), created: true},
		{name: "an impersonated user asks in the impersonated name", as: carol, write: setRequest(release("r1", "carol"))},
		{name: "an impersonated user may not ask in the impersonator's name", as: carol, write: patchRequest(release("r1", "admin")), wantErr: refused(carol, `"admin"`)},
		{
			name: "the operator records bob's request in the status", before: release("r1", "bob"), as: operator,
			write: write{
				do: func(ctx context.Context, c client.Client, name string) error {
					nh := &gpuhealthv1alpha1.NodeHealth{}
					if err := c.Get(ctx, client.ObjectKey{Name: name}, nh); err != nil {
						return err
					}
					patch := client.MergeFrom(nh.DeepCopy())
					nh.Status.LastRequest = &gpuhealthv1alpha1.HandledRequest{ID: "r1", Action: gpuhealthv1alpha1.RequestRelease, By: "bob, manager kubectl-gpuhealth", Time: metav1.Now()}
					return c.Status().Patch(ctx, nh, patch)
				},
				applied: func(nh *gpuhealthv1alpha1.NodeHealth) bool { return nh.Status.LastRequest != nil },
			},
		},
		// The operator writes no NodeHealth after creating it but its status
		// (config/rbac): RBAC refuses a spec write before the policy sees it.
		{name: "the operator may not ask for a release in bob's name", as: operator, write: setRequest(release("r1", "bob")), wantErr: `cannot update resource "nodehealths"`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			ctx := context.Background()
			name := newNodeHealth(t)
			if tc.before != nil {
				g.Expect(setRequest(tc.before).do(ctx, bob.client, name)).To(Succeed(), "bob asks in his own name")
			}
			err := tc.write.do(ctx, tc.as.client, name)
			got := &gpuhealthv1alpha1.NodeHealth{}
			var applied bool
			if tc.created {
				t.Cleanup(func() {
					_ = admin.Delete(context.Background(), &gpuhealthv1alpha1.NodeHealth{ObjectMeta: metav1.ObjectMeta{Name: name + "-created"}})
				})
				getErr := admin.Get(ctx, client.ObjectKey{Name: name + "-created"}, got)
				g.Expect(client.IgnoreNotFound(getErr)).To(Succeed())
				applied = getErr == nil
			} else {
				g.Expect(admin.Get(ctx, client.ObjectKey{Name: name}, got)).To(Succeed())
				applied = tc.write.applied(got)
			}
			if tc.wantErr == "" {
				g.Expect(err).NotTo(HaveOccurred())
				g.Expect(applied).To(BeTrue(), "the write succeeded but the NodeHealth does not show it")
				return
			}
			g.Expect(err).To(Satisfy(apierrors.IsForbidden), "want Forbidden, got %v", err)
			g.Expect(err).To(MatchError(ContainSubstring(tc.wantErr)))
			g.Expect(applied).To(BeFalse(), "the write was refused but the NodeHealth shows it")
			if tc.before != nil {
				g.Expect(got.Spec.Request).To(Equal(tc.before), "bob's request is as he made it")
			}
		})
	}
}

// newNodeHealth has the operator create a NodeHealth with an empty spec, as
// it does for each node it manages, and returns its name.
func newNodeHealth(t *testing.T) string {
	t.Helper()
	nh := &gpuhealthv1alpha1.NodeHealth{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("gpu-node-%d", nodeSeq.Add(1))}}
	NewWithT(t).Expect(operator.client.Create(context.Background(), nh)).To(Succeed(), "the operator creates NodeHealths")
	t.Cleanup(func() { _ = admin.Delete(context.Background(), nh) })
	return nh.Name
}

// awaitPolicy waits until the apiserver enforces the policy: the apiserver
// loads policies and bindings from informers, so a request right after the
// apply may not see them yet. Each try asks with a request ID of its own:
// the policy matches only writes that change spec.request, so a try that
// landed before the policy did (and set the request) would make every later
// try with the same request a write the policy does not look at.
func awaitPolicy(t *testing.T) {
	t.Helper()
	name := newNodeHealth(t)
	try := 0
	NewWithT(t).Eventually(func(g Gomega) {
		try++
		err := patchRequest(release(fmt.Sprintf("await-%d", try), "someone-else")).do(context.Background(), alice.client, name)
		g.Expect(err).To(MatchError(ContainSubstring("spec.request.requestedBy must be the user name you are authenticated as")))
	}).WithTimeout(policyLoadTimeout).WithPolling(100 * time.Millisecond).Should(Succeed())
}
