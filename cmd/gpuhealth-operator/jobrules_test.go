package main

import (
	"strings"
	"testing"

	. "github.com/onsi/gomega"

	"github.com/gpuhealth/gpuhealth/remediation/job"
)

func TestJobRuleFlags(t *testing.T) {
	cases := []struct {
		name    string
		flags   jobRuleFlags
		want    job.Rules
		wantErr string
	}{
		{
			name: "the chart's defaults",
			flags: jobRuleFlags{serviceAccount: "gpuhealth-job", privilegedSteps: "reset,reboot",
				imagePrefixes: "nvcr.io/nvidia/,registry.k8s.io/e2e-test-images/agnhost:,ghcr.io/gpuhealth/"},
			want: job.Rules{ServiceAccount: "gpuhealth-job", Reserved: reservedServiceAccounts, PrivilegedKinds: []job.Kind{job.ResetGPU, job.RebootNode},
				ImagePrefixes: []string{"nvcr.io/nvidia/", "registry.k8s.io/e2e-test-images/agnhost:", "ghcr.io/gpuhealth/"}},
		},
		{
			name:  "empty lists are empty, and blanks between commas are dropped",
			flags: jobRuleFlags{serviceAccount: "gpuhealth-job", allowedServiceAccounts: " dcgm , ,nccl,", imagePrefixes: ","},
			want:  job.Rules{ServiceAccount: "gpuhealth-job", Reserved: reservedServiceAccounts, AllowedServiceAccounts: []string{"dcgm", "nccl"}},
		},
		{name: "no Job account", flags: jobRuleFlags{}, wantErr: "--job-service-account must name a service account"},
		{name: "the operator's account as the Job account", flags: jobRuleFlags{serviceAccount: "gpuhealth-operator"}, wantErr: "gpuhealth's own identity"},
		{name: "an unknown step", flags: jobRuleFlags{serviceAccount: "gpuhealth-job", privilegedSteps: "resetGPU"}, wantErr: `step "resetGPU" is not one of`},
		{name: "a prefix that does not end a registry or path", flags: jobRuleFlags{serviceAccount: "gpuhealth-job", imagePrefixes: "nvcr.io"}, wantErr: `image prefix "nvcr.io" must end in`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			got, err := tc.flags.rules()
			if tc.wantErr != "" {
				g.Expect(err).To(MatchError(ContainSubstring(tc.wantErr)))
				return
			}
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(got).To(Equal(tc.want))
		})
	}
}

// FuzzSplitList: no item is empty or padded, and every item is in the input.
func FuzzSplitList(f *testing.F) {
	for _, s := range []string{"", ",", "a", " a , b ,,c", "nvcr.io/nvidia/,ghcr.io/x/"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		for _, item := range splitList(s) {
			if item == "" || strings.TrimSpace(item) != item || strings.Contains(item, ",") || !strings.Contains(s, item) {
				t.Fatalf("splitList(%q) gave item %q", s, item)
			}
		}
	})
}
