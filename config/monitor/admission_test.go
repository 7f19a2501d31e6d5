package monitor_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	authenticationv1 "k8s.io/api/authentication/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
)

// policyLoadTimeout bounds the wait for the apiserver to load the policy and
// its binding; it does so from an informer, within about a second.
const policyLoadTimeout = time.Minute

// eventSeq makes event names unique across the suite.
var eventSeq atomic.Int64

func TestTokenNamesTheBoundNode(t *testing.T) {
	cases := []struct {
		name     string
		as       *identity
		wantUser string
		wantNode []string // nil: the token carries no node name
	}{
		{
			name:     "a token bound to the agent's Pod on node-a names node-a",
			as:       monitorA,
			wantUser: monitorUser,
			wantNode: []string{nodeA},
		},
		{
			name:     "a token bound to the agent's Pod on node-b names node-b",
			as:       monitorB,
			wantUser: monitorUser,
			wantNode: []string{nodeB},
		},
		{
			name:     "a token bound to no Pod names no node",
			as:       monitorUnbound,
			wantUser: monitorUser,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			review, err := tc.as.clientset.AuthenticationV1().SelfSubjectReviews().Create(
				context.Background(), &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(review.Status.UserInfo.Username).To(Equal(tc.wantUser))
			g.Expect([]string(review.Status.UserInfo.Extra[nodeNameExtra])).To(Equal(tc.wantNode))
		})
	}
}

// write is a change an identity makes to a NodeHealthEvent about a node.
type write string

const (
	// createEvent creates the event, as the agent does for a new finding.
	createEvent write = "create"
	// patchStatus merge-patches the status of an event the admin created,
	// as the agent does for a repeat (count, lastSeen).
	patchStatus write = "patch status"
	// patchEvent merge-patches the labels of an event the admin created.
	patchEvent write = "patch"
)

func TestOwnNodePolicy(t *testing.T) {
	awaitPolicy(t)
	deniedA2B := "gpuhealth-monitor on node node-a may only write NodeHealthEvents about its own node, not node-b"
	deniedUnbound := "gpuhealth-monitor must authenticate with a service-account token bound to its Pod"
	cases := []struct {
		name    string
		as      *identity
		write   write
		node    string
		wantErr string // "": allowed; else the request is Forbidden with this text
	}{
		{name: "the agent creates an event about its own node", as: monitorA, write: createEvent, node: nodeA},
		{name: "the agent patches the status of its own node's event", as: monitorA, write: patchStatus, node: nodeA},
		{
			name: "the agent may not patch an event's metadata or spec, even its own node's", as: monitorA, write: patchEvent, node: nodeA,
			wantErr: `cannot patch resource "nodehealthevents"`,
		},
		{name: "the agent may not create an event about another node", as: monitorA, write: createEvent, node: nodeB, wantErr: deniedA2B},
		{name: "the agent may not patch the status of another node's event", as: monitorA, write: patchStatus, node: nodeB, wantErr: deniedA2B},
		{name: "the agent on node-b creates an event about node-b", as: monitorB, write: createEvent, node: nodeB},
		{
			name: "the agent on node-b may not create an event about node-a", as: monitorB, write: createEvent, node: nodeA,
			wantErr: "gpuhealth-monitor on node node-b may only write NodeHealthEvents about its own node, not node-a",
		},
		{name: "a token bound to no Pod may not create an event", as: monitorUnbound, write: createEvent, node: nodeA, wantErr: deniedUnbound},
		{name: "a token bound to no Pod may not patch an event's status", as: monitorUnbound, write: patchStatus, node: nodeA, wantErr: deniedUnbound},
		{name: "an agent installed in another namespace creates an event about its own node", as: monitorElsewhere, write: createEvent, node: nodeA},
		{name: "an agent installed in another namespace may not create an event about another node", as: monitorElsewhere, write: createEvent, node: nodeB, wantErr: deniedA2B},
		{name: "the operator, whose Pod runs on node-a, patches the status of node-b's event", as: operatorA, write: patchStatus, node: nodeB},
		{name: "the admin creates an event about any node", as: adminIdentity, write: createEvent, node: nodeB},
		{name: "the admin patches the status of any node's event", as: adminIdentity, write: patchStatus, node: nodeA},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			applied, err := do(t, tc.as, tc.write, tc.node)
			if tc.wantErr == "" {
				g.Expect(err).NotTo(HaveOccurred())
				g.Expect(applied).To(BeTrue(), "the write succeeded but the event does not show it")
				return
			}
			g.Expect(err).To(Satisfy(apierrors.IsForbidden), "want Forbidden, got %v", err)
			g.Expect(err).To(MatchError(ContainSubstring(tc.wantErr)))
			g.Expect(applied).To(BeFalse(), "the write was denied but the event shows it")
		})
	}
}

