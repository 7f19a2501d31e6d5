package monitor_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"net/http"
	"net/http/httptest"

	"github.com/go-logr/logr"
	. "github.com/onsi/gomega"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/internal/test/apirecord"
	"github.com/gpuhealth/gpuhealth/monitors/agent"
	"github.com/gpuhealth/gpuhealth/monitors/metrics"
)

// TestAgentMetricsNeedAnAuthorizedToken: the agent's metrics endpoint,
// reviewing as the agent, answers only a bearer token the apiserver
// authenticates and allows to GET /metrics (gpuhealth-metrics-reader).
func TestAgentMetricsNeedAnAuthorizedToken(t *testing.T) {
	g := NewWithT(t)
	review, err := metrics.NewReview(monitorA.config)
	g.Expect(err).NotTo(HaveOccurred())
	srv := httptest.NewServer(review.Wrap(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) })))
	defer srv.Close()
	g.Expect(scrape(srv.URL, "")).To(Equal(http.StatusUnauthorized), "no token")
	g.Expect(scrape(srv.URL, "not-a-token")).To(Equal(http.StatusUnauthorized), "a token the apiserver does not know")
	g.Expect(scrape(srv.URL, scraperToken(t, false))).To(Equal(http.StatusForbidden), "a token without the reader's grant")
	g.Expect(scrape(srv.URL, scraperToken(t, true))).To(Equal(http.StatusOK), "a token with it")
}

// scraperToken returns a token of a service account bound, when reader, to
// config/rbac's gpuhealth-metrics-reader ClusterRole.
func scraperToken(t *testing.T, reader bool) string {
	t.Helper()
	g := NewWithT(t)
	ctx := context.Background()
	name := "scraper"
	if reader {
		name = "scraper-reader"
	}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: monitorNamespace}}
	g.Expect(client.IgnoreAlreadyExists(admin.Create(ctx, sa))).To(Succeed())
	if reader {
		g.Expect(client.IgnoreAlreadyExists(admin.Create(ctx, &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: "test-metrics-reader"},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "gpuhealth-metrics-reader"},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: name, Namespace: monitorNamespace}},
		}))).To(Succeed())
	}
	tr, err := adminClientset.CoreV1().ServiceAccounts(monitorNamespace).CreateToken(ctx, name,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)}}, metav1.CreateOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	return tr.Status.Token
}

