package v1alpha1

// Cache index names. Each is registered once, by the operator's composition
// root (controllers/index), and used by every controller that lists by it.
const (
	// EventNodeNameField indexes NodeHealthEvents by spec.nodeName (also a
	// selectable field of the CRD, so the apiserver filters by it too).
	EventNodeNameField = "spec.nodeName"
	// PodNodeNameField indexes Pods by spec.nodeName, as the apiserver's
	// field selector of the same name does.
	PodNodeNameField = "spec.nodeName"
	// NodeCliqueField indexes Nodes by their NVLink clique label and by the
	// clique a fabric-degraded taint was added for.
	NodeCliqueField = "computedomain.clique"
)