func TestOwnNamePolicy(t *testing.T) {
	awaitPolicy(t)
	denied := func(node, name string) string {
		return fmt.Sprintf("gpuhealth-monitor on node %s may only create NodeHealthEvents under its own node's names (%s-nvml-xid-<hash>), not %s", node, node, name)
	}
	// renamed is an event about node under the name rename gives it.
	renamed := func(node string, rename func(*gpuhealthv1alpha1.NodeHealthEventSpec) string) *gpuhealthv1alpha1.NodeHealthEvent {
		ev := newEvent(node)
		ev.Name = rename(&ev.Spec)
		return ev
	}
	nameOf := func(node string) func(*gpuhealthv1alpha1.NodeHealthEventSpec) string {
		return func(s *gpuhealthv1alpha1.NodeHealthEventSpec) string {
			other := *s
			other.NodeName = node
			return other.EventName()
		}
	}
	alternate := func(s *gpuhealthv1alpha1.NodeHealthEventSpec) string { return s.AlternateEventName(s.EventName(), 1) }
	cases := []struct {
		name  string
		as    *identity
		event *gpuhealthv1alpha1.NodeHealthEvent
		// wantDenied: the create is Forbidden with denied(node, event's name).
		wantDenied bool
	}{
		{name: "the agent creates an event under its name", as: monitorA, event: newEvent(nodeA)},
		{name: "the agent creates an event under its alternate name", as: monitorA, event: renamed(nodeA, alternate)},
		{
			name: "the agent may not create an event of its node under the name of node-b's same finding", as: monitorA,
			event: renamed(nodeA, nameOf(nodeB)), wantDenied: true,
		},
		{
			name: "the agent may not create an event under a name of a node whose name starts with its own", as: monitorA,
			event: renamed(nodeA, nameOf(nodeA+"2")), wantDenied: true,
		},
		{
			name: "the agent may not create an event under the name of another source and check", as: monitorA,
			event: renamed(nodeA, func(s *gpuhealthv1alpha1.NodeHealthEventSpec) string {
				return gpuhealthv1alpha1.EventName(s.NodeName, gpuhealthv1alpha1.SourceKmsg, gpuhealthv1alpha1.CheckECC, s.Component.ID, s.Code)
			}),
			wantDenied: true,
		},
		{
			name: "the agent may not create an event under a name of its node without the hash", as: monitorA,
			event: renamed(nodeA, func(*gpuhealthv1alpha1.NodeHealthEventSpec) string { return nodeA + "-nvml-xid-79" }), wantDenied: true,
		},
		{
			name: "the agent may not create an event under a name with three hashes", as: monitorA,
			event: renamed(nodeA, func(s *gpuhealthv1alpha1.NodeHealthEventSpec) string { return alternate(s) + "-0123456789" }), wantDenied: true,
		},
		{name: "the agent on a node with a long name creates an event under its cut name", as: monitorLong, event: newEvent(longNode)},
		{name: "the agent on a node with a long name creates an event under its alternate name", as: monitorLong, event: renamed(longNode, alternate)},
		{
			name: "the agent on a node with a long name may not create an event under a shorter cut of it", as: monitorLong,
			event: renamed(longNode, func(s *gpuhealthv1alpha1.NodeHealthEventSpec) string {
				name := s.EventName()
				return name[:231] + name[232:]
			}),
			wantDenied: true,
		},
		{name: "the admin creates an event of node-a under node-b's name", as: adminIdentity, event: renamed(nodeA, nameOf(nodeB))},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			ctx := context.Background()
			t.Cleanup(func() { _ = admin.Delete(context.Background(), tc.event) })
			err := tc.as.client.Create(ctx, tc.event)
			getErr := admin.Get(ctx, client.ObjectKeyFromObject(tc.event), &gpuhealthv1alpha1.NodeHealthEvent{})
			g.Expect(client.IgnoreNotFound(getErr)).To(Succeed())
			if !tc.wantDenied {
				g.Expect(err).NotTo(HaveOccurred())
				g.Expect(getErr).NotTo(HaveOccurred())
				return
			}
			g.Expect(err).To(Satisfy(apierrors.IsForbidden), "want Forbidden, got %v", err)
			g.Expect(err).To(MatchError(ContainSubstring(denied(tc.event.Spec.NodeName, tc.event.Name))))
			g.Expect(getErr).To(Satisfy(apierrors.IsNotFound), "the create was denied but the event exists")
		})
	}
}

