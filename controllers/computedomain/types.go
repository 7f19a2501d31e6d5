package computedomain

import (
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
)

// The NVIDIA DRA driver's API, as far as gpuhealth reads it. The driver's Go
// module is deliberately not imported: it pulls in the driver's whole
// dependency tree and pins Kubernetes versions, and gpuhealth needs a handful
// of fields that it reads through unstructured objects.
const (
	// Group is the DRA driver's API group.
	Group = "resource.nvidia.com"
	// Version is the API version gpuhealth reads.
	Version = "v1beta1"
	// ComputeDomainResource is the plural resource name of ComputeDomain.
	ComputeDomainResource = "computedomains"
	// CliqueResource is the plural resource name of ComputeDomainClique.
	CliqueResource = "computedomaincliques"

	// NodeLabel is set on a node, with the ComputeDomain's UID as value,
	// while a workload's channel claim is prepared there.
	NodeLabel = "resource.nvidia.com/computeDomain"
	// PodCliqueLabel is the clique ID on a domain's daemon pods.
	PodCliqueLabel = "resource.nvidia.com/computeDomain.cliqueID"
	// CliqueNodeLabel is the node's NVLink clique, "<ClusterUUID>.<CliqueId>",
	// set by GPU Feature Discovery: the physical NVLink partition.
	CliqueNodeLabel = "nvidia.com/gpu.clique"
)

var (
	// ComputeDomainGVK is the ComputeDomain kind.
	ComputeDomainGVK = schema.GroupVersionKind{Group: Group, Version: Version, Kind: "ComputeDomain"}
	// CliqueGVK is the ComputeDomainClique kind.
	CliqueGVK = schema.GroupVersionKind{Group: Group, Version: Version, Kind: "ComputeDomainClique"}
)

// Member is one node's entry in a domain's status.nodes or a clique's daemons.
type Member struct {
	// NodeName is the node's name (status.nodes[].name or daemons[].nodeName).
	NodeName string `json:"nodeName,omitempty"`
	// Name is status.nodes[].name; decoding copies it into NodeName.
	Name string `json:"name,omitempty"`
	// IPAddress is the address of the domain's daemon pod on the node.
	IPAddress string `json:"ipAddress,omitempty"`
	// CliqueID is "<ClusterUUID>.<CliqueId>"; empty when not fabric-attached.
	CliqueID string `json:"cliqueID,omitempty"`
	// Index is the member's stable index within its clique.
	Index int `json:"index,omitempty"`
	// Status is Ready or NotReady.
	Status string `json:"status,omitempty"`
}

// Domain is what gpuhealth knows of one ComputeDomain.
type Domain struct {
	// UID, Namespace and Name identify the object.
	UID       types.UID
	Namespace string
	Name      string
	// Status is status.status: Ready or NotReady; empty before the driver wrote it.
	Status string
	// Nodes is status.nodes (the membership list of drivers without cliques).
	Nodes []Member
}

// Clique is what gpuhealth knows of one ComputeDomainClique.
type Clique struct {
	// Namespace and Name identify the object; the name is "<domain UID>.<cliqueID>".
	Namespace string
	Name      string
	// DomainUID is the owning ComputeDomain's UID.
	DomainUID types.UID
	// CliqueID is the NVLink clique.
	CliqueID string
	// Daemons are the clique's members.
	Daemons []Member
}

type domainObject struct {
	Status struct {
		Status string   `json:"status"`
		Nodes  []Member `json:"nodes"`
	} `json:"status"`
}

type cliqueObject struct {
	Daemons []Member `json:"daemons"`
}

// domainFrom decodes the fields gpuhealth reads from a ComputeDomain.
func domainFrom(u *unstructured.Unstructured) (*Domain, error) {
	var o domainObject
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &o); err != nil {
		return nil, fmt.Errorf("decoding computedomain %s/%s: %w", u.GetNamespace(), u.GetName(), err)
	}
	d := &Domain{UID: u.GetUID(), Namespace: u.GetNamespace(), Name: u.GetName(), Status: o.Status.Status}
	for _, m := range o.Status.Nodes {
		if m.NodeName == "" {
			m.NodeName = m.Name
		}
		if m.NodeName != "" {
			d.Nodes = append(d.Nodes, m)
		}
	}
	return d, nil
}

// cliqueFrom decodes a ComputeDomainClique. The driver labels each clique
// with its domain's UID (NodeLabel) and its clique ID (PodCliqueLabel); a
// clique without those labels is read from its name
// ("<computeDomainUID>.<cliqueID>": a UID has no dots, the clique ID has
// one). Its owner references are the daemon Pods, not the domain.
func cliqueFrom(u *unstructured.Unstructured) (*Clique, error) {
	var o cliqueObject
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &o); err != nil {
		return nil, fmt.Errorf("decoding computedomainclique %s/%s: %w", u.GetNamespace(), u.GetName(), err)
	}
	c := &Clique{Namespace: u.GetNamespace(), Name: u.GetName()}
	if uid, clique, ok := strings.Cut(u.GetName(), "."); ok {
		c.DomainUID, c.CliqueID = types.UID(uid), clique
	}
	if uid := u.GetLabels()[NodeLabel]; uid != "" {
		c.DomainUID = types.UID(uid)
	}
	if clique := u.GetLabels()[PodCliqueLabel]; clique != "" {
		c.CliqueID = clique
	}
	for _, m := range o.Daemons {
		if m.NodeName == "" {
			continue
		}
		if c.CliqueID == "" {
			c.CliqueID = m.CliqueID
		}
		c.Daemons = append(c.Daemons, m)
	}
	return c, nil
}
