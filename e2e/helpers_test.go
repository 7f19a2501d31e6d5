//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	. "github.com/onsi/gomega"
	authenticationv1 "k8s.io/api/authentication/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/e2e/framework"
	"github.com/gpuhealth/gpuhealth/remediation/job"
)

var ctx = context.Background()

func nodeHealth(g Gomega, name string) *gpuhealthv1alpha1.NodeHealth {
	var nh gpuhealthv1alpha1.NodeHealth
	g.Expect(env.Cluster.Client.Get(ctx, client.ObjectKey{Name: name}, &nh)).To(Succeed())
	return &nh
}

func phase(name string) func(Gomega) gpuhealthv1alpha1.NodeHealthPhase {
	return func(g Gomega) gpuhealthv1alpha1.NodeHealthPhase { return nodeHealth(g, name).Status.Phase }
}

func node(g Gomega, name string) *corev1.Node {
	var n corev1.Node
	g.Expect(env.Cluster.Client.Get(ctx, client.ObjectKey{Name: name}, &n)).To(Succeed())
	return &n
}

func quarantined(g Gomega, name string) bool { return framework.Quarantined(node(g, name)) }

// event reads the NodeHealthEvent the monitor on node makes for a finding.
func event(node string, check gpuhealthv1alpha1.Check, component, code string) func(Gomega) *gpuhealthv1alpha1.NodeHealthEvent {
	return eventOf(node, gpuhealthv1alpha1.SourceNVML, check, component, code)
}

// eventOf reads the NodeHealthEvent of a finding of source on node.
func eventOf(node string, source gpuhealthv1alpha1.Source, check gpuhealthv1alpha1.Check, component, code string) func(Gomega) *gpuhealthv1alpha1.NodeHealthEvent {
	name := gpuhealthv1alpha1.EventName(node, source, check, component, code)
	return func(g Gomega) *gpuhealthv1alpha1.NodeHealthEvent {
		var e gpuhealthv1alpha1.NodeHealthEvent
		g.Expect(env.Cluster.Client.Get(ctx, client.ObjectKey{Name: name}, &e)).To(Succeed())
		return &e
	}
}

func xidEvent(nodeIndex, device int, code string) func(Gomega) *gpuhealthv1alpha1.NodeHealthEvent {
	return event(fmt.Sprintf("gpu-node-%d", nodeIndex), gpuhealthv1alpha1.CheckXID, framework.GPUUUID(nodeIndex, device), code)
}

// jobs lists the names of the Jobs gpuhealth made for a node, by kind.
func jobs(g Gomega, node string, kind job.Kind) []string {
	var list batchv1.JobList
	g.Expect(env.Cluster.Client.List(ctx, &list, client.InNamespace(framework.Namespace),
		client.MatchingLabels{job.NodeLabel: node, job.KindLabel: string(kind)})).To(Succeed())
	var names []string
	for _, j := range list.Items {
		names = append(names, j.Name)
	}
	return names
}

func inject(t *testing.T, node string, lines ...string) {
	t.Helper()
	if err := env.Monitors[node].Inject(lines...); err != nil {
		t.Fatal(err)
	}
}

func injectXID(t *testing.T, node string, device, code int) {
	t.Helper()
	if err := env.Monitors[node].InjectXID(device, code); err != nil {
		t.Fatal(err)
	}
}

func kubectl(t *testing.T, args ...string) string {
	t.Helper()
	out, err := env.Cluster.Kubectl(ctx, args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// whoami is the user name the suite's kubeconfig authenticates as.
func whoami(t *testing.T) string {
	t.Helper()
	review := &authenticationv1.SelfSubjectReview{}
	if err := env.Cluster.Client.Create(ctx, review); err != nil {
		t.Fatalf("asking the apiserver who the suite is: %v", err)
	}
	return review.Status.UserInfo.Username
}

func patchPolicy(t *testing.T, patch string) {
	t.Helper()
	kubectl(t, "patch", "remediationpolicy", "default", "--type", "merge", "-p", patch)
}

func spooled(node string) int {
	entries, _ := os.ReadDir(env.Monitors[node].SpoolDir)
	n := 0
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".json") {
			n++
		}
	}
	return n
}

func monitorKubeconfig(node string) string {
	return filepath.Join(env.Dir, node, "monitor.kubeconfig")
}

func historyPhases(nh *gpuhealthv1alpha1.NodeHealth) []gpuhealthv1alpha1.NodeHealthPhase {
	var out []gpuhealthv1alpha1.NodeHealthPhase
	for _, h := range nh.Status.History {
		out = append(out, h.To)
	}
	return out
}
