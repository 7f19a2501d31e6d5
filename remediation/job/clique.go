package job

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	gpuhealthv1alpha1 "github.com/gpuhealth/gpuhealth/api/v1alpha1"
)

const (
	// CliqueLabel carries the NVLink clique a clique certification Job tests.
	CliqueLabel = "gpuhealth.dev/clique"
	// EpisodeLabel carries the hash of the fabric fault episode a clique
	// certification Job belongs to.
	EpisodeLabel = "gpuhealth.dev/episode"
	// VerdictAnnotation holds the verdict gpuhealth reached on a finished
	// Job ("passed" or "failed: why"), so it is judged once.
	VerdictAnnotation = "gpuhealth.dev/verdict"
)

// Episode is the short hash naming a fabric fault episode by when it began.
func Episode(since string) string {
	sum := sha256.Sum256([]byte(since))
	return hex.EncodeToString(sum[:])[:8]
}

// CliqueName is the deterministic name of a clique certification Job: the
// clique's hash, the episode's and the attempt.
func CliqueName(clique, since string, attempt int32) string {
	sum := sha256.Sum256([]byte(clique))
	return "gpuhealth-clique-" + hex.EncodeToString(sum[:])[:10] + "-" + Episode(since) + "-" + strconv.Itoa(int(attempt))
}

// BuildClique returns the Indexed Job of a clique certification: one pod per
// node of nodes (required node affinity on their names, and required pod
// anti-affinity on the hostname among the Job's pods), tolerating the
// taints of Tolerations (the clique carries fabric-degraded), never
// restarted and without retries of its own. The caller has checked the
// template against the install's Rules, and that the policy it comes from
// manages every node of nodes. Completion index 0's output is judged.
func BuildClique(clique, since, namespace string, attempt int32, nodes []string, tmpl gpuhealthv1alpha1.JobTemplate, parser gpuhealthv1alpha1.ParserType, timeout time.Duration, env Env) *batchv1.Job {
	name := CliqueName(clique, since, attempt)
	ours := map[string]string{KindLabel: string(CliqueCertification), CliqueLabel: clique, EpisodeLabel: Episode(since),
		AttemptLabel: strconv.Itoa(int(attempt)), ParserLabel: string(parser)}
	affinity := &corev1.Affinity{
		NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: onNodes(nodes...)}},
		PodAntiAffinity: &corev1.PodAntiAffinity{RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{{
			LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{batchv1.JobNameLabel: name}},
			TopologyKey:   corev1.LabelHostname,
		}}},
	}
	j := build(name, namespace, CliqueCertification, ours, since, tmpl, affinity, timeout, env)
	n := int32(len(nodes))
	j.Spec.CompletionMode = ptr.To(batchv1.IndexedCompletion)
	j.Spec.Completions, j.Spec.Parallelism = ptr.To(n), ptr.To(n)
	return j
}
