package computedomain

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/internal/test/testenv"
)

// woken collects the node names the view announces.
type woken struct {
	mu    sync.Mutex
	nodes map[string]int
}

func (w *woken) count(n string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.nodes[n]
}

// startView runs a cache and a view over the test apiserver until the test ends.
func startView(t *testing.T, g *WithT) (*View, *woken) {
	t.Helper()
	c, err := cache.New(testEnv.Config, cache.Options{Scheme: testScheme})
	g.Expect(err).NotTo(HaveOccurred())
	disc, err := discovery.NewDiscoveryClientForConfig(testEnv.Config)
	g.Expect(err).NotTo(HaveOccurred())
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go func() { _ = c.Start(ctx) }()
	v := NewView(c, disc, clock.RealClock{}, "nvidia-dra")
	v.PollInterval = 50 * time.Millisecond
	w := &woken{nodes: map[string]int{}}
	go func() {
		for {
			select {
			case e := <-v.Changes():
				w.mu.Lock()
				w.nodes[e.Object.GetName()]++
				w.mu.Unlock()
			case <-ctx.Done():
				return
			}
		}
	}()
	go func() { _ = v.Start(ctx) }()
	return v, w
}

func newDomain(ns, name string) *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(ComputeDomainGVK)
	u.SetNamespace(ns)
	u.SetName(name)
	u.Object["spec"] = map[string]any{"numNodes": int64(0), "channel": map[string]any{"resourceClaimTemplate": map[string]any{"name": name + "-channel"}}}
	return u
}

func newClique(ns string, domainUID types.UID, cliqueID string, nodes ...string) *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(CliqueGVK)
	u.SetNamespace(ns)
	u.SetName(string(domainUID) + "." + cliqueID)
	var daemons []any
	for i, n := range nodes {
		daemons = append(daemons, map[string]any{"nodeName": n, "cliqueID": cliqueID, "index": int64(i), "status": "Ready", "ipAddress": "10.0.0.1"})
	}
	u.Object["daemons"] = daemons
	return u
}

