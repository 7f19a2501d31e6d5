package v1alpha1_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	. "github.com/onsi/gomega"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// newObject returns a valid object of kind with the given spec; each case
// below breaks exactly one thing about it.
func newObject(kind, name string, spec map[string]any) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "gpuhealth.dev/v1alpha1",
		"kind":       kind,
		"metadata":   map[string]any{"name": name},
		"spec":       spec,
	}}
}

func validEvent(name string) *unstructured.Unstructured {
	return newObject("NodeHealthEvent", name, map[string]any{
		"nodeName":          "gpu-node-1",
		"source":            "nvml",
		"check":             "XID",
		"component":         map[string]any{"kind": "GPU", "id": "GPU-8f6c2b1e-4d3a-4b7e-9c51-0a2f6e3d7b19"},
		"code":              "79",
		"severity":          "Fatal",
		"recommendedAction": "RebootNode",
		"message":           "GPU has fallen off the bus.",
	})
}

func validNodeHealth(name string) *unstructured.Unstructured {
	return newObject("NodeHealth", name, map[string]any{})
}

func validPolicy(name string) *unstructured.Unstructured {
	return newObject("RemediationPolicy", name, map[string]any{
		"rules": []any{map[string]any{
			"name":     "nvlink",
			"match":    map[string]any{"checks": []any{"NVLinkErrors"}},
			"verdict":  "Quarantine",
			"debounce": map[string]any{"count": int64(3), "window": "10m"},
		}},
	})
}

// set sets a field of u, creating intermediate maps; path elements that are
// numbers index into lists.
func set(u *unstructured.Unstructured, value any, path ...string) {
	var cur any = u.Object
	for i, p := range path {
		last := i == len(path)-1
		switch c := cur.(type) {
		case map[string]any:
			if last {
				c[p] = value
				return
			}
			next, ok := c[p]
			if !ok {
				next = map[string]any{}
				c[p] = next
			}
			cur = next
		case []any:
			var idx int
			if _, err := fmt.Sscan(p, &idx); err != nil {
				panic(err)
			}
			if last {
				c[idx] = value
				return
			}
			cur = c[idx]
		}
	}
}

func unset(u *unstructured.Unstructured, path ...string) {
	unstructured.RemoveNestedField(u.Object, path...)
}

type invalidCase struct {
	name   string
	object func(name string) *unstructured.Unstructured
	// mutate breaks the object; for update and status cases it runs after
	// the valid object was created.
	mutate func(u *unstructured.Unstructured)
	// how the broken object reaches the apiserver.
	how string // "create" (default), "strict" (create with fieldValidation=Strict), "update", "status"
	// want are substrings the apiserver's message must contain: the field
	// path and the sentence that tells the user what to do.
	want []string
}

