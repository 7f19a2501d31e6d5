package charts_test

import (
	"fmt"
	"testing"

	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// TestMetricsAreServedToAuthorizedScrapers: by default the operator and
// the agents serve their metrics over HTTPS on 8443 behind the apiserver's
// authentication and authorization, may ask the apiserver for both
// reviews, and the chart ships the reader ClusterRole, a scraper bound to
// it, PodMonitors that scrape over HTTPS with the scraper's token and
// NetworkPolicies that admit the port; metrics.secure=false goes back to
// plain HTTP on 8080.
func TestMetricsAreServedToAuthorizedScrapers(t *testing.T) {
	for _, secure := range []bool{true, false} {
		t.Run(fmt.Sprintf("secure=%t", secure), func(t *testing.T) {
			g := NewWithT(t)
			objs := render(t, "--set", "metrics.podMonitor.enabled=true", "--set", "networkPolicy.enabled=true",
				"--set", fmt.Sprintf("metrics.secure=%t", secure))
			port, scheme := float64(8443), "https"
			if !secure {
				port, scheme = 8080, ""
			}

			for _, w := range []struct{ kind, name string }{{"Deployment", "gpuhealth-operator"}, {"DaemonSet", "gpuhealth-monitor"}} {
				dep := find(objs, w.kind, w.name)
				g.Expect(dep).NotTo(BeNil())
				containers, _, _ := unstructured.NestedSlice(dep.Object, "spec", "template", "spec", "containers")
				c := containers[0].(map[string]any)
				g.Expect(c["args"]).To(ContainElements(fmt.Sprintf("--metrics-bind-address=:%v", port), fmt.Sprintf("--metrics-secure=%t", secure)), w.name)
				g.Expect(c["ports"]).To(ContainElement(map[string]any{"name": "metrics", "containerPort": port}), w.name)

				np := find(objs, "NetworkPolicy", w.name)
				g.Expect(np).NotTo(BeNil())
				ingress, _, _ := unstructured.NestedSlice(np.Object, "spec", "ingress")
				g.Expect(ingress[0].(map[string]any)["ports"]).To(ContainElement(map[string]any{"port": port, "protocol": "TCP"}), w.name)

				pm := find(objs, "PodMonitor", w.name)
				g.Expect(pm).NotTo(BeNil())
				eps, _, _ := unstructured.NestedSlice(pm.Object, "spec", "podMetricsEndpoints")
				ep := eps[0].(map[string]any)
				if scheme == "" {
					g.Expect(ep).NotTo(HaveKey("scheme"), w.name)
					g.Expect(ep).NotTo(HaveKey("authorization"), w.name)
					continue
				}
				g.Expect(ep).To(HaveKeyWithValue("scheme", scheme), w.name)
				g.Expect(ep).To(HaveKeyWithValue("authorization", map[string]any{
					"type": "Bearer", "credentials": map[string]any{"name": "gpuhealth-metrics-scraper", "key": "token"},
				}), w.name)
			}
			if scheme == "" {
				g.Expect(find(objs, "Secret", "gpuhealth-metrics-scraper")).To(BeNil())
				return
			}

			// The token the PodMonitor sends belongs to a service account
			// bound to the reader role, which allows GET /metrics only.
			secret := find(objs, "Secret", "gpuhealth-metrics-scraper")
			g.Expect(secret).NotTo(BeNil())
			g.Expect(secret.Object["type"]).To(Equal("kubernetes.io/service-account-token"))
			g.Expect(secret.GetAnnotations()).To(HaveKeyWithValue("kubernetes.io/service-account.name", "gpuhealth-metrics-scraper"))
			g.Expect(find(objs, "ServiceAccount", "gpuhealth-metrics-scraper")).NotTo(BeNil())
			crb := find(objs, "ClusterRoleBinding", "gpuhealth-metrics-scraper")
			g.Expect(crb).NotTo(BeNil())
			g.Expect(crb.Object["roleRef"]).To(HaveKeyWithValue("name", "gpuhealth-metrics-reader"))
			reader := find(objs, "ClusterRole", "gpuhealth-metrics-reader")
			g.Expect(reader).NotTo(BeNil())
			g.Expect(reader.Object["rules"]).To(Equal([]any{map[string]any{"nonResourceURLs": []any{"/metrics"}, "verbs": []any{"get"}}}))

			// Both may ask for the reviews.
			for _, name := range []string{"gpuhealth-operator", "gpuhealth-monitor"} {
				cr := find(objs, "ClusterRole", name)
				g.Expect(cr).NotTo(BeNil())
				g.Expect(cr.Object["rules"]).To(ContainElements(
					map[string]any{"apiGroups": []any{"authentication.k8s.io"}, "resources": []any{"tokenreviews"}, "verbs": []any{"create"}},
					map[string]any{"apiGroups": []any{"authorization.k8s.io"}, "resources": []any{"subjectaccessreviews"}, "verbs": []any{"create"}},
				), name)
			}
		})
	}
}