// TestViewComesUpWhenCRDsAreInstalledLater starts the view on a cluster
// without the ComputeDomain CRDs, installs them in each driver shape, and
// checks that the view picks up domains (and cliques, where the shape has
// them) without a restart, lists a domain's members from status.nodes when
// it has no cliques and from its cliques plus its no-fabric entries when it
// has, and forgets everything when the CRDs go away.
func TestViewComesUpWhenCRDsAreInstalledLater(t *testing.T) {
	for _, shape := range testenv.DriverShapes() {
		t.Run(shape.Name, func(t *testing.T) {
			g := NewWithT(t)
			ctx := context.Background()
			v, w := startView(t, g)
			prefix := strings.ReplaceAll(shape.Name, ".", "-") + "-"
			n1, n2, n3, n4 := prefix+"n1", prefix+"n2", prefix+"n3", prefix+"n4"

			// No CRDs: no view, and nothing listed.
			g.Expect(v.Available()).To(BeFalse())
			g.Expect(v.Listed(n1)).To(BeEmpty())
			g.Expect(testutil.ToFloat64(viewAvailable)).To(BeZero())

			// The driver is installed.
			g.Expect(testenv.UseDriverShape(testEnv.Config, k8sClient, shape)).To(Succeed())
			uninstall := func() {
				_ = envtest.UninstallCRDs(testEnv.Config, envtest.CRDInstallOptions{Paths: []string{shape.Dir}})
			}
			t.Cleanup(uninstall)
			g.Eventually(v.Available, 10*time.Second, 50*time.Millisecond).Should(BeTrue())
			g.Expect(testutil.ToFloat64(viewAvailable)).To(Equal(1.0))

			ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "nvidia-dra"}}
			if err := k8sClient.Create(ctx, ns); err != nil && !apierrors.IsAlreadyExists(err) {
				g.Expect(err).NotTo(HaveOccurred())
			}

			// A domain with status.nodes only, as the driver writes it: a member
			// without NVLink fabric has cliqueID "" and index -1.
			d := newDomain("default", prefix+"train")
			g.Expect(k8sClient.Create(ctx, d)).To(Succeed())
			t.Cleanup(func() { _ = k8sClient.Delete(context.Background(), d) })
			d.Object["status"] = map[string]any{"status": "Ready", "nodes": []any{
				map[string]any{"name": n1, "cliqueID": "cluster.1", "index": int64(0), "status": "Ready", "ipAddress": "10.0.0.1"},
				map[string]any{"name": n2, "cliqueID": "cluster.1", "index": int64(1), "status": "Ready", "ipAddress": "10.0.0.2"},
				map[string]any{"name": n4, "cliqueID": "", "index": int64(-1), "status": "Ready", "ipAddress": "10.0.0.4"},
			}}
			g.Expect(k8sClient.Status().Update(ctx, d)).To(Succeed())
			uid := d.GetUID()
			g.Eventually(func() []string { return v.Members(uid) }, 10*time.Second, 50*time.Millisecond).Should(Equal([]string{n1, n2, n4}))
			g.Expect(v.Listed(n1)).To(Equal([]Listing{{DomainUID: uid, CliqueID: "cluster.1", Trace: gpuhealthv1alpha1.TraceStatusEntry, Status: "Ready"}}))
			dom, ok := v.Domain(uid)
			g.Expect(ok).To(BeTrue())
			g.Expect(dom.Namespace + "/" + dom.Name + " " + dom.Status).To(Equal("default/" + prefix + "train Ready"))
			g.Expect(w.count(n1)).To(BeNumerically(">", 0), "the node controller is told")

			if shape.Cliques {
				// Clique objects, when present, are the source of truth for the
				// fabric-attached members: n2 is no longer listed (the clique does
				// not have it), n3 is; n4, without fabric, stays from status.nodes.
				cl := newClique("nvidia-dra", uid, "cluster.1", n1, n3)
				g.Expect(k8sClient.Create(ctx, cl)).To(Succeed())
				g.Eventually(func() []string { return v.Members(uid) }, 10*time.Second, 50*time.Millisecond).Should(Equal([]string{n1, n3, n4}))
				g.Expect(v.Listed(n1)[0].Trace).To(Equal(gpuhealthv1alpha1.TraceCliqueEntry))
				g.Expect(v.Listed(n4)).To(Equal([]Listing{{DomainUID: uid, CliqueID: "", Trace: gpuhealthv1alpha1.TraceStatusEntry, Status: "Ready"}}))
				g.Expect(v.Listed(n2)).To(BeEmpty(), "a fabric-attached entry its clique does not list has left")
				g.Eventually(func() int { return w.count(n2) }, 10*time.Second, 50*time.Millisecond).Should(BeNumerically(">=", 2), "the node that dropped out is told")

				// A clique outside the driver's namespace lists nobody, not
				// even once the driver's own clique is gone.
				other := newClique("default", uid, "cluster.1", n1, n2, n3)
				g.Expect(k8sClient.Create(ctx, other)).To(Succeed())
				t.Cleanup(func() { _ = k8sClient.Delete(context.Background(), other) })

				// The clique goes: back to status.nodes.
				g.Expect(k8sClient.Delete(ctx, cl)).To(Succeed())
				g.Eventually(func() []string { return v.Members(uid) }, 10*time.Second, 50*time.Millisecond).Should(Equal([]string{n1, n2, n4}))
				g.Consistently(func() []string { return v.Members(uid) }, time.Second, 50*time.Millisecond).Should(Equal([]string{n1, n2, n4}),
					"the clique in another namespace does not replace status.nodes")
				g.Expect(v.Listed(n3)).To(BeEmpty())
			}

			// The driver is removed: the view forgets.
			uninstall()
			g.Eventually(v.Available, 20*time.Second, 50*time.Millisecond).Should(BeFalse())
			g.Expect(v.Listed(n1)).To(BeEmpty())
		})
	}
}

func TestCliqueFromName(t *testing.T) {
	cases := []struct {
		name      string
		object    string
		wantUID   types.UID
		wantClq   string
		ownerUID  types.UID
		labelUID  string
		labelClq  string
		wantNodes int
	}{
		{name: "the name splits at the first dot into the domain UID and the clique ID", object: "4f1c-aa.cluster-uuid.3", wantUID: "4f1c-aa", wantClq: "cluster-uuid.3", wantNodes: 1},
		{name: "the driver's labels win over the name", object: "x.c.1", labelUID: "label-uid", labelClq: "cluster-uuid.7", wantUID: "label-uid", wantClq: "cluster-uuid.7", wantNodes: 1},
		{name: "owner references (the daemon pods) say nothing of the domain", object: "4f1c-aa.c.1", ownerUID: "pod-uid", wantUID: "4f1c-aa", wantClq: "c.1", wantNodes: 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			u := &unstructured.Unstructured{Object: map[string]any{"daemons": []any{
				map[string]any{"nodeName": "n1", "cliqueID": tc.wantClq},
				map[string]any{"cliqueID": "entry without a node is skipped"},
			}}}
			u.SetName(tc.object)
			if tc.ownerUID != "" {
				u.SetOwnerReferences([]metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: "computedomain-daemon-x", UID: tc.ownerUID}})
			}
			if tc.labelUID != "" {
				u.SetLabels(map[string]string{NodeLabel: tc.labelUID, PodCliqueLabel: tc.labelClq})
			}
			c, err := cliqueFrom(u)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(c.DomainUID).To(Equal(tc.wantUID))
			g.Expect(c.CliqueID).To(Equal(tc.wantClq))
			g.Expect(c.Daemons).To(HaveLen(tc.wantNodes))
		})
	}
}
