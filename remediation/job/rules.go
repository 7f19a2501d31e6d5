package job

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
)

// DefaultServiceAccount is the service account a Job's pod runs as when
// its template names none: the chart creates it in the operator's
// namespace with no RBAC, and its token is not mounted.
const DefaultServiceAccount = "gpuhealth-job"

// Rules are what the install lets the Jobs of a RemediationPolicy be. The
// policy's author chooses each Job's image, command and environment, and
// the operator creates the Job with its own rights in its own namespace;
// the rules keep that from giving the author more than the install meant:
// another identity's token, a privileged container where the step needs
// none, an image from anywhere, or a Secret of the operator's namespace.
// The chart renders them from its jobs values, both into the operator's
// flags and into the parameters of the admission policy on
// RemediationPolicies, which refuses the same breaches at kubectl apply.
//
// The zero value allows no image: every policy with a Job breaches it.
type Rules struct {
	// ServiceAccount is the service account of a Job whose template names
	// none (DefaultServiceAccount in an install). A template may name it.
	// Empty: the namespace's default account, still without its token.
	ServiceAccount string
	// Reserved are service accounts no template may name, whatever
	// AllowedServiceAccounts says: gpuhealth's own (the operator's, the
	// agent's), whose tokens carry cluster-wide rights.
	Reserved []string
	// AllowedServiceAccounts are the service accounts a template may name
	// besides ServiceAccount; their tokens are mounted. Empty: none.
	AllowedServiceAccounts []string
	// PrivilegedKinds are the kinds of Job whose template may ask for a
	// privileged container or the host's PID namespace. A suite step runs
	// as Certification or Recertification. Empty: none.
	PrivilegedKinds []Kind
	// ImagePrefixes are the prefixes one of which every template's image
	// must start with. A prefix ends in "/", ":" or "@" (Validate), so
	// "nvcr.io/nvidia/" cannot be met by "nvcr.io/nvidia-mirror.example/…".
	// Empty: no image.
	ImagePrefixes []string
}

// Kinds are the Job kinds by name, for the chart's jobs.privilegedSteps.
var Kinds = []Kind{Certification, Recertification, ResetGPU, RebootNode, CliqueCertification, Diagnostics, DeviceReset, DeviceRecertification}

// Validate says what is wrong with the rules themselves: a prefix that
// does not end a registry, path or tag, an unknown kind, an empty name.
func (r Rules) Validate() error {
	var errs []string
	for _, p := range r.ImagePrefixes {
		if !strings.HasSuffix(p, "/") && !strings.HasSuffix(p, ":") && !strings.HasSuffix(p, "@") {
			errs = append(errs, fmt.Sprintf("image prefix %q must end in '/', ':' or '@'", p))
		}
	}
	for _, k := range r.PrivilegedKinds {
		if !slices.Contains(Kinds, k) {
			errs = append(errs, fmt.Sprintf("step %q is not one of %s", k, joinKinds(Kinds)))
		}
	}
	for _, sa := range r.AllowedServiceAccounts {
		if sa == "" {
			errs = append(errs, "an allowed service account has no name")
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("job rules: %s", strings.Join(errs, "; "))
	}
	return nil
}

// template is one Job template of a policy, with where it is and the kind
// of Job it becomes.
type template struct {
	path string
	kind Kind
	job  *gpuhealthv1alpha1.JobTemplate
}

// templates are the policy's Job templates in spec order.
func templates(spec *gpuhealthv1alpha1.RemediationPolicySpec) []template {
	var out []template
	if s := spec.Remediation.Diagnostics; s != nil {
		out = append(out, template{"spec.remediation.diagnostics.job", Diagnostics, &s.Job})
	}
	if s := spec.Remediation.ResetGPU; s != nil {
		out = append(out, template{"spec.remediation.resetGPU.job", ResetGPU, &s.Job})
	}
	if s := spec.Remediation.RebootNode; s != nil {
		out = append(out, template{"spec.remediation.rebootNode.job", RebootNode, &s.Job})
	}
	if j := spec.Recertification.Job; j != nil {
		out = append(out, template{"spec.recertification.job", Recertification, j})
	}
	for i := range spec.Recertification.Steps {
		s := &spec.Recertification.Steps[i]
		out = append(out, template{"spec.recertification.steps[" + s.Name + "].job", Recertification, &s.Job})
	}
	for i := range spec.Certification.Steps {
		s := &spec.Certification.Steps[i]
		out = append(out, template{"spec.certification.steps[" + s.Name + "].job", Certification, &s.Job})
	}
	if d := spec.Devices; d != nil && d.Reset != nil {
		out = append(out, template{"spec.devices.reset", DeviceReset, d.Reset})
	}
	if d := spec.Devices; d != nil && d.Job != nil {
		out = append(out, template{"spec.devices.job", DeviceRecertification, d.Job})
	}
	if c := spec.ComputeDomain.CliqueCertification; c != nil {
		out = append(out, template{"spec.computeDomain.cliqueCertification.job", CliqueCertification, &c.Job})
	}
	return out
}

// Breaches are what in the policy the rules refuse, one sentence each,
// in spec order; none when the policy may be acted on. Pure.
func (r Rules) Breaches(spec *gpuhealthv1alpha1.RemediationPolicySpec) []string {
	var out []string
	for _, t := range templates(spec) {
		j := t.job
		if !slices.ContainsFunc(r.ImagePrefixes, func(p string) bool { return p != "" && strings.HasPrefix(j.Image, p) }) {
			out = append(out, fmt.Sprintf("%s: image %q is not from an allowed registry (%s)", t.path, j.Image, orNone(r.ImagePrefixes)))
		}
		switch sa := j.ServiceAccountName; {
		case sa == "" || sa == r.ServiceAccount && !slices.Contains(r.Reserved, sa):
		case slices.Contains(r.Reserved, sa):
			out = append(out, fmt.Sprintf("%s: serviceAccountName %q is gpuhealth's own identity and never a Job's", t.path, sa))
		case !slices.Contains(r.AllowedServiceAccounts, sa):
			out = append(out, fmt.Sprintf("%s: serviceAccountName %q is not allowed (allowed: %s)", t.path, sa, orNone(r.AllowedServiceAccounts)))
		}
		if !slices.Contains(r.PrivilegedKinds, t.kind) {
			for _, f := range []struct {
				name string
				set  bool
			}{{"privileged", j.Privileged}, {"hostPID", j.HostPID}} {
				if f.set {
					out = append(out, fmt.Sprintf("%s: %s is allowed only for steps %s, not %s", t.path, f.name, orNone(kindNames(r.PrivilegedKinds)), t.kind))
				}
			}
		}
		for _, e := range j.Env {
			if e.ValueFrom != nil {
				out = append(out, fmt.Sprintf("%s: env %s takes its value from valueFrom; a Job's environment is literal values only", t.path, strconv.Quote(e.Name)))
			}
		}
	}
	return out
}

func kindNames(kinds []Kind) []string {
	out := make([]string, len(kinds))
	for i, k := range kinds {
		out[i] = string(k)
	}
	return out
}

func joinKinds(kinds []Kind) string { return strings.Join(kindNames(kinds), ", ") }

func orNone(items []string) string {
	if len(items) == 0 {
		return "none"
	}
	return strings.Join(items, ", ")
}
