package gang_test

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/gpuhealth/gpuhealth/remediation/gang"
)

// pod builds a pod of namespace "train" as each workload's controller
// labels it (facts: shared reference gangs.md §2).
func pod(name string, lbls, annotations map[string]string, mutate ...func(*corev1.Pod)) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "train", Name: name, Labels: lbls, Annotations: annotations}}
	for _, m := range mutate {
		m(p)
	}
	return p
}

func controlledBy(apiVersion, kind, name, uid string) func(*corev1.Pod) {
	return func(p *corev1.Pod) {
		p.OwnerReferences = []metav1.OwnerReference{{APIVersion: apiVersion, Kind: kind, Name: name, UID: types.UID(uid), Controller: ptr.To(true)}}
	}
}

func TestOf(t *testing.T) {
	f := gang.NewFinder([]string{"example.com/gang"})
	for _, tc := range []struct {
		name      string
		pod       *corev1.Pod
		want      gang.Key
		wantOwner gang.Owner
		none      bool
	}{
		{
			name: "core PodGroup by spec.schedulingGroup",
			pod: pod("w-0", nil, nil, func(p *corev1.Pod) {
				p.Spec.SchedulingGroup = &corev1.PodSchedulingGroup{PodGroupName: ptr.To("llama")}
			}),
			want:      gang.Key{Kind: gang.PodGroup, Namespace: "train", Name: "llama"},
			wantOwner: gang.Owner{APIVersion: "scheduling.k8s.io/v1beta1", Kind: "PodGroup", Name: "llama"},
		},
		{
			name: "JobSet with its restart attempt",
			pod: pod("llama-workers-0-3-x", map[string]string{
				"jobset.sigs.k8s.io/jobset-name": "llama", "jobset.sigs.k8s.io/restart-attempt": "2",
				"jobset.sigs.k8s.io/replicatedjob-name": "workers", "batch.kubernetes.io/job-name": "llama-workers-0",
				"jobset.sigs.k8s.io/jobset-uid": "js-uid",
			}, nil, controlledBy("batch/v1", "Job", "llama-workers-0", "u1")),
			want:      gang.Key{Kind: gang.JobSet, Namespace: "train", Name: "llama", Part: "2"},
			wantOwner: gang.Owner{APIVersion: "jobset.x-k8s.io/v1alpha2", Kind: "JobSet", Name: "llama", UID: "js-uid"},
		},
		{
			name: "a JobSet Kueue admitted is a JobSet gang",
			pod: pod("x", map[string]string{
				"jobset.sigs.k8s.io/jobset-name": "llama", "jobset.sigs.k8s.io/restart-attempt": "0",
				"kueue.x-k8s.io/podset": "workers", "kueue.x-k8s.io/queue-name": "q",
			}, nil),
			want:      gang.Key{Kind: gang.JobSet, Namespace: "train", Name: "llama", Part: "0"},
			wantOwner: gang.Owner{APIVersion: "jobset.x-k8s.io/v1alpha2", Kind: "JobSet", Name: "llama"},
		},
		{
			name: "LeaderWorkerSet: one group",
			pod: pod("vllm-1-2", map[string]string{
				"leaderworkerset.sigs.k8s.io/name": "vllm", "leaderworkerset.sigs.k8s.io/group-index": "1",
				"leaderworkerset.sigs.k8s.io/worker-index": "2",
			}, nil),
			want:      gang.Key{Kind: gang.LeaderWorkerSet, Namespace: "train", Name: "vllm", Part: "1"},
			wantOwner: gang.Owner{APIVersion: "leaderworkerset.x-k8s.io/v1", Kind: "LeaderWorkerSet", Name: "vllm"},
		},
		{
			name: "PyTorchJob",
			pod: pod("bert-worker-3", map[string]string{
				"training.kubeflow.org/job-name": "bert", "training.kubeflow.org/operator-name": "pytorchjob-controller",
				"training.kubeflow.org/replica-type": "worker",
			}, nil, controlledBy("kubeflow.org/v1", "PyTorchJob", "bert", "u2")),
			want:      gang.Key{Kind: gang.Kubeflow, Namespace: "train", Name: "bert", Part: "pytorchjob-controller"},
			wantOwner: gang.Owner{APIVersion: "kubeflow.org/v1", Kind: "PyTorchJob", Name: "bert", UID: "u2"},
		},
		{
			name: "MPIJob worker",
			pod: pod("nccl-worker-0", map[string]string{
				"training.kubeflow.org/job-name": "nccl", "training.kubeflow.org/operator-name": "mpi-operator",
			}, nil, controlledBy("kubeflow.org/v2beta1", "MPIJob", "nccl", "u3")),
			want:      gang.Key{Kind: gang.Kubeflow, Namespace: "train", Name: "nccl", Part: "mpi-operator"},
			wantOwner: gang.Owner{APIVersion: "kubeflow.org/v2beta1", Kind: "MPIJob", Name: "nccl", UID: "u3"},
		},
		{
			name:      "Volcano by annotation",
			pod:       pod("v-0", map[string]string{"volcano.sh/job-name": "v"}, map[string]string{"scheduling.k8s.io/group-name": "v-pg"}),
			want:      gang.Key{Kind: gang.Volcano, Namespace: "train", Name: "v-pg"},
			wantOwner: gang.Owner{APIVersion: "scheduling.volcano.sh/v1beta1", Kind: "PodGroup", Name: "v-pg"},
		},
		{
			name:      "Volcano by its own annotation key",
			pod:       pod("v-1", nil, map[string]string{"scheduling.volcano.sh/group-name": "v-pg"}),
			want:      gang.Key{Kind: gang.Volcano, Namespace: "train", Name: "v-pg"},
			wantOwner: gang.Owner{APIVersion: "scheduling.volcano.sh/v1beta1", Kind: "PodGroup", Name: "v-pg"},
		},
		{
			name:      "KAI by annotation",
			pod:       pod("k-0", map[string]string{"kai.scheduler/queue": "research"}, map[string]string{"pod-group-name": "pg-k"}),
			want:      gang.Key{Kind: gang.KAI, Namespace: "train", Name: "pg-k"},
			wantOwner: gang.Owner{APIVersion: "scheduling.run.ai/v2alpha2", Kind: "PodGroup", Name: "pg-k"},
		},
		{
			name:      "coscheduling by label",
			pod:       pod("c-0", map[string]string{"scheduling.x-k8s.io/pod-group": "pg-c"}, nil),
			want:      gang.Key{Kind: gang.Coscheduling, Namespace: "train", Name: "pg-c"},
			wantOwner: gang.Owner{APIVersion: "scheduling.x-k8s.io/v1alpha1", Kind: "PodGroup", Name: "pg-c"},
		},
		{
			name:      "Ray cluster",
			pod:       pod("r-w", map[string]string{"ray.io/cluster": "rc", "ray.io/node-type": "worker"}, nil),
			want:      gang.Key{Kind: gang.Ray, Namespace: "train", Name: "rc"},
			wantOwner: gang.Owner{APIVersion: "ray.io/v1", Kind: "RayCluster", Name: "rc"},
		},
		{
			name:      "Ray multi-host replica",
			pod:       pod("r-w2", map[string]string{"ray.io/cluster": "rc", "ray.io/worker-group-replica-name": "tpu-0"}, nil),
			want:      gang.Key{Kind: gang.Ray, Namespace: "train", Name: "rc", Part: "tpu-0"},
			wantOwner: gang.Owner{APIVersion: "ray.io/v1", Kind: "RayCluster", Name: "rc"},
		},
		{
			name:      "Kueue plain pod group",
			pod:       pod("p-0", map[string]string{"kueue.x-k8s.io/pod-group-name": "grp", "kueue.x-k8s.io/managed": "true"}, nil),
			want:      gang.Key{Kind: gang.Kueue, Namespace: "train", Name: "grp"},
			wantOwner: gang.Owner{APIVersion: "kueue.x-k8s.io/v1beta2", Kind: "Workload", Name: "grp"},
		},
		{
			name: "Kueue job with a topology assignment names its Workload",
			pod: pod("j-0", map[string]string{"kueue.x-k8s.io/podset": "main"}, map[string]string{"kueue.x-k8s.io/workload": "job-j-1a2b3"},
				controlledBy("batch/v1", "Job", "j", "u4")),
			want:      gang.Key{Kind: gang.Kueue, Namespace: "train", Name: "job-j-1a2b3"},
			wantOwner: gang.Owner{APIVersion: "kueue.x-k8s.io/v1beta2", Kind: "Workload", Name: "job-j-1a2b3"},
		},
		{
			name:      "Kueue job without one: the pods of its Job",
			pod:       pod("j-1", map[string]string{"kueue.x-k8s.io/podset": "main", "batch.kubernetes.io/controller-uid": "u5"}, nil, controlledBy("batch/v1", "Job", "j", "u5")),
			want:      gang.Key{Kind: gang.Kueue, Namespace: "train", Name: "job/j", Part: "u5"},
			wantOwner: gang.Owner{APIVersion: "batch/v1", Kind: "Job", Name: "j", UID: "u5"},
		},
		{
			name:      "the policy's own label key",
			pod:       pod("l-0", map[string]string{"example.com/gang": "exp-7"}, nil),
			want:      gang.Key{Kind: gang.Label, Namespace: "train", Name: "exp-7", Part: "example.com/gang"},
			wantOwner: gang.Owner{},
		},
		{name: "a plain Job's pod is in no gang", pod: pod("plain", map[string]string{"batch.kubernetes.io/job-name": "x"}, nil, controlledBy("batch/v1", "Job", "x", "u6")), none: true},
		{name: "a Kueue pod set label without a Job is in no gang", pod: pod("odd", map[string]string{"kueue.x-k8s.io/podset": "main"}, nil), none: true},
		{name: "a name no object could have is no mark", pod: pod("v", nil, map[string]string{"scheduling.k8s.io/group-name": "Not A Name/" + string(make([]byte, 300))}), none: true},
		{name: "an empty mark is no mark", pod: pod("e", map[string]string{"jobset.sigs.k8s.io/jobset-name": "", "example.com/gang": ""}, map[string]string{"pod-group-name": ""}), none: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := f.Of(tc.pod)
			if tc.none {
				if ok {
					t.Fatalf("Of = %v, want no gang", got)
				}
				return
			}
			if !ok || got != tc.want {
				t.Fatalf("Of = %v, %v; want %v", got, ok, tc.want)
			}
			if o := f.OwnerOf(got, tc.pod); o != tc.wantOwner {
				t.Errorf("OwnerOf = %+v, want %+v", o, tc.wantOwner)
			}
			// Every member must be among the candidates its gang lists.
			if sel := f.Candidates(got); !sel.Matches(labels.Set(tc.pod.Labels)) {
				t.Errorf("Candidates(%v) = %q does not select the member", got, sel)
			}
		})
	}
}

