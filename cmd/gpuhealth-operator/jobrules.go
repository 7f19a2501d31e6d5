package main

import (
	"fmt"
	"strings"

	"github.com/gpuhealth/gpuhealth/remediation/job"
)

// reservedServiceAccounts are gpuhealth's own service accounts (the chart
// names them): no Job may run as one, whatever the install allows.
var reservedServiceAccounts = []string{"gpuhealth-operator", "gpuhealth-monitor"}

// jobRuleFlags are the --job-* flags as given: comma-separated lists.
type jobRuleFlags struct {
	serviceAccount         string
	allowedServiceAccounts string
	privilegedSteps        string
	imagePrefixes          string
}

// rules are the install's Job rules the flags say, or what is wrong with them.
func (f jobRuleFlags) rules() (job.Rules, error) {
	r := job.Rules{
		ServiceAccount:         strings.TrimSpace(f.serviceAccount),
		Reserved:               reservedServiceAccounts,
		AllowedServiceAccounts: splitList(f.allowedServiceAccounts),
		ImagePrefixes:          splitList(f.imagePrefixes),
	}
	for _, s := range splitList(f.privilegedSteps) {
		r.PrivilegedKinds = append(r.PrivilegedKinds, job.Kind(s))
	}
	if r.ServiceAccount == "" {
		return r, fmt.Errorf("--job-service-account must name a service account")
	}
	for _, sa := range reservedServiceAccounts {
		if r.ServiceAccount == sa {
			return r, fmt.Errorf("--job-service-account %q is gpuhealth's own identity, not one for Jobs", sa)
		}
	}
	if err := r.Validate(); err != nil {
		return r, fmt.Errorf("--job-*: %w", err)
	}
	return r, nil
}

// splitList splits a comma-separated list, dropping blanks around and
// between the commas: "" is the empty list, never one empty item (an
// empty image prefix would allow every image).
func splitList(s string) []string {
	var out []string
	for item := range strings.SplitSeq(s, ",") {
		if item = strings.TrimSpace(item); item != "" {
			out = append(out, item)
		}
	}
	return out
}
