package handoff

import (
	"fmt"

	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// ServiceAccount is the service account, in the operator's namespace, whose
// identity the hand-off acts with; the chart binds the install's hand-off
// rules (operator.handOff) to it, and lets the operator impersonate it and
// nothing else.
const ServiceAccount = "gpuhealth-handoff"

// NewClient returns a client that talks to the apiserver (no cache) as
// service account namespace/name, by impersonation: each request carries
// Impersonate-User system:serviceaccount:<namespace>:<name>, the apiserver
// checks that the caller may impersonate that service account (verb
// impersonate on serviceaccounts, by name) and then authorizes the request
// as the service account alone, with its groups system:serviceaccounts and
// system:serviceaccounts:<namespace>. So a hand-off can do what the
// install's hand-off rules grant and no more, whatever the operator itself
// may do. https://kubernetes.io/docs/reference/access-authn-authz/authentication/#user-impersonation
//
// opts should carry the manager's scheme and RESTMapper; its HTTPClient
// is ignored, since impersonation lives in the HTTP transport.
func NewClient(cfg *rest.Config, opts client.Options, namespace, name string) (client.Client, error) {
	cfg = rest.CopyConfig(cfg)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:" + namespace + ":" + name}
	opts.HTTPClient = nil
	c, err := client.New(cfg, opts)
	if err != nil {
		return nil, fmt.Errorf("creating the hand-off client (as service account %s/%s): %w", namespace, name, err)
	}
	return c, nil
}