// Two gangs on one node and pods of neither: each member is told apart,
// and a JobSet's restart is a new gang.
func TestMixedGangs(t *testing.T) {
	f := gang.NewFinder(nil)
	a0 := pod("a-0", map[string]string{"jobset.sigs.k8s.io/jobset-name": "a", "jobset.sigs.k8s.io/restart-attempt": "0"}, nil)
	a1 := pod("a-1", map[string]string{"jobset.sigs.k8s.io/jobset-name": "a", "jobset.sigs.k8s.io/restart-attempt": "1"}, nil)
	b0 := pod("b-0", map[string]string{"scheduling.x-k8s.io/pod-group": "b"}, nil)
	other := pod("web", map[string]string{"app": "web"}, nil)
	ka0, _ := f.Of(a0)
	ka1, _ := f.Of(a1)
	kb0, _ := f.Of(b0)
	if ka0 == ka1 {
		t.Errorf("restart 0 and 1 of JobSet a are one gang %v", ka0)
	}
	if ka0 == kb0 {
		t.Errorf("JobSet a and PodGroup b are one gang")
	}
	if _, ok := f.Of(other); ok {
		t.Errorf("a pod of no gang was given one")
	}
	// The candidates of restart 1 leave restart 0 out.
	if f.Candidates(ka1).Matches(labels.Set(a0.Labels)) {
		t.Errorf("candidates of %v select a pod of restart 0", ka1)
	}
	// Another namespace is never the same gang.
	elsewhere := a0.DeepCopy()
	elsewhere.Namespace = "other"
	if k, _ := f.Of(elsewhere); k == ka0 {
		t.Errorf("a pod of another namespace joined %v", ka0)
	}
}