func TestOwnNamePolicyAllowsUpdatesUnderOtherNames(t *testing.T) {
	awaitPolicy(t)
	g := NewWithT(t)
	ctx := context.Background()
	// An event of node-a the admin created under a name of no monitor's.
	ev := newEvent(nodeA)
	ev.Name = nodeA + "-by-hand"
	g.Expect(admin.Create(ctx, ev)).To(Succeed())
	t.Cleanup(func() { _ = admin.Delete(context.Background(), ev) })
	got := &gpuhealthv1alpha1.NodeHealthEvent{}
	g.Expect(monitorA.client.Get(ctx, client.ObjectKeyFromObject(ev), got)).To(Succeed())
	patch := client.MergeFrom(got.DeepCopy())
	got.Status.Count = 3
	g.Expect(monitorA.client.Status().Patch(ctx, got, patch)).To(Succeed(), "the name is checked on create only")
}

// do makes the write as the identity and reports, as the admin sees it
// afterwards, whether the write took effect.
func do(t *testing.T, as *identity, w write, node string) (applied bool, err error) {
	t.Helper()
	g := NewWithT(t)
	ctx := context.Background()
	ev := newEvent(node)
	key := client.ObjectKeyFromObject(ev)
	t.Cleanup(func() { _ = admin.Delete(context.Background(), ev) })
	got := &gpuhealthv1alpha1.NodeHealthEvent{}

	if w == createEvent {
		err = as.client.Create(ctx, ev)
		getErr := admin.Get(ctx, key, got)
		g.Expect(client.IgnoreNotFound(getErr)).To(Succeed())
		return getErr == nil, err
	}

	g.Expect(admin.Create(ctx, ev)).To(Succeed())
	// Read it as the identity, as the agent does before a write; every
	// identity here may read events.
	g.Expect(as.client.Get(ctx, key, got)).To(Succeed())
	switch w {
	case patchStatus:
		patch := client.MergeFrom(got.DeepCopy())
		got.Status.Count = 7
		err = as.client.Status().Patch(ctx, got, patch)
	case patchEvent:
		err = as.client.Patch(ctx, got, client.RawPatch(types.MergePatchType,
			[]byte(`{"metadata":{"labels":{"gpuhealth.dev/test":"patched"}}}`)))
	default:
		t.Fatalf("unknown write %q", w)
	}
	after := &gpuhealthv1alpha1.NodeHealthEvent{}
	g.Expect(admin.Get(ctx, key, after)).To(Succeed())
	return after.Status.Count == 7 || after.Labels["gpuhealth.dev/test"] == "patched", err
}