// scrape GETs url/metrics with token (none when empty) and returns the
// status code.
func scrape(url, token string) (int, error) {
	req, err := http.NewRequestWithContext(context.Background(), http.MethodGet, url+"/metrics", nil)
	if err != nil {
		return 0, err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	_ = resp.Body.Close()
	return resp.StatusCode, nil
}

// TestAgentRBACIsWhatItUses runs the agent (agent.New, as the binary
// builds it) on node-a with its pod-bound token, the kmsg source reading a
// kernel log file and the imex source looking for its node's daemon pod,
// reports an XID twice, and checks that the apiserver refused nothing and
// that the calls it made are exactly what the ClusterRole (role.yaml) and
// the DRA driver namespace's Role (imex/role.yaml) grant (a read verb
// counts as used when a read that reveals as much was: apirecord.Diff).
func TestAgentRBACIsWhatItUses(t *testing.T) {
	g := NewWithT(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dir := t.TempDir()
	kmsg := filepath.Join(dir, "kmsg")
	g.Expect(os.WriteFile(kmsg, nil, 0o600)).To(Succeed())
	seq := 0
	xid := func() {
		t.Helper()
		b, err := os.ReadFile("/proc/uptime")
		g.Expect(err).NotTo(HaveOccurred())
		up, err := strconv.ParseFloat(strings.Fields(string(b))[0], 64)
		g.Expect(err).NotTo(HaveOccurred())
		seq++
		f, err := os.OpenFile(kmsg, os.O_APPEND|os.O_WRONLY, 0)
		g.Expect(err).NotTo(HaveOccurred())
		_, err = fmt.Fprintf(f, "3,%d,%d,-;NVRM: Xid (PCI:0000:18:00): 79, pid=1234, name=python, GPU has fallen off the bus.\n", seq, int64(up*1e6))
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(f.Close()).To(Succeed())
	}

	rec := apirecord.New()
	cfg := agent.Config{NodeName: nodeA, Sources: []string{"kmsg", "imex"}}
	cfg.Kmsg.Path = kmsg
	cfg.Spool.Dir = filepath.Join(dir, "spool")
	cfg.IMEX.DriverNamespace = driverNamespace
	// An nvidia-imex-ctl that finds no daemon.
	cfg.IMEX.Command = filepath.Join(dir, "nvidia-imex-ctl")
	g.Expect(os.WriteFile(cfg.IMEX.Command, []byte("#!/bin/sh\nexit 1\n"), 0o700)).To(Succeed()) //nolint:gosec // an executable script

	cfg.IMEX.Interval = metav1.Duration{Duration: 200 * time.Millisecond}
	// The inventory report written at once and again and again.
	cfg.Inventory.Interval = metav1.Duration{Duration: 200 * time.Millisecond}
	t.Cleanup(func() {
		_ = admin.Delete(context.Background(), &gpuhealthv1alpha1.NodeInventory{ObjectMeta: metav1.ObjectMeta{Name: nodeA}})
	})
	cfg.Publish.Window = metav1.Duration{Duration: 100 * time.Millisecond}
	g.Expect(cfg.Validate()).To(Succeed())
	m, err := agent.New(ctx, cfg, rec.Wrap(monitorA.config), testScheme, logr.Discard())
	g.Expect(err).NotTo(HaveOccurred())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()

	count := func(g Gomega) int64 {
		list := &gpuhealthv1alpha1.NodeHealthEventList{}
		g.Expect(admin.List(ctx, list)).To(Succeed())
		for _, e := range list.Items {
			if e.Spec.NodeName == nodeA && e.Spec.Code == "79" {
				t.Cleanup(func() { _ = admin.Delete(context.Background(), &e) })
				return e.Status.Count
			}
		}
		return 0
	}
	// The first report creates the event; the second bumps its count.
	xid()
	g.Eventually(count, 20*time.Second, 50*time.Millisecond).Should(BeNumerically(">=", 1))
	xid()
	g.Eventually(count, 20*time.Second, 50*time.Millisecond).Should(BeNumerically(">=", 2))
	// The metrics endpoint, as the binary wraps it, scraped with a token
	// bound to gpuhealth-metrics-reader.
	review, err := metrics.NewReview(rec.Wrap(monitorA.config))
	g.Expect(err).NotTo(HaveOccurred())
	srv := httptest.NewServer(review.Wrap(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) })))
	defer srv.Close()
	g.Expect(scrape(srv.URL, scraperToken(t, true))).To(Equal(http.StatusOK))

	// The imex source has read its node's labels and looked for its pod.
	g.Eventually(func() []apirecord.Call { return rec.Calls() }, 10*time.Second).Should(ContainElements(
		apirecord.Call{Verb: "watch", Resource: "nodes"}, apirecord.Call{Verb: "watch", Resource: "pods"}))
	// It has reported its node's inventory, and reported it again.
	g.Eventually(func() []apirecord.Call { return rec.Calls() }, 10*time.Second).Should(ContainElements(
		apirecord.Call{Verb: "create", Group: "gpuhealth.dev", Resource: "nodeinventories"},
		apirecord.Call{Verb: "update", Group: "gpuhealth.dev", Resource: "nodeinventories"}))
	cancel()
	g.Expect(<-done).To(Succeed())

	cr := &rbacv1.ClusterRole{}
	g.Expect(admin.Get(context.Background(), client.ObjectKey{Name: monitorSA}, cr)).To(Succeed())
	role := &rbacv1.Role{}
	g.Expect(admin.Get(context.Background(), client.ObjectKey{Namespace: driverNamespace, Name: monitorSA + "-imex"}, role)).To(Succeed())
	granted, err := apirecord.Grants(append(cr.Rules, role.Rules...))
	g.Expect(err).NotTo(HaveOccurred())
	unused, ungranted := apirecord.Diff(granted, rec.Calls())
	if f := rec.Forbidden(); len(f) > 0 {
		t.Errorf("the apiserver refused the agent these calls: %v", f)
	}
	if len(unused) > 0 {
		t.Errorf("role.yaml and imex/role.yaml grant calls the agent never made (drop them): %v", unused)
	}
	if len(ungranted) > 0 {
		t.Errorf("the agent made calls role.yaml and imex/role.yaml do not grant: %v", ungranted)
	}
}
