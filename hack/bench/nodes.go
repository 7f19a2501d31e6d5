package main

import (
	"context"
	"fmt"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
)

// setLabel names the node set a bench node belongs to; workloads select
// their nodes by it.
const setLabel = "bench.gpuhealth.dev/set"

// workloadNamespace holds the benchmark's Deployments and PDBs.
const workloadNamespace = "bench-workload"

// nodeSet is a group of fresh nodes one measurement uses.
type nodeSet struct {
	// name prefixes the node names and is the value of setLabel.
	name string
	// gpu labels the nodes nvidia.com/gpu.present=true, so the bench
	// policy manages them.
	gpu bool
	// pods is the nodes' pod capacity (default 110): a Deployment of
	// pods × len(nodes) replicas fills them exactly.
	pods int
	// labels are more node labels; setLabel among them overrides the
	// set's name (spares of a set take its pods).
	labels map[string]string
}

// createNodes creates count kwok-managed nodes of set s through the API
// (kwok's controller takes over every node annotated kwok.x-k8s.io/node=fake
// and makes it Ready) and waits until the node watch has seen each Ready.
// Fresh nodes for each measurement keep one measurement's leftovers (a
// cordon, the node lifecycle controller's unschedulable taint, replacement
// pods) out of the next.
func (h *harness) createNodes(ctx context.Context, s nodeSet, count int) ([]string, error) {
	names := make([]string, count)
	for i := range names {
		names[i] = fmt.Sprintf("%s-%05d", s.name, i)
	}
	pods := s.pods
	if pods == 0 {
		pods = 110
	}
	q := resource.MustParse
	res := corev1.ResourceList{
		corev1.ResourceCPU: q("96"), corev1.ResourceMemory: q("1Ti"),
		corev1.ResourcePods: *resource.NewQuantity(int64(pods), resource.DecimalSI), "nvidia.com/gpu": q("8"),
	}
	start := time.Now()
	err := parallel(ctx, count, h.o.workers, func(ctx context.Context, i int) error {
		labels := map[string]string{"type": "kwok", "kubernetes.io/hostname": names[i], "kubernetes.io/os": "linux", setLabel: s.name}
		if s.gpu {
			labels[gpuLabel] = "true"
		}
		for k, v := range s.labels {
			labels[k] = v
		}
		n := &corev1.Node{
			ObjectMeta: metav1.ObjectMeta{Name: names[i], Labels: labels, Annotations: map[string]string{"kwok.x-k8s.io/node": "fake"}},
			Status:     corev1.NodeStatus{Allocatable: res, Capacity: res},
		}
		if _, err := h.cs.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("creating node %s: %w", names[i], err)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	err = h.wait(ctx, fmt.Sprintf("%d %s nodes Ready", count, s.name), h.nodes.changed, func() (bool, string) {
		ready := 0
		for _, n := range names {
			if h.nodes.get(n).ready {
				ready++
			}
		}
		return ready == count, fmt.Sprintf("%d/%d Ready", ready, count)
	})
	if err == nil {
		logf("created %d %s nodes in %s", count, s.name, time.Since(start).Round(time.Millisecond))
	}
	return names, err
}

// deleteNodes deletes the named nodes and waits until the watch has seen
// them go.
func (h *harness) deleteNodes(ctx context.Context, names []string) error {
	err := parallel(ctx, len(names), h.o.workers, func(ctx context.Context, i int) error {
		err := h.cs.CoreV1().Nodes().Delete(ctx, names[i], metav1.DeleteOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("deleting nodes: %w", err)
	}
	return h.wait(ctx, fmt.Sprintf("%d nodes deleted", len(names)), h.nodes.changed, func() (bool, string) {
		left := 0
		for _, n := range names {
			if h.nodes.exists(n) {
				left++
			}
		}
		return left == 0, fmt.Sprintf("%d still there", left)
	})
}

// ensureNamespace creates the workload namespace once.
func (h *harness) ensureNamespace(ctx context.Context) error {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: workloadNamespace}}
	if _, err := h.cs.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating namespace %s: %w", workloadNamespace, err)
	}
	return nil
}

// workload is a Deployment whose pods run on the nodes of one set (those
// labeled setLabel=set), optionally with a PodDisruptionBudget.
type workload struct {
	name     string
	set      string
	replicas int
	// pdbMaxUnavailable is the PDB's maxUnavailable ("10%"); empty: no PDB.
	pdbMaxUnavailable string
}

// createWorkload creates the Deployment (and its PDB) and waits until every
// replica is ready; kube-scheduler places the pods and kwok runs them.
func (h *harness) createWorkload(ctx context.Context, w workload) error {
	if err := h.ensureNamespace(ctx); err != nil {
		return err
	}
	labels := map[string]string{"app": w.name}
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: w.name, Namespace: workloadNamespace},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To(int32(w.replicas)),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					NodeSelector: map[string]string{setLabel: w.set},
					// kwok's nodes carry no taints but those the benchmark
					// and the operator add; the pods tolerate none of them.
					Containers:                    []corev1.Container{{Name: "work", Image: "registry.k8s.io/pause:3.10"}},
					TerminationGracePeriodSeconds: ptr.To(int64(0)),
				},
			},
			// Replacements start at once, as many as the PDB lets go.
			Strategy: appsv1.DeploymentStrategy{Type: appsv1.RecreateDeploymentStrategyType},
		},
	}
	if _, err := h.cs.AppsV1().Deployments(workloadNamespace).Create(ctx, d, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("creating Deployment %s: %w", w.name, err)
	}
	if w.pdbMaxUnavailable != "" {
		mu := intstr.FromString(w.pdbMaxUnavailable)
		pdb := &policyv1.PodDisruptionBudget{
			ObjectMeta: metav1.ObjectMeta{Name: w.name, Namespace: workloadNamespace},
			Spec:       policyv1.PodDisruptionBudgetSpec{MaxUnavailable: &mu, Selector: &metav1.LabelSelector{MatchLabels: labels}},
		}
		if _, err := h.cs.PolicyV1().PodDisruptionBudgets(workloadNamespace).Create(ctx, pdb, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("creating PDB %s: %w", w.name, err)
		}
	}
	start := time.Now()
	err := h.poll(ctx, fmt.Sprintf("Deployment %s: %d replicas ready", w.name, w.replicas), 2*time.Second, func() (bool, string, error) {
		got, err := h.cs.AppsV1().Deployments(workloadNamespace).Get(ctx, w.name, metav1.GetOptions{})
		if err != nil {
			return false, "", err
		}
		return got.Status.ReadyReplicas == int32(w.replicas), fmt.Sprintf("%d/%d ready", got.Status.ReadyReplicas, w.replicas), nil
	})
	if err != nil {
		return err
	}
	logf("Deployment %s: %d pods ready in %s", w.name, w.replicas, time.Since(start).Round(time.Millisecond))
	if w.pdbMaxUnavailable != "" {
		// The disruption controller must have computed the budget before
		// a drain starts, or every eviction is refused at first.
		return h.poll(ctx, "PDB "+w.name+" computed", time.Second, func() (bool, string, error) {
			pdb, err := h.cs.PolicyV1().PodDisruptionBudgets(workloadNamespace).Get(ctx, w.name, metav1.GetOptions{})
			if err != nil {
				return false, "", err
			}
			return pdb.Status.ObservedGeneration == pdb.Generation && pdb.Status.CurrentHealthy == int32(w.replicas),
				fmt.Sprintf("%d healthy, %d disruptions allowed", pdb.Status.CurrentHealthy, pdb.Status.DisruptionsAllowed), nil
		})
	}
	return nil
}

