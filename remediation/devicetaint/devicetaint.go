// Package devicetaint takes a single GPU out of service with a Kubernetes
// DeviceTaintRule (resource.k8s.io/v1, GA in 1.37): the scheduler stops
// allocating the tainted device, and, with the NoExecute effect,
// kube-controller-manager deletes the pods that hold it. A rule cannot
// select a device by its attributes (CEL selectors are gone since 1.35), so
// a GPU, known to a finding by its UUID, is first found in its driver's
// ResourceSlices (Find): the rule then names its driver, pool and device,
// all three, and so selects exactly that one device.
//
// gpuhealth owns only the rules it made: named by RuleName and labelled
// ManagedByLabel. Ensure and Remove refuse any other rule of that name, so
// a policy author or a node agent cannot have gpuhealth change or delete a
// rule someone else made.
package devicetaint

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"

	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// What this package needs of the API: devicetaintrules get, list, watch,
// create, update, delete; resourceslices get, list, watch. The operator is
// granted them (RBAC markers) where it uses the package, not before.

const (
	// DefaultDriver is NVIDIA's DRA driver for GPUs: one pool per node,
	// named after the node, a device gpu-<minor> per GPU with its uuid.
	DefaultDriver = "gpu.nvidia.com"
	// TaintKey is the key of every device taint gpuhealth puts on; the
	// value says why (the finding's class).
	TaintKey = "gpuhealth.dev/unhealthy"
	// ManagedByLabel marks a rule gpuhealth made, with ManagedByValue.
	ManagedByLabel = "app.kubernetes.io/managed-by"
	// ManagedByValue is ManagedByLabel's value on gpuhealth's rules.
	ManagedByValue = "gpuhealth"
	// NodeLabel carries the node whose device a rule taints.
	NodeLabel = "gpuhealth.dev/node"

	// rulePrefix starts every rule gpuhealth names.
	rulePrefix = "gpuhealth-"
	// maxNameLength is a DeviceTaintRule's name limit (a DNS subdomain).
	maxNameLength = 253
)

// ErrNotPublished says the GPU is in none of the node's slices of the
// driver: it cannot be tainted alone, and the node's workflow handles it.
var ErrNotPublished = errors.New("the GPU is not published as a device in the driver's ResourceSlices for the node")

// ErrNotOurs says a rule of gpuhealth's name was made by someone else: it
// is neither changed nor deleted.
var ErrNotOurs = errors.New("the DeviceTaintRule was not made by gpuhealth")

// ErrNameTaken says gpuhealth's rule of that name taints another device
// (two node and device names that join alike): it is not moved.
var ErrNameTaken = errors.New("gpuhealth's DeviceTaintRule of that name taints another device")

// Device is one device of a DRA driver: what a DeviceTaintRule selects.
type Device struct {
	// Driver, Pool and Name select the device (all three are set in a rule).
	Driver, Pool, Name string
	// Node is the node the device is on.
	Node string
	// UUID is the GPU's UUID, as the finding names it.
	UUID string
}

func (d Device) String() string { return d.Driver + "/" + d.Pool + "/" + d.Name }

// Find returns the device whose uuid attribute is uuid among the driver's
// ResourceSlices for node, read through r (which must answer the field
// selectors spec.driver and spec.nodeName: the apiserver does, a cache
// needs those indexes). Only each pool's newest generation counts: older
// slices are the driver's leftovers. A GPU found in no slice is
// ErrNotPublished.
func Find(ctx context.Context, r client.Reader, driver, node, uuid string) (Device, error) {
	var list resourcev1.ResourceSliceList
	if err := r.List(ctx, &list, client.MatchingFields{"spec.driver": driver, "spec.nodeName": node}); err != nil {
		return Device{}, fmt.Errorf("listing the ResourceSlices of driver %s on node %s: %w", driver, node, err)
	}
	if d, ok := findIn(list.Items, driver, node, uuid); ok {
		return d, nil
	}
	return Device{}, fmt.Errorf("GPU %s on node %s, driver %s: %w", uuid, node, driver, ErrNotPublished)
}

// findIn is Find's search over slices already read. Pure.
func findIn(list []resourcev1.ResourceSlice, driver, node, uuid string) (Device, bool) {
	for _, s := range Current(list, driver, node) {
		for _, d := range s.Devices {
			if DeviceUUID(d, driver) == uuid {
				return Device{Driver: driver, Pool: s.Pool.Name, Name: d.Name, Node: node, UUID: uuid}, true
			}
		}
	}
	return Device{}, false
}

