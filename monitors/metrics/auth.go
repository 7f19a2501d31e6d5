package metrics

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	authenticationclient "k8s.io/client-go/kubernetes/typed/authentication/v1"
	authorizationclient "k8s.io/client-go/kubernetes/typed/authorization/v1"
	"k8s.io/client-go/rest"
	certutil "k8s.io/client-go/util/cert"
)

// Review lets a scrape through when the apiserver authenticates its bearer
// token (a TokenReview) and allows the token's user to GET the path (a
// SubjectAccessReview on a nonResourceURL, as the
// gpuhealth-metrics-reader ClusterRole grants). It does what
// controller-runtime's metrics filter does, without linking
// k8s.io/apiserver into an agent that runs on every node. Answers are
// cached per token and path: allowed ones for a minute, refused ones for
// ten seconds, so one scraper every 30 seconds costs the apiserver about
// two reviews a minute per agent.
type Review struct {
	tokens authenticationclient.TokenReviewInterface
	access authorizationclient.SubjectAccessReviewInterface
	now    func() time.Time

	mu    sync.Mutex
	cache map[[sha256.Size]byte]verdict
}

// verdict is a cached answer: the HTTP status to send (0: serve).
type verdict struct {
	status  int
	expires time.Time
}

const (
	allowedTTL = time.Minute
	refusedTTL = 10 * time.Second
	// maxCached bounds the cache: a handful of scrapers is normal; a flood
	// of made-up tokens empties it rather than growing it.
	maxCached = 256
)

// NewReview makes a Review that asks the apiserver cfg reaches.
func NewReview(cfg *rest.Config) (*Review, error) {
	authn, err := authenticationclient.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	authz, err := authorizationclient.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	return &Review{tokens: authn.TokenReviews(), access: authz.SubjectAccessReviews(), now: time.Now, cache: map[[sha256.Size]byte]verdict{}}, nil
}

// Wrap serves h to the requests the apiserver allows: 401 without a
// bearer token or with one it does not authenticate, 403 when its user
// may not GET the path, 500 when the apiserver cannot be asked.
func (r *Review) Wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		token, ok := bearer(req.Header.Get("Authorization"))
		if !ok {
			http.Error(w, "Unauthorized", http.StatusUnauthorized)
			return
		}
		status := r.decide(req.Context(), token, req.URL.Path)
		if status != 0 {
			http.Error(w, http.StatusText(status), status)
			return
		}
		h.ServeHTTP(w, req)
	})
}

// bearer returns the token of an "Authorization: Bearer <token>" header.
func bearer(header string) (string, bool) {
	scheme, token, ok := strings.Cut(header, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	token = strings.TrimSpace(token)
	return token, token != ""
}

// decide returns the status for token and path, cached or asked.
func (r *Review) decide(ctx context.Context, token, path string) int {
	key := sha256.Sum256([]byte(path + "\x00" + token))
	now := r.now()
	r.mu.Lock()
	v, ok := r.cache[key]
	r.mu.Unlock()
	if ok && now.Before(v.expires) {
		return v.status
	}
	status, cacheable := r.ask(ctx, token, path)
	if cacheable {
		ttl := allowedTTL
		if status != 0 {
			ttl = refusedTTL
		}
		r.mu.Lock()
		if len(r.cache) >= maxCached {
			clear(r.cache)
		}
		r.cache[key] = verdict{status: status, expires: now.Add(ttl)}
		r.mu.Unlock()
	}
	return status
}

// ask sends the reviews; an error is not cached.
func (r *Review) ask(ctx context.Context, token, path string) (status int, cacheable bool) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	tr, err := r.tokens.Create(ctx, &authenticationv1.TokenReview{Spec: authenticationv1.TokenReviewSpec{Token: token}}, metav1.CreateOptions{})
	if err != nil {
		return http.StatusInternalServerError, false
	}
	if !tr.Status.Authenticated {
		return http.StatusUnauthorized, true
	}
	u := tr.Status.User
	extra := make(map[string]authorizationv1.ExtraValue, len(u.Extra))
	for k, v := range u.Extra {
		extra[k] = authorizationv1.ExtraValue(v)
	}
	sar, err := r.access.Create(ctx, &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User: u.Username, UID: u.UID, Groups: u.Groups, Extra: extra,
		NonResourceAttributes: &authorizationv1.NonResourceAttributes{Path: path, Verb: "get"},
	}}, metav1.CreateOptions{})
	if err != nil {
		return http.StatusInternalServerError, false
	}
	if !sar.Status.Allowed {
		return http.StatusForbidden, true
	}
	return 0, true
}

// SelfSignedTLS is a TLS configuration with a certificate made now for
// localhost (scrapers skip its verification or pin it), HTTP/1.1 only:
// HTTP/2's stream floods (CVE-2023-44487) reach a server before any
// authentication.
func SelfSignedTLS() (*tls.Config, error) {
	cert, key, err := certutil.GenerateSelfSignedCertKeyWithFixtures("localhost", []net.IP{{127, 0, 0, 1}}, nil, "")
	if err != nil {
		return nil, err
	}
	pair, err := tls.X509KeyPair(cert, key)
	if err != nil {
		return nil, err
	}
	return &tls.Config{Certificates: []tls.Certificate{pair}, NextProtos: []string{"http/1.1"}, MinVersion: tls.VersionTLS12}, nil
}