// awaitPolicy waits until the apiserver enforces the policy: the apiserver
// loads policies and bindings from informers, so a request right after the
// apply may not see them yet.
func awaitPolicy(t *testing.T) {
	t.Helper()
	NewWithT(t).Eventually(func(g Gomega) {
		ev := newEvent(nodeB)
		err := monitorA.client.Create(context.Background(), ev)
		if err == nil {
			g.Expect(admin.Delete(context.Background(), ev)).To(Succeed())
		}
		g.Expect(err).To(MatchError(ContainSubstring("may only write NodeHealthEvents about its own node")))
	}).WithTimeout(policyLoadTimeout).WithPolling(100 * time.Millisecond).Should(Succeed())
}

// newEvent is an XID 79 finding about node, of a GPU unique in the suite,
// under the name the monitor gives it.
func newEvent(node string) *gpuhealthv1alpha1.NodeHealthEvent {
	spec := gpuhealthv1alpha1.NodeHealthEventSpec{
		NodeName:          node,
		Source:            gpuhealthv1alpha1.SourceNVML,
		Check:             gpuhealthv1alpha1.CheckXID,
		Component:         gpuhealthv1alpha1.Component{Kind: gpuhealthv1alpha1.ComponentGPU, ID: fmt.Sprintf("GPU-8f6c2b1e-4d3a-4b7e-9c51-%012d", eventSeq.Add(1))},
		Code:              "79",
		Severity:          gpuhealthv1alpha1.SeverityFatal,
		RecommendedAction: gpuhealthv1alpha1.ActionRebootNode,
		Message:           "GPU has fallen off the bus",
	}
	return &gpuhealthv1alpha1.NodeHealthEvent{ObjectMeta: metav1.ObjectMeta{Name: spec.EventName()}, Spec: spec}
}

// TestOwnInventoryPolicy: each agent writes the NodeInventory of its own
// node only, by name and by spec.nodeName; a token bound to no Pod writes
// none; the admin writes any.
func TestOwnInventoryPolicy(t *testing.T) {
	awaitPolicy(t)
	ctx := context.Background()
	inv := func(name, node string) *gpuhealthv1alpha1.NodeInventory {
		return &gpuhealthv1alpha1.NodeInventory{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: gpuhealthv1alpha1.NodeInventorySpec{NodeName: node, ObservedAt: metav1.Now()}}
	}
	g := NewWithT(t)
	// The inventory policy loads beside the event policy; wait for it too.
	g.Eventually(func(g Gomega) {
		err := monitorA.client.Create(ctx, inv(nodeB, nodeB))
		if err == nil {
			g.Expect(admin.Delete(ctx, inv(nodeB, nodeB))).To(Succeed())
		}
		g.Expect(err).To(MatchError(ContainSubstring("may only write the NodeInventory of its own node, not node-b")))
	}).WithTimeout(policyLoadTimeout).WithPolling(100 * time.Millisecond).Should(Succeed())

	own := inv(nodeA, nodeA)
	g.Expect(monitorA.client.Create(ctx, own)).To(Succeed(), "its own node's report")
	t.Cleanup(func() { _ = admin.Delete(ctx, inv(nodeA, nodeA)) })
	own.Spec.Driver.Version = "570.133.20"
	g.Expect(monitorA.client.Update(ctx, own)).To(Succeed(), "and again")

	err := monitorB.client.Update(ctx, own)
	g.Expect(err).To(Satisfy(apierrors.IsForbidden))
	g.Expect(err).To(MatchError(ContainSubstring("gpuhealth-monitor on node node-b may only write the NodeInventory of its own node, not node-a")))

	err = monitorUnbound.client.Create(ctx, inv(nodeB, nodeB))
	g.Expect(err).To(MatchError(ContainSubstring("this token names no node, so it may not write NodeInventories")))

	g.Expect(adminIdentity.client.Create(ctx, inv(nodeB, nodeB))).To(Succeed(), "the admin writes any")
	g.Expect(admin.Delete(ctx, inv(nodeB, nodeB))).To(Succeed())
}
