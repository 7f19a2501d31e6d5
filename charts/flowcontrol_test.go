package charts_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// TestMonitorRequestsHaveTheirOwnPriorityLevel applies the chart's
// FlowSchema and PriorityLevelConfiguration to a real apiserver and checks
// that it classifies the agents' requests (their service account's, even
// refused ones) into the agents' level and an admin's elsewhere, by the
// X-Kubernetes-PF-* headers the apiserver sets on every response.
func TestMonitorRequestsHaveTheirOwnPriorityLevel(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	objs := render(t)
	plc, fs := find(objs, "PriorityLevelConfiguration", "gpuhealth-monitor"), find(objs, "FlowSchema", "gpuhealth-monitor")
	g.Expect(plc).NotTo(BeNil())
	g.Expect(fs).NotTo(BeNil())
	for _, o := range []client.Object{plc.DeepCopy(), fs.DeepCopy()} {
		g.Expect(env.Client.Create(ctx, o)).To(Succeed())
		t.Cleanup(func() { _ = env.Client.Delete(context.Background(), o) })
	}
	g.Expect(client.IgnoreAlreadyExists(env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "gpuhealth-system"}}))).To(Succeed())
	g.Expect(client.IgnoreAlreadyExists(env.Client.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "gpuhealth-monitor", Namespace: "gpuhealth-system"}}))).To(Succeed())
	created := find(objs, "PriorityLevelConfiguration", "gpuhealth-monitor").DeepCopy()
	g.Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(created), created)).To(Succeed())

	level := func(user string) func() (string, error) {
		cfg := rest.CopyConfig(env.Config)
		if user != "" {
			cfg.Impersonate = rest.ImpersonationConfig{UserName: user}
		}
		return func() (string, error) {
			hc, err := rest.HTTPClientFor(cfg)
			if err != nil {
				return "", err
			}
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, cfg.Host+"/api/v1/nodes", nil)
			if err != nil {
				return "", err
			}
			resp, err := hc.Do(req)
			if err != nil {
				return "", err
			}
			_ = resp.Body.Close()
			return resp.Header.Get("X-Kubernetes-PF-PriorityLevel-UID"), nil
		}
	}
	// The apiserver loads flow control objects from informers: a moment.
	g.Eventually(level("system:serviceaccount:gpuhealth-system:gpuhealth-monitor"), 30*time.Second, 200*time.Millisecond).
		Should(Equal(string(created.GetUID())), "the agents' level")
	g.Expect(level("")()).NotTo(Equal(string(created.GetUID())), "an admin's requests go elsewhere")
	g.Expect(level("system:serviceaccount:gpuhealth-system:gpuhealth-operator")()).NotTo(Equal(string(created.GetUID())), "the operator's too")
}
