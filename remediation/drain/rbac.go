package drain

// The Drainer lists the pods on a node, evicts them, deletes those that outlive
// a DeleteAfterTimeout, reads Namespaces for namespaceSelector entries and
// lists PodDisruptionBudgets to name the one that refused an eviction.

// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch;delete
// +kubebuilder:rbac:groups="",resources=pods/eviction,verbs=create
// +kubebuilder:rbac:groups="",resources=namespaces,verbs=get;list;watch
// +kubebuilder:rbac:groups=policy,resources=poddisruptionbudgets,verbs=get;list;watch