func TestKeyString(t *testing.T) {
	k := gang.Key{Kind: gang.JobSet, Namespace: "train", Name: "llama", Part: "2"}
	if got, want := k.String(), "JobSet train/llama (2)"; got != want {
		t.Errorf("String = %q, want %q", got, want)
	}
}

func TestKueueManaged(t *testing.T) {
	for _, tc := range []struct {
		labels map[string]string
		want   bool
	}{
		{map[string]string{"kueue.x-k8s.io/queue-name": "team-a"}, true},
		{map[string]string{"kueue.x-k8s.io/podset": "main"}, true},
		{map[string]string{"kueue.x-k8s.io/pod-group-name": "g"}, true},
		{map[string]string{"jobset.sigs.k8s.io/jobset-name": "x"}, false},
		{nil, false},
	} {
		if got := gang.KueueManaged(pod("p", tc.labels, nil)); got != tc.want {
			t.Errorf("KueueManaged(%v) = %v, want %v", tc.labels, got, tc.want)
		}
	}
}

func TestKindsListsEveryKindOnce(t *testing.T) {
	ks := gang.Kinds()
	seen := map[gang.Kind]bool{}
	for _, k := range ks {
		if seen[k] {
			t.Errorf("kind %s listed twice", k)
		}
		seen[k] = true
	}
	for _, k := range []gang.Kind{gang.PodGroup, gang.LeaderWorkerSet, gang.JobSet, gang.Kubeflow, gang.Volcano, gang.KAI, gang.Coscheduling, gang.Ray, gang.Kueue, gang.Label} {
		if !seen[k] {
			t.Errorf("kind %s missing from Kinds", k)
		}
	}
}