// poll calls check every interval until it reports done, logging progress
// every 10 seconds. It gives up after -timeout without progress: the
// deadline starts again whenever check's message changes without an error
// (thousands of nodes turning Ready on a busy machine may take longer than
// -timeout in all, but never stall that long).
func (h *harness) poll(ctx context.Context, what string, interval time.Duration, check func() (bool, string, error)) error {
	deadline := time.Now().Add(h.o.timeout)
	lastLog := time.Now()
	progress := ""
	for {
		done, msg, err := check()
		if err != nil {
			msg = err.Error()
		} else if msg != progress {
			progress = msg
			deadline = time.Now().Add(h.o.timeout)
		}
		if done && err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out after %s without progress waiting for %s: %s", h.o.timeout, what, msg)
		}
		if time.Since(lastLog) >= 10*time.Second {
			logf("  waiting for %s: %s", what, msg)
			lastLog = time.Now()
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s (%s): %w", what, msg, context.Cause(ctx))
		case <-time.After(interval):
		}
	}
}

// createBoundPods creates perNode workload pods on each of nodes, bound by
// the harness (spec.nodeName set, as a scheduler's binding would), and
// waits until kwok runs every one. Every process that watches pods
// (kube-scheduler, kube-controller-manager, the operator) holds them as it
// would a Deployment's; only the scheduling is skipped, which on two cores
// runs at 60 pods/s with 1,000 nodes and falls below 30 with 2,000.
func (h *harness) createBoundPods(ctx context.Context, pods *podWatch, nodes []string, perNode int) error {
	if err := h.ensureNamespace(ctx); err != nil {
		return err
	}
	total := len(nodes) * perNode
	start := time.Now()
	err := parallel(ctx, total, h.o.workers, func(ctx context.Context, i int) error {
		node := nodes[i/perNode]
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("spread-%s-%d", node, i%perNode), Namespace: workloadNamespace, Labels: map[string]string{"app": "spread"}},
			Spec: corev1.PodSpec{
				NodeName:                      node,
				Containers:                    []corev1.Container{{Name: "work", Image: "registry.k8s.io/pause:3.10"}},
				TerminationGracePeriodSeconds: ptr.To(int64(0)),
			},
		}
		if _, err := h.cs.CoreV1().Pods(workloadNamespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("creating pod %s: %w", pod.Name, err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	created := time.Since(start)
	err = h.wait(ctx, fmt.Sprintf("%d workload pods Running", total), pods.changed, func() (bool, string) {
		n := pods.runningCount()
		return n >= total, fmt.Sprintf("%d/%d Running", n, total)
	})
	if err == nil {
		logf("%d workload pods created in %s, all Running after %s", total, created.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
	}
	return err
}