func TestSchemaRejectsInvalidObjects(t *testing.T) {
	cases := []invalidCase{
		// NodeHealthEvent
		{
			name: "event without nodeName", object: validEvent,
			mutate: func(u *unstructured.Unstructured) { unset(u, "spec", "nodeName") },
			want:   []string{"spec.nodeName: Required value"},
		},
		{
			name: "event with an invalid node name", object: validEvent,
			mutate: func(u *unstructured.Unstructured) { set(u, "GPU_Node_1", "spec", "nodeName") },
			want:   []string{"spec.nodeName", "nodeName must be a valid node name"},
		},
		{
			name: "event with an unknown source", object: validEvent,
			mutate: func(u *unstructured.Unstructured) { set(u, "syslog", "spec", "source") },
			want:   []string{`spec.source: Unsupported value: "syslog"`, `"nvml"`, `"kmsg"`},
		},
		{
			name: "event with an unknown severity", object: validEvent,
			mutate: func(u *unstructured.Unstructured) { set(u, "Critical", "spec", "severity") },
			want:   []string{`spec.severity: Unsupported value: "Critical"`, `"Fatal"`, `"Degraded"`, `"Info"`},
		},
		{
			name: "event with an unknown recommended action", object: validEvent,
			mutate: func(u *unstructured.Unstructured) { set(u, "Pray", "spec", "recommendedAction") },
			want:   []string{`spec.recommendedAction: Unsupported value: "Pray"`, `"RebootNode"`},
		},
		{
			name: "XID event whose code is not a number", object: validEvent,
			mutate: func(u *unstructured.Unstructured) { set(u, "seventy-nine", "spec", "code") },
			want:   []string{"code of an XID finding must be the XID number"},
		},
		{
			name: "XID event whose code has six digits", object: validEvent,
			mutate: func(u *unstructured.Unstructured) { set(u, "100000", "spec", "code") },
			want:   []string{"code of an XID finding must be the XID number (1 to 5 digits"},
		},
		{
			name: "event whose MIG instance is not the driver's form", object: validEvent,
			mutate: func(u *unstructured.Unstructured) { set(u, "instance 1", "spec", "component", "instance") },
			want:   []string{`instance must be "GPU-I:<n>" or "GPU-I:<n> GPU-CI:<n>"`},
		},
		{
			name: "event code with spaces", object: validEvent,
			mutate: func(u *unstructured.Unstructured) {
				set(u, "NVLinkErrors", "spec", "check")
				set(u, map[string]any{"kind": "NVLink", "id": "GPU-1/link-3"}, "spec", "component")
				set(u, "CRC FLIT", "spec", "code")
			},
			want: []string{"spec.code", "code may contain only letters, digits and _ . : -"},
		},
		{
			name: "GPU component without an id", object: validEvent,
			mutate: func(u *unstructured.Unstructured) { unset(u, "spec", "component", "id") },
			want:   []string{"component.id is required when component.kind is GPU"},
		},
		{
			name: "NVLink component whose id names no link", object: validEvent,
			mutate: func(u *unstructured.Unstructured) {
				set(u, "NVLinkErrors", "spec", "check")
				set(u, "CRC_FLIT", "spec", "code")
				set(u, map[string]any{"kind": "NVLink", "id": "GPU-8f6c2b1e"}, "spec", "component")
			},
			want: []string{"component.id of an NVLink component must end in /link-<n>"},
		},
		{
			name: "event message longer than 1024 characters", object: validEvent,
			mutate: func(u *unstructured.Unstructured) { set(u, strings.Repeat("x", 1025), "spec", "message") },
			want:   []string{"spec.message: Too long: may not be more than 1024"},
		},
		{
			name: "event with an unknown field under strict field validation", object: validEvent, how: "strict",
			mutate: func(u *unstructured.Unstructured) { set(u, "high", "spec", "priority") },
			want:   []string{`unknown field "spec.priority"`},
		},
		{
			name: "event whose spec is changed after creation", object: validEvent, how: "update",
			mutate: func(u *unstructured.Unstructured) { set(u, "48", "spec", "code") },
			want:   []string{"spec is immutable"},
		},
		{
			name: "event status with resolvedAt but not resolved", object: validEvent, how: "status",
			mutate: func(u *unstructured.Unstructured) {
				set(u, map[string]any{"count": int64(1), "resolvedAt": "2026-11-30T10:00:00Z"}, "status")
			},
			want: []string{"resolvedAt may only be set when resolved is true"},
		},
		{
			name: "event status with lastSeen before firstSeen", object: validEvent, how: "status",
			mutate: func(u *unstructured.Unstructured) {
				set(u, map[string]any{"firstSeen": "2026-11-30T10:00:00Z", "lastSeen": "2026-11-30T09:00:00Z"}, "status")
			},
			want: []string{"lastSeen must not be before firstSeen"},
		},
		{
			name: "event status with a negative count", object: validEvent, how: "status",
			mutate: func(u *unstructured.Unstructured) { set(u, map[string]any{"count": int64(-1)}, "status") },
			want:   []string{"status.count: Invalid value: -1", "greater than or equal to 0"},
		},
		// NodeHealth
		{
			name: "node health both excluded and held", object: validNodeHealth,
			mutate: func(u *unstructured.Unstructured) {
				set(u, true, "spec", "exclude")
				set(u, true, "spec", "hold")
			},
			want: []string{"exclude and hold are mutually exclusive"},
		},
		{
			name: "release request without a reason", object: validNodeHealth,
			mutate: func(u *unstructured.Unstructured) {
				set(u, map[string]any{"action": "Release", "id": "r1"}, "spec", "request")
			},
			want: []string{"a Release returns the node without recertification and is audited: give a reason"},
		},
		{
			name: "maintenance request without a reason", object: validNodeHealth,
			mutate: func(u *unstructured.Unstructured) {
				set(u, map[string]any{"action": "Maintenance", "id": "m1"}, "spec", "request")
			},
			want: []string{"a Maintenance request takes the node out of service and is audited: give a reason"},
		},
		{
			name: "template hand-off without a template", object: validPolicy,
			mutate: func(u *unstructured.Unstructured) {
				set(u, map[string]any{"type": "Template"}, "spec", "remediation", "handOff")
			},
			want: []string{"template is required for type Template and allowed only there"},
		},
		{
			name: "cluster API hand-off with a template", object: validPolicy,
			mutate: func(u *unstructured.Unstructured) {
				set(u, map[string]any{"type": "ClusterAPI", "template": map[string]any{"apiVersion": "repair.example.com/v1", "kind": "RepairRequest", "metadata": map[string]any{"name": "x"}}}, "spec", "remediation", "handOff")
			},
			want: []string{"template is required for type Template and allowed only there"},
		},
		{
			name: "template hand-off that creates a Job", object: validPolicy,
			mutate: func(u *unstructured.Unstructured) {
				set(u, map[string]any{"type": "Template", "template": map[string]any{"apiVersion": "batch/v1", "kind": "Job", "metadata": map[string]any{"name": "x", "namespace": "infra"}}}, "spec", "remediation", "handOff")
			},
			want: []string{"a hand-off template may not create objects of the core, batch, apps, rbac.authorization.k8s.io or gpuhealth.dev API groups"},
		},
		{
			name: "template hand-off that creates a Pod", object: validPolicy,
			mutate: func(u *unstructured.Unstructured) {
				set(u, map[string]any{"type": "Template", "template": map[string]any{"apiVersion": "v1", "kind": "Pod", "metadata": map[string]any{"name": "x", "namespace": "infra"}}}, "spec", "remediation", "handOff")
			},
			want: []string{"a hand-off template may not create objects of the core, batch, apps, rbac.authorization.k8s.io or gpuhealth.dev API groups"},
		},
		{
			name: "template hand-off that creates a DaemonSet", object: validPolicy,
			mutate: func(u *unstructured.Unstructured) {
				set(u, map[string]any{"type": "Template", "template": map[string]any{"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": map[string]any{"name": "x", "namespace": "infra"}}}, "spec", "remediation", "handOff")
			},
			want: []string{"a hand-off template may not create objects of the core, batch, apps, rbac.authorization.k8s.io or gpuhealth.dev API groups"},
		},
		{
			name: "template hand-off that creates a ClusterRoleBinding", object: validPolicy,
			mutate: func(u *unstructured.Unstructured) {
				set(u, map[string]any{"type": "Template", "template": map[string]any{"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": map[string]any{"name": "x", "namespace": "infra"}}}, "spec", "remediation", "handOff")
			},
			want: []string{"a hand-off template may not create objects of the core, batch, apps, rbac.authorization.k8s.io or gpuhealth.dev API groups"},
		},
		{
			name: "template hand-off that creates a NodeHealthEvent", object: validPolicy,
			mutate: func(u *unstructured.Unstructured) {
				set(u, map[string]any{"type": "Template", "template": map[string]any{"apiVersion": "gpuhealth.dev/v1alpha1", "kind": "NodeHealthEvent", "metadata": map[string]any{"name": "x", "namespace": "infra"}}}, "spec", "remediation", "handOff")
			},
			want: []string{"a hand-off template may not create objects of the core, batch, apps, rbac.authorization.k8s.io or gpuhealth.dev API groups"},
		},
		{
			name: "template hand-off whose template has no kind", object: validPolicy,
			mutate: func(u *unstructured.Unstructured) {
				set(u, map[string]any{"type": "Template", "template": map[string]any{"apiVersion": "v1", "metadata": map[string]any{"name": "x"}}}, "spec", "remediation", "handOff")
			},
			want: []string{"kind"},
		},
		{
			name: "release request while held", object: validNodeHealth,
			mutate: func(u *unstructured.Unstructured) {
				set(u, true, "spec", "hold")
				set(u, map[string]any{"action": "Release", "id": "r1", "reason": "fixed"}, "spec", "request")
			},
			want: []string{"a Release request contradicts hold: clear hold first"},
		},
		{
			name: "request with an unknown action", object: validNodeHealth,
			mutate: func(u *unstructured.Unstructured) {
				set(u, map[string]any{"action": "Reboot", "id": "r1"}, "spec", "request")
			},
			want: []string{`spec.request.action: Unsupported value: "Reboot"`, `"Recertify"`, `"Release"`},
		},
		{
			name: "request with an id that has spaces", object: validNodeHealth,
			mutate: func(u *unstructured.Unstructured) {
				set(u, map[string]any{"action": "Recertify", "id": "ticket 4711"}, "spec", "request")
			},
			want: []string{"spec.request.id", "id may contain only letters, digits and . _ -"},
		},
		{
			name: "request without an id", object: validNodeHealth,
			mutate: func(u *unstructured.Unstructured) {
				set(u, map[string]any{"action": "Recertify"}, "spec", "request")
			},
			want: []string{"spec.request.id: Required value"},
		},
		// RemediationPolicy
		{
			name: "maxUnavailable written in words", object: validPolicy,
			mutate: func(u *unstructured.Unstructured) { set(u, "10 percent", "spec", "budgets", "maxUnavailable") },
			want:   []string{"spec.budgets.maxUnavailable", `maxUnavailable must be a non-negative count (2) or a percentage from 0% to 100% ("10%")`},
		},
		{
			name: "maxUnavailable above 100 percent", object: validPolicy,
			mutate: func(u *unstructured.Unstructured) { set(u, "150%", "spec", "budgets", "maxUnavailable") },
			want:   []string{"maxUnavailable must be a non-negative count (2) or a percentage from 0% to 100%"},
		},
		{
			name: "negative per-clique budget", object: validPolicy,
			mutate: func(u *unstructured.Unstructured) { set(u, int64(-1), "spec", "budgets", "maxUnavailablePerClique") },
			want:   []string{"maxUnavailablePerClique must be a non-negative count (1) or a percentage"},
		},
		{
			name: "per-ComputeDomain budget in words", object: validPolicy,
			mutate: func(u *unstructured.Unstructured) { set(u, "one", "spec", "budgets", "maxUnavailablePerComputeDomain") },
			want:   []string{"maxUnavailablePerComputeDomain must be a non-negative count (1) or a percentage"},
		},
		{
			name: "zero ComputeDomain leave timeout", object: validPolicy,
			mutate: func(u *unstructured.Unstructured) { set(u, "0s", "spec", "computeDomain", "leaveTimeout") },
			want:   []string{"spec.computeDomain.leaveTimeout", "leaveTimeout must be a duration from 1s to 8760h"},
		},
		{
			name: "dead-member grace period in words", object: validPolicy,
			mutate: func(u *unstructured.Unstructured) {
				set(u, "five minutes", "spec", "computeDomain", "deadMemberGracePeriod")
			},
			want: []string{"deadMemberGracePeriod must be 0 or a duration from 1s to 8760h"},
		},
		{
			name: "negative drain timeout", object: validPolicy,
			mutate: func(u *unstructured.Unstructured) { set(u, "-5m", "spec", "drain", "timeout") },
			want:   []string{"spec.drain.timeout", "timeout must be a duration from 1s to 8760h (a year) such as 30s, 5m or 1h"},
		},
		{
			name: "soak window in words", object: validPolicy,
			mutate: func(u *unstructured.Unstructured) { set(u, "ten minutes", "spec", "recertification", "soakWindow") },
			want:   []string{"spec.recertification.soakWindow", "soakWindow must be 0 or a duration from 1s to 8760h"},
		},
		{
			name: "sub-second drain timeout", object: validPolicy,
			mutate: func(u *unstructured.Unstructured) { set(u, "500ms", "spec", "drain", "timeout") },
			want:   []string{"spec.drain.timeout", "timeout must be a duration from 1s to 8760h"},
		},
		{
			name: "sub-second soak window", object: validPolicy,
			mutate: func(u *unstructured.Unstructured) { set(u, "0.5s", "spec", "recertification", "soakWindow") },
			want:   []string{"spec.recertification.soakWindow", "soakWindow must be 0 or a duration from 1s to 8760h"},
		},
		{
			name: "soak window over a year", object: validPolicy,
			mutate: func(u *unstructured.Unstructured) { set(u, "8761h", "spec", "recertification", "soakWindow") },
			want:   []string{"spec.recertification.soakWindow", "soakWindow must be 0 or a duration from 1s to 8760h"},
		},
		{
			name: "soak window past what a duration holds", object: validPolicy,
			mutate: func(u *unstructured.Unstructured) { set(u, "3000000h", "spec", "recertification", "soakWindow") },
			want:   []string{"spec.recertification.soakWindow"},
		},
		{
			name: "empty node selector", object: validPolicy,
			mutate: func(u *unstructured.Unstructured) { set(u, map[string]any{}, "spec", "nodeSelector") },
			want:   []string{"spec.nodeSelector", "nodeSelector must name at least one label"},
		},
		{
			name: "node selector with empty lists", object: validPolicy,
			mutate: func(u *unstructured.Unstructured) {
				set(u, map[string]any{"matchLabels": map[string]any{}, "matchExpressions": []any{}}, "spec", "nodeSelector")
			},
			want: []string{"spec.nodeSelector", "nodeSelector must name at least one label"},
		},
		{
			name: "zero debounce window", object: validPolicy,
			mutate: func(u *unstructured.Unstructured) { set(u, "0s", "spec", "rules", "0", "debounce", "window") },
			want:   []string{"spec.rules[0].debounce.window", "window must be a duration from 1s to 8760h"},
		},
		{
			name: "debounce count of zero", object: validPolicy,
			mutate: func(u *unstructured.Unstructured) { set(u, int64(0), "spec", "rules", "0", "debounce", "count") },
			want:   []string{"spec.rules[0].debounce.count: Invalid value: 0", "greater than or equal to 1"},
		},
		{
			name: "rule with an unknown verdict", object: validPolicy,
			mutate: func(u *unstructured.Unstructured) { set(u, "Drain", "spec", "rules", "0", "verdict") },
			want:   []string{`spec.rules[0].verdict: Unsupported value: "Drain"`, `"Quarantine"`, `"Observe"`, `"Ignore"`},
		},
		{
			name: "rule with an upper-case name", object: validPolicy,
			mutate: func(u *unstructured.Unstructured) { set(u, "NVLink", "spec", "rules", "0", "name") },
			want:   []string{"rule name must be lowercase letters, digits and '-'"},
		},
		{
			name: "two rules with the same name", object: validPolicy,
			mutate: func(u *unstructured.Unstructured) {
				rules, _, _ := unstructured.NestedSlice(u.Object, "spec", "rules")
				set(u, append(rules, map[string]any{"name": "nvlink", "match": map[string]any{}, "verdict": "Observe"}), "spec", "rules")
			},
			want: []string{"spec.rules[1]: Duplicate value", `"name":"nvlink"`},
		},
		{
			name: "drain entry naming both a namespace and a selector", object: validPolicy,
			mutate: func(u *unstructured.Unstructured) {
				set(u, []any{map[string]any{
					"namespace": "batch", "namespaceSelector": map[string]any{"matchLabels": map[string]any{"a": "b"}},
					"mode": "Evict",
				}}, "spec", "drain", "namespaces")
			},
			want: []string{"spec.drain.namespaces[0]", "set exactly one of namespace and namespaceSelector"},
		},
		{
			name: "drain entry naming neither a namespace nor a selector", object: validPolicy,
			mutate: func(u *unstructured.Unstructured) {
				set(u, []any{map[string]any{"mode": "WaitForCompletion"}}, "spec", "drain", "namespaces")
			},
			want: []string{"set exactly one of namespace and namespaceSelector"},
		},
		{
			name: "drain mode that does not exist", object: validPolicy,
			mutate: func(u *unstructured.Unstructured) { set(u, "Kill", "spec", "drain", "defaultMode") },
			want:   []string{`spec.drain.defaultMode: Unsupported value: "Kill"`, `"Evict"`, `"WaitForCompletion"`, `"DeleteAfterTimeout"`},
		},
		{
			name: "quarantine taint with an unknown effect", object: validPolicy,
			mutate: func(u *unstructured.Unstructured) {
				set(u, map[string]any{"key": "gpuhealth.dev/quarantined", "effect": "NoRun"}, "spec", "quarantine", "taint")
			},
			want: []string{`spec.quarantine.taint.effect: Unsupported value: "NoRun"`},
		},
		{
			name: "zero recertification attempts", object: validPolicy,
			mutate: func(u *unstructured.Unstructured) { set(u, int64(0), "spec", "recertification", "maxAttempts") },
			want:   []string{"spec.recertification.maxAttempts: Invalid value: 0", "greater than or equal to 1"},
		},
		{
			name: "no try of a step that never ran", object: validPolicy,
			mutate: func(u *unstructured.Unstructured) { set(u, int64(0), "spec", "recertification", "maxNotRun") },
			want:   []string{"spec.recertification.maxNotRun: Invalid value: 0", "greater than or equal to 1"},
		},
		{
			name: "recertification job without an image", object: validPolicy,
			mutate: func(u *unstructured.Unstructured) {
				set(u, map[string]any{"command": []any{"dcgmi", "diag", "-r", "2"}}, "spec", "recertification", "job")
			},
			want: []string{"spec.recertification.job.image: Required value"},
		},
		{
			name: "circuit breaker threshold of zero", object: validPolicy,
			mutate: func(u *unstructured.Unstructured) { set(u, int64(0), "spec", "circuitBreaker", "threshold") },
			want:   []string{"threshold must be a positive count (5) or a percentage from 1% to 100%"},
		},
		{
			name: "evictions per second above the limit", object: validPolicy,
			mutate: func(u *unstructured.Unstructured) { set(u, int64(5000), "spec", "drain", "evictionsPerSecond") },
			want:   []string{"spec.drain.evictionsPerSecond: Invalid value: 5000", "less than or equal to 1000"},
		},
	}

	ctx := context.Background()
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			name := fmt.Sprintf("invalid-%02d", i)
			obj := tc.object(name)
			var err error
			switch tc.how {
			case "", "strict":
				tc.mutate(obj)
				var opts []client.CreateOption
				if tc.how == "strict" {
					opts = append(opts, client.FieldValidation("Strict"))
				}
				err = k8sClient.Create(ctx, obj, opts...)
				if err == nil {
					t.Cleanup(func() { _ = k8sClient.Delete(ctx, obj) })
				}
				// Nothing half-valid is stored.
				got := tc.object(name)
				g.Expect(apierrors.IsNotFound(k8sClient.Get(ctx, client.ObjectKeyFromObject(got), got))).To(BeTrue(), "a rejected object must not be stored")
			case "update", "status":
				g.Expect(k8sClient.Create(ctx, obj)).To(Succeed())
				t.Cleanup(func() { _ = k8sClient.Delete(ctx, obj) })
				tc.mutate(obj)
				if tc.how == "status" {
					err = k8sClient.Status().Update(ctx, obj)
				} else {
					err = k8sClient.Update(ctx, obj)
				}
			default:
				t.Fatalf("unknown how %q", tc.how)
			}
			g.Expect(err).To(HaveOccurred(), "the apiserver accepted an invalid object")
			g.Expect(apierrors.IsInvalid(err) || apierrors.IsBadRequest(err)).To(BeTrue(), "want a validation error, got %v", err)
			for _, w := range tc.want {
				g.Expect(err.Error()).To(ContainSubstring(w))
			}
		})
	}
	if len(cases) < 20 {
		t.Fatalf("the table must cover at least 20 invalid objects, has %d", len(cases))
	}
}
