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
const policyLoadTimeout = 30 * time.Second

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
	// updateStatus updates the status of an event the admin created, as the
	// agent does for a repeat (count, lastSeen).
	updateStatus write = "update status"
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
		{name: "the agent updates the status of its own node's event", as: monitorA, write: updateStatus, node: nodeA},
		{name: "the agent patches its own node's event", as: monitorA, write: patchEvent, node: nodeA},
		{name: "the agent may not create an event about another node", as: monitorA, write: createEvent, node: nodeB, wantErr: deniedA2B},
		{name: "the agent may not update the status of another node's event", as: monitorA, write: updateStatus, node: nodeB, wantErr: deniedA2B},
		{name: "the agent may not patch another node's event", as: monitorA, write: patchEvent, node: nodeB, wantErr: deniedA2B},
		{name: "the agent on node-b creates an event about node-b", as: monitorB, write: createEvent, node: nodeB},
		{
			name: "the agent on node-b may not create an event about node-a", as: monitorB, write: createEvent, node: nodeA,
			wantErr: "gpuhealth-monitor on node node-b may only write NodeHealthEvents about its own node, not node-a",
		},
		{name: "a token bound to no Pod may not create an event", as: monitorUnbound, write: createEvent, node: nodeA, wantErr: deniedUnbound},
		{name: "a token bound to no Pod may not update an event's status", as: monitorUnbound, write: updateStatus, node: nodeA, wantErr: deniedUnbound},
		{name: "an agent installed in another namespace creates an event about its own node", as: monitorElsewhere, write: createEvent, node: nodeA},
		{name: "an agent installed in another namespace may not create an event about another node", as: monitorElsewhere, write: createEvent, node: nodeB, wantErr: deniedA2B},
		{name: "the operator, whose Pod runs on node-a, updates the status of node-b's event", as: operatorA, write: updateStatus, node: nodeB},
		{name: "the admin creates an event about any node", as: adminIdentity, write: createEvent, node: nodeB},
		{name: "the admin updates the status of any node's event", as: adminIdentity, write: updateStatus, node: nodeA},
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
	case updateStatus:
		got.Status.Count = 7
		err = as.client.Status().Update(ctx, got)
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

// newEvent is an XID 79 finding about node with a name unique in the suite.
func newEvent(node string) *gpuhealthv1alpha1.NodeHealthEvent {
	return &gpuhealthv1alpha1.NodeHealthEvent{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-xid-79-%d", node, eventSeq.Add(1))},
		Spec: gpuhealthv1alpha1.NodeHealthEventSpec{
			NodeName:          node,
			Source:            gpuhealthv1alpha1.SourceNVML,
			Check:             gpuhealthv1alpha1.CheckXID,
			Component:         gpuhealthv1alpha1.Component{Kind: gpuhealthv1alpha1.ComponentGPU, ID: "GPU-8f6c2b1e-4d3a-4b7e-9c51-0a2f6e3d7b19"},
			Code:              "79",
			Severity:          gpuhealthv1alpha1.SeverityFatal,
			RecommendedAction: gpuhealthv1alpha1.ActionRebootNode,
			Message:           "GPU has fallen off the bus",
		},
	}
}
