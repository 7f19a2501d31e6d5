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

	"github.com/go-logr/logr"
	. "github.com/onsi/gomega"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
	"github.com/gpuhealth/gpuhealth/internal/test/apirecord"
	"github.com/gpuhealth/gpuhealth/monitors/agent"
)

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
	// The imex source has read its node's labels and looked for its pod.
	g.Eventually(func() []apirecord.Call { return rec.Calls() }, 10*time.Second).Should(ContainElements(
		apirecord.Call{Verb: "watch", Resource: "nodes"}, apirecord.Call{Verb: "watch", Resource: "pods"}))
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