// Current are the driver's slices of node in the newest generation of
// each pool: older ones are the driver's leftovers. Pure.
func Current(list []resourcev1.ResourceSlice, driver, node string) []*resourcev1.ResourceSliceSpec {
	mine := func(s *resourcev1.ResourceSliceSpec) bool {
		return s.Driver == driver && ptr.Deref(s.NodeName, "") == node
	}
	newest := map[string]int64{}
	for i := range list {
		if s := &list[i].Spec; mine(s) {
			newest[s.Pool.Name] = max(newest[s.Pool.Name], s.Pool.Generation)
		}
	}
	var out []*resourcev1.ResourceSliceSpec
	for i := range list {
		if s := &list[i].Spec; mine(s) && s.Pool.Generation >= newest[s.Pool.Name] {
			out = append(out, s)
		}
	}
	return out
}

// DeviceUUID is the device's uuid attribute: a bare name is in the
// driver's domain, so "uuid" and "<driver>/uuid" are the same attribute.
func DeviceUUID(d resourcev1.Device, driver string) string {
	for _, key := range []resourcev1.QualifiedName{"uuid", resourcev1.QualifiedName(driver + "/uuid")} {
		if a, ok := d.Attributes[key]; ok && a.StringValue != nil {
			return *a.StringValue
		}
	}
	return ""
}

// RuleName is the name of the rule that taints device on node:
// gpuhealth-<node>-<device>, cut and hashed to the 253 characters a name
// may have (the hash keeps two long node names apart).
func RuleName(node, device string) string {
	name := rulePrefix + node + "-" + device
	if len(name) <= maxNameLength {
		return name
	}
	sum := sha256.Sum256([]byte(node + "/" + device))
	hash := hex.EncodeToString(sum[:])[:10]
	keep := maxNameLength - len(rulePrefix) - len(device) - len(hash) - 2
	return rulePrefix + strings.TrimRight(node[:keep], ".-") + "-" + hash + "-" + device
}

// Rule is the DeviceTaintRule that taints d with effect, its value the
// reason class (a label value: cut to 63 characters). Pure.
func Rule(d Device, effect resourcev1.DeviceTaintEffect, reason string) *resourcev1.DeviceTaintRule {
	return &resourcev1.DeviceTaintRule{
		ObjectMeta: metav1.ObjectMeta{
			Name:   RuleName(d.Node, d.Name),
			Labels: map[string]string{ManagedByLabel: ManagedByValue, NodeLabel: d.Node},
		},
		Spec: resourcev1.DeviceTaintRuleSpec{
			DeviceSelector: &resourcev1.DeviceTaintSelector{Driver: ptr.To(d.Driver), Pool: ptr.To(d.Pool), Device: ptr.To(d.Name)},
			Taint:          resourcev1.DeviceTaint{Key: TaintKey, Value: taintValue(reason), Effect: effect},
		},
	}
}

// taintValue makes reason a label value: letters, digits, '-', '_', '.',
// at most 63, starting and ending alphanumeric.
func taintValue(reason string) string {
	b := []byte(reason)
	for i, c := range b {
		if !labelByte(c) {
			b[i] = '-'
		}
	}
	v := string(b[:min(len(b), 63)])
	return strings.TrimFunc(v, func(r rune) bool { return r == '-' || r == '_' || r == '.' })
}

// labelByte says whether c may stand in a label value.
func labelByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.'
}

// Ours says whether gpuhealth made the rule.
func Ours(r *resourcev1.DeviceTaintRule) bool {
	return r.Labels[ManagedByLabel] == ManagedByValue && strings.HasPrefix(r.Name, rulePrefix)
}

