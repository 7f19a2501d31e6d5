// Package apirecord records the requests a client sends to the apiserver
// as the authorizer sees them (verb, API group, resource, subresource),
// and compares what was sent with what RBAC rules grant: a test runs the
// product's code as its service account through a Recorder and then
// checks that every granted verb was used and every used one granted.
package apirecord

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"

	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/client-go/rest"
)

// Call is one kind of request: what an RBAC rule must allow for it.
type Call struct {
	// Verb is the authorizer's verb: get, list, watch, create, update,
	// patch, delete, deletecollection.
	Verb string
	// Group is the API group, "" for the core group.
	Group string
	// Resource is the resource's plural name.
	Resource string
	// Subresource is empty for the resource itself.
	Subresource string
}

// String writes c as "verb group/resource[/subresource]", the core group as "core".
func (c Call) String() string {
	g := c.Group
	if g == "" {
		g = "core"
	}
	r := c.Resource
	if c.Subresource != "" {
		r += "/" + c.Subresource
	}
	return fmt.Sprintf("%s %s/%s", c.Verb, g, r)
}

// Recorder remembers every resource request sent through the configs it
// wrapped, and the ones the apiserver answered 403 Forbidden. It is safe
// for concurrent use.
type Recorder struct {
	mu        sync.Mutex
	calls     sets.Set[Call]
	forbidden sets.Set[Call]
	// other are requests that are not resource requests (discovery,
	// /version), which RBAC's nonResourceURLs rules govern.
	other sets.Set[string]
}

// New returns an empty Recorder.
func New() *Recorder {
	return &Recorder{calls: sets.New[Call](), forbidden: sets.New[Call](), other: sets.New[string]()}
}

// infoFactory parses a request as the kube-apiserver does before it asks
// the authorizer (k8s.io/apiserver's WithRequestInfo filter).
var infoFactory = &request.RequestInfoFactory{
	APIPrefixes:          sets.NewString("api", "apis"),
	GrouplessAPIPrefixes: sets.NewString("api"),
}

// Wrap returns a copy of cfg whose requests r records.
func (r *Recorder) Wrap(cfg *rest.Config) *rest.Config {
	cfg = rest.CopyConfig(cfg)
	inner := cfg.WrapTransport
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		if inner != nil {
			rt = inner(rt)
		}
		return roundTripper{r: r, next: rt}
	}
	return cfg
}

type roundTripper struct {
	r    *Recorder
	next http.RoundTripper
}

func (t roundTripper) RoundTrip(req *http.Request) (*http.Response, error) {
	info, err := infoFactory.NewRequestInfo(req)
	resp, rtErr := t.next.RoundTrip(req)
	if err != nil {
		return resp, rtErr
	}
	t.r.mu.Lock()
	defer t.r.mu.Unlock()
	if !info.IsResourceRequest {
		t.r.other.Insert(strings.ToLower(req.Method) + " " + info.Path)
		return resp, rtErr
	}
	c := Call{Verb: info.Verb, Group: info.APIGroup, Resource: info.Resource, Subresource: info.Subresource}
	t.r.calls.Insert(c)
	if rtErr == nil && resp.StatusCode == http.StatusForbidden {
		t.r.forbidden.Insert(c)
	}
	return resp, rtErr
}

// Calls returns the resource requests recorded so far, sorted.
func (r *Recorder) Calls() []Call {
	r.mu.Lock()
	defer r.mu.Unlock()
	return sorted(r.calls)
}

// Forbidden returns the recorded requests the apiserver refused, sorted.
func (r *Recorder) Forbidden() []Call {
	r.mu.Lock()
	defer r.mu.Unlock()
	return sorted(r.forbidden)
}

func sorted(s sets.Set[Call]) []Call {
	out := s.UnsortedList()
	slices.SortFunc(out, func(a, b Call) int { return strings.Compare(a.String(), b.String()) })
	return out
}

// Grants expands resource rules into the calls they allow. A rule with a
// wildcard, resourceNames or nonResourceURLs is returned as an error: the
// comparison only holds for rules that name each verb and resource.
func Grants(rules []rbacv1.PolicyRule) ([]Call, error) {
	out := sets.New[Call]()
	for _, rule := range rules {
		if len(rule.NonResourceURLs) > 0 || len(rule.ResourceNames) > 0 {
			return nil, fmt.Errorf("rule %v: nonResourceURLs and resourceNames are not compared", rule)
		}
		for _, g := range rule.APIGroups {
			for _, res := range rule.Resources {
				for _, v := range rule.Verbs {
					if g == "*" || res == "*" || v == "*" {
						return nil, fmt.Errorf("rule %v: wildcards are not compared", rule)
					}
					resource, sub, _ := strings.Cut(res, "/")
					out.Insert(Call{Verb: v, Group: g, Resource: resource, Subresource: sub})
				}
			}
		}
	}
	return sorted(out), nil
}

// Diff returns the granted calls that were never used and the used calls
// that no grant allows. A granted read verb counts as used when a read
// that reveals as much was used (see implied).
func Diff(granted, used []Call) (unused, ungranted []Call) {
	g, u := sets.New(granted...), sets.New(used...)
	return sorted(g.Difference(withImplied(u))), sorted(u.Difference(g))
}

// implied are the read verbs a used read verb justifies granting: a list
// or watch reveals every object a get could, and an informer that sends
// only a WATCH (streaming its initial list where the apiserver supports
// WatchListClient) falls back to a LIST where it does not. Conversely a
// controller-runtime client reads cached kinds from its informer and never
// sends their GET, so a granted get is seldom seen on the wire. A get does
// not justify list or watch: those reveal every object, not only the ones
// the client can name.
var implied = map[string][]string{
	"get":   {"get"},
	"list":  {"list", "get"},
	"watch": {"watch", "list", "get"},
}

// withImplied adds to used the read verbs its reads justify.
func withImplied(used sets.Set[Call]) sets.Set[Call] {
	out := used.Clone()
	for c := range used {
		for _, v := range implied[c.Verb] {
			out.Insert(Call{Verb: v, Group: c.Group, Resource: c.Resource, Subresource: c.Subresource})
		}
	}
	return out
}