// Ensure makes the rule want exist as it says: created, or, when gpuhealth's
// rule of that name says otherwise (another effect or reason), its spec
// updated (a changed effect restarts its eviction clock: the apiserver sets
// timeAdded anew). A rule of that name someone else made is ErrNotOurs.
// Returns the live rule.
func Ensure(ctx context.Context, c client.Client, want *resourcev1.DeviceTaintRule) (*resourcev1.DeviceTaintRule, error) {
	created := want.DeepCopy()
	err := c.Create(ctx, created)
	switch {
	case err == nil:
		return created, nil
	case !apierrors.IsAlreadyExists(err):
		return nil, fmt.Errorf("creating DeviceTaintRule %s: %w", want.Name, err)
	}
	live := &resourcev1.DeviceTaintRule{}
	if err := c.Get(ctx, client.ObjectKey{Name: want.Name}, live); err != nil {
		return nil, fmt.Errorf("reading DeviceTaintRule %s: %w", want.Name, err)
	}
	if !Ours(live) {
		return nil, fmt.Errorf("DeviceTaintRule %s: %w", want.Name, ErrNotOurs)
	}
	if live.Labels[NodeLabel] != want.Labels[NodeLabel] || !equality.Semantic.DeepEqual(live.Spec.DeviceSelector, want.Spec.DeviceSelector) {
		return nil, fmt.Errorf("DeviceTaintRule %s: %w", want.Name, ErrNameTaken)
	}
	if sameSpec(live.Spec, want.Spec) {
		return live, nil
	}
	taint := resourcev1.DeviceTaint{Key: want.Spec.Taint.Key, Value: want.Spec.Taint.Value, Effect: want.Spec.Taint.Effect}
	if taint.Effect == live.Spec.Taint.Effect {
		// Only the reason changes: the eviction clock, which counts from
		// timeAdded, does not start again.
		taint.TimeAdded = live.Spec.Taint.TimeAdded
	}
	live.Spec.Taint = taint
	if err := c.Update(ctx, live); err != nil {
		return nil, fmt.Errorf("updating DeviceTaintRule %s: %w", want.Name, err)
	}
	return live, nil
}

// sameSpec compares what gpuhealth sets: the selector and the taint's key,
// value and effect (timeAdded is the apiserver's).
func sameSpec(a, b resourcev1.DeviceTaintRuleSpec) bool {
	return equality.Semantic.DeepEqual(a.DeviceSelector, b.DeviceSelector) &&
		a.Taint.Key == b.Taint.Key && a.Taint.Value == b.Taint.Value && a.Taint.Effect == b.Taint.Effect
}

// Remove deletes gpuhealth's rule of that name, as read (UID precondition):
// the device is in service again. Gone already is done; a rule someone
// else made is ErrNotOurs and stays. c reads from the apiserver: a cache
// that has not seen a new rule would read it as gone.
func Remove(ctx context.Context, c client.Client, name string) error {
	live := &resourcev1.DeviceTaintRule{}
	if err := c.Get(ctx, client.ObjectKey{Name: name}, live); err != nil {
		return client.IgnoreNotFound(err)
	}
	if !Ours(live) {
		return fmt.Errorf("DeviceTaintRule %s: %w", name, ErrNotOurs)
	}
	if err := c.Delete(ctx, live, client.Preconditions{UID: &live.UID}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting DeviceTaintRule %s: %w", name, err)
	}
	return nil
}

// Owned lists gpuhealth's rules for node (by NodeLabel), sorted by name.
func Owned(ctx context.Context, r client.Reader, node string) ([]resourcev1.DeviceTaintRule, error) {
	var list resourcev1.DeviceTaintRuleList
	if err := r.List(ctx, &list, client.MatchingLabels{ManagedByLabel: ManagedByValue, NodeLabel: node}); err != nil {
		return nil, fmt.Errorf("listing the DeviceTaintRules of node %s: %w", node, err)
	}
	out := slices.DeleteFunc(list.Items, func(r resourcev1.DeviceTaintRule) bool { return !Ours(&r) })
	slices.SortFunc(out, func(a, b resourcev1.DeviceTaintRule) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// wouldEvict reads "N pods would be evicted" from the dry-run message
// kube-controller-manager writes.
var wouldEvict = regexp.MustCompile(`(?:^|[ .])(\d{1,9}) pods? would be evicted`)

// DryRun reads what kube-controller-manager's device-taint eviction
// controller says a None rule would do: the pods it would evict were the
// effect NoExecute, from the EvictionInProgress condition's message for
// the rule's current generation (its reason, NoEffect at 1.37, is not
// promised to stay). ok is false until it said so.
func DryRun(r *resourcev1.DeviceTaintRule) (pods int, ok bool) {
	c := meta.FindStatusCondition(r.Status.Conditions, resourcev1.DeviceTaintConditionEvictionInProgress)
	if r.Spec.Taint.Effect != resourcev1.DeviceTaintEffectNone || c == nil || c.ObservedGeneration != r.Generation {
		return 0, false
	}
	return parseWouldEvict(c.Message)
}

// parseWouldEvict reads the pod count of a dry-run message.
func parseWouldEvict(msg string) (int, bool) {
	m := wouldEvict.FindStringSubmatch(msg)
	if m == nil {
		return 0, false
	}
	n, err := strconv.Atoi(m[1])
	return n, err == nil
}
