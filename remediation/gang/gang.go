// Package gang finds the gang of a pod: the set of pods that only make
// progress together (the ranks of one multi-node training job), as each
// workload kind marks it. It is pure: it reads the pod it is given and
// nothing else.
package gang

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
)

// Kind is the workload kind that marks a gang.
type Kind string

// The kinds gpuhealth knows, in the order a pod is matched against them:
// the first that marks the pod names its gang, so a JobSet that Kueue
// admitted is a JobSet gang and a LeaderWorkerSet group stays one group.
const (
	PodGroup        Kind = "PodGroup"
	LeaderWorkerSet Kind = "LeaderWorkerSet"
	JobSet          Kind = "JobSet"
	Kubeflow        Kind = "Kubeflow"
	Volcano         Kind = "Volcano"
	KAI             Kind = "KAI"
	Coscheduling    Kind = "Coscheduling"
	Ray             Kind = "Ray"
	Kueue           Kind = "Kueue"
	// Label is a gang named by one of the policy's own label keys.
	Label Kind = "Label"
)

// Kinds are every kind a gang may be of, in match order, then Label.
func Kinds() []Kind {
	out := make([]Kind, 0, len(table)+1)
	for _, r := range table {
		out = append(out, r.kind)
	}
	return append(out, Label)
}

// Key names one gang. Gangs are namespaced: pods of one gang always share
// the namespace, and a pod can never pull pods of another namespace into
// its gang. Part tells apart gangs of one object: a LeaderWorkerSet's
// groups, a JobSet's restarts.
type Key struct {
	Kind      Kind
	Namespace string
	Name      string
	Part      string
}

// String is the key as people read it: "JobSet train/llama (restart 2)".
func (k Key) String() string {
	s := fmt.Sprintf("%s %s/%s", k.Kind, k.Namespace, k.Name)
	if k.Part != "" {
		s += " (" + k.Part + ")"
	}
	return s
}

// Owner is the object that stands for a gang, for an Event on it; the zero
// Owner when the gang has none to name.
type Owner struct {
	APIVersion, Kind, Name string
	// UID is the object's, where a member carries it (a label or its
	// controller reference), so the Event shows on `kubectl describe`.
	UID types.UID
}

// row is one kind's marks, with the source each fact comes from.
type row struct {
	kind Kind
	// of returns the gang's name and part if the pod carries the kind's
	// marks.
	of func(pod *corev1.Pod) (name, part string, ok bool)
	// selector narrows a list of the namespace's pods to the gang's
	// candidates; nil when the mark is not a label (every pod of the
	// namespace is a candidate and of decides).
	selector func(name, part string) labels.Selector
	// owner is the object standing for the gang.
	owner func(name string, pod *corev1.Pod) Owner
}

// The label and annotation keys of each kind, as their projects define
// them (versions and files in the comments of table).
const (
	jobSetName          = "jobset.sigs.k8s.io/jobset-name"
	jobSetRestart       = "jobset.sigs.k8s.io/restart-attempt"
	jobSetUID           = "jobset.sigs.k8s.io/jobset-uid"
	lwsName             = "leaderworkerset.sigs.k8s.io/name"
	lwsGroup            = "leaderworkerset.sigs.k8s.io/group-index"
	kubeflowJobName     = "training.kubeflow.org/job-name"
	kubeflowOperator    = "training.kubeflow.org/operator-name"
	volcanoGroup        = "scheduling.k8s.io/group-name"
	volcanoGroupAlt     = "scheduling.volcano.sh/group-name"
	kaiGroup            = "pod-group-name"
	coschedulingGroup   = "scheduling.x-k8s.io/pod-group"
	rayCluster          = "ray.io/cluster"
	rayReplica          = "ray.io/worker-group-replica-name"
	kueuePodGroup       = "kueue.x-k8s.io/pod-group-name"
	kueueWorkload       = "kueue.x-k8s.io/workload"
	kueuePodSet         = "kueue.x-k8s.io/podset"
	schedulingV1beta1   = "scheduling.k8s.io/v1beta1"
	kueueWorkloadAPI    = "kueue.x-k8s.io/v1beta2"
	volcanoPodGroupAPI  = "scheduling.volcano.sh/v1beta1"
	kaiPodGroupAPI      = "scheduling.run.ai/v2alpha2"
	coschedulingAPI     = "scheduling.x-k8s.io/v1alpha1"
	jobSetAPI           = "jobset.x-k8s.io/v1alpha2"
	lwsAPI              = "leaderworkerset.x-k8s.io/v1"
	rayAPI              = "ray.io/v1"
	kubeflowAPIGroup    = "kubeflow.org"
	batchAPI            = "batch/v1"
	podGroupKindName    = "PodGroup"
	workloadKindName    = "Workload"
	maxLabelValueLength = 63
)

// table is every kind gpuhealth knows, in match order.
var table = []row{
	{
		// Kubernetes 1.37 core gang API: pod.spec.schedulingGroup.podGroupName
		// (core/v1 PodSchedulingGroup, gate GenericWorkload) names a
		// scheduling.k8s.io/v1beta1 PodGroup of the pod's namespace; no label
		// carries it. kubernetes/api core/v1/types.go.
		kind: PodGroup,
		of: func(pod *corev1.Pod) (string, string, bool) {
			if g := pod.Spec.SchedulingGroup; g != nil && g.PodGroupName != nil && *g.PodGroupName != "" {
				return *g.PodGroupName, "", true
			}
			return "", "", false
		},
		owner: func(name string, _ *corev1.Pod) Owner {
			return Owner{APIVersion: schedulingV1beta1, Kind: podGroupKindName, Name: name}
		},
	},
	{
		// LeaderWorkerSet v0.10.0: labels leaderworkerset.sigs.k8s.io/name and
		// group-index on leader and worker pods; one group is the unit its
		// RecreateGroupOnPodRestart policy restarts.
		// lws api/leaderworkerset/v1/leaderworkerset_types.go.
		kind:     LeaderWorkerSet,
		of:       labelPair(lwsName, lwsGroup),
		selector: pairSelector(lwsName, lwsGroup),
		owner: func(name string, _ *corev1.Pod) Owner {
			return Owner{APIVersion: lwsAPI, Kind: "LeaderWorkerSet", Name: name}
		},
	},
	{
		// JobSet v0.12.0 (and Kubeflow Trainer v2, whose TrainJob makes a
		// JobSet of its name): label jobset.sigs.k8s.io/jobset-name on Jobs
		// and pods, and restart-attempt, the JobSet's restart generation, so
		// a restarted JobSet is a new gang. jobset pkg/constants/constants.go.
		kind:     JobSet,
		of:       labelPair(jobSetName, jobSetRestart),
		selector: pairSelector(jobSetName, jobSetRestart),
		owner: func(name string, pod *corev1.Pod) Owner {
			return Owner{APIVersion: jobSetAPI, Kind: "JobSet", Name: name, UID: types.UID(pod.Labels[jobSetUID])}
		},
	},
	{
		// Kubeflow training-operator v1 (PyTorchJob, TFJob, …) and
		// mpi-operator v2beta1: label training.kubeflow.org/job-name, with
		// operator-name telling the job kinds apart (two kinds may share a
		// name). trainer v1.9.4 pkg/apis/kubeflow.org/v1/common_types.go;
		// mpi-operator pkg/apis/kubeflow/v2beta1/constants.go.
		kind:     Kubeflow,
		of:       labelPair(kubeflowJobName, kubeflowOperator),
		selector: pairSelector(kubeflowJobName, kubeflowOperator),
		owner: func(name string, pod *corev1.Pod) Owner {
			if ref := metav1.GetControllerOf(pod); ref != nil && ref.Name == name && strings.HasPrefix(ref.APIVersion, kubeflowAPIGroup+"/") {
				return Owner{APIVersion: ref.APIVersion, Kind: ref.Kind, Name: ref.Name, UID: ref.UID}
			}
			return Owner{}
		},
	},
	{
		// Volcano v1.15.1: pod annotation scheduling.k8s.io/group-name (or
		// scheduling.volcano.sh/group-name) names a scheduling.volcano.sh
		// PodGroup. volcano apis/pkg/apis/scheduling/v1beta1/labels.go.
		kind: Volcano,
		of: func(pod *corev1.Pod) (string, string, bool) {
			n := cmp.Or(pod.Annotations[volcanoGroup], pod.Annotations[volcanoGroupAlt])
			return n, "", n != ""
		},
		owner: func(name string, _ *corev1.Pod) Owner {
			return Owner{APIVersion: volcanoPodGroupAPI, Kind: podGroupKindName, Name: name}
		},
	},
	{
		// KAI Scheduler v0.20.1: pod annotation pod-group-name (no prefix)
		// names a scheduling.run.ai/v2alpha2 PodGroup.
		// KAI pkg/common/constants/constants.go.
		kind: KAI,
		of: func(pod *corev1.Pod) (string, string, bool) {
			n := pod.Annotations[kaiGroup]
			return n, "", n != ""
		},
		owner: func(name string, _ *corev1.Pod) Owner {
			return Owner{APIVersion: kaiPodGroupAPI, Kind: podGroupKindName, Name: name}
		},
	},
	{
		// scheduler-plugins coscheduling: label scheduling.x-k8s.io/pod-group.
		// scheduler-plugins apis/scheduling/v1alpha1/types.go.
		kind:     Coscheduling,
		of:       labelPair(coschedulingGroup, ""),
		selector: pairSelector(coschedulingGroup, ""),
		owner: func(name string, _ *corev1.Pod) Owner {
			return Owner{APIVersion: coschedulingAPI, Kind: podGroupKindName, Name: name}
		},
	},
	{
		// KubeRay v1.7.0: label ray.io/cluster on head and workers; a
		// multi-host worker group replica (ray.io/worker-group-replica-name)
		// is its own gang, which RayMultiHostIndexing deletes whole.
		// kuberay ray-operator/controllers/ray/utils/constant.go.
		kind:     Ray,
		of:       labelPair(rayCluster, rayReplica),
		selector: pairSelector(rayCluster, rayReplica),
		owner: func(name string, _ *corev1.Pod) Owner {
			return Owner{APIVersion: rayAPI, Kind: "RayCluster", Name: name}
		},
	},
	{
		// Kueue v0.17.0: plain pods of a pod group carry label
		// kueue.x-k8s.io/pod-group-name (the Workload's name); a job's pods
		// carry kueue.x-k8s.io/podset and, with TopologyAwareScheduling, the
		// annotation kueue.x-k8s.io/workload. Failing both, the gang is the
		// pods of the pod's controlling Job.
		// kueue pkg/controller/jobs/pod/constants, jobframework/reconciler.go.
		kind: Kueue,
		of: func(pod *corev1.Pod) (string, string, bool) {
			if n := pod.Labels[kueuePodGroup]; n != "" {
				return n, "", true
			}
			if _, ok := pod.Labels[kueuePodSet]; !ok {
				return "", "", false
			}
			if n := pod.Annotations[kueueWorkload]; n != "" {
				return n, "", true
			}
			if ref := metav1.GetControllerOf(pod); ref != nil && ref.APIVersion == batchAPI && ref.Kind == "Job" {
				return "job/" + ref.Name, string(ref.UID), true
			}
			return "", "", false
		},
		// No selector: a Job's pods carry batch.kubernetes.io/controller-uid
		// only when the Job controller chose the selector (not with
		// manualSelector) and since 1.27, so Of decides every pod of the
		// namespace.
		owner: func(name string, pod *corev1.Pod) Owner {
			if job, ok := strings.CutPrefix(name, "job/"); ok {
				o := Owner{APIVersion: batchAPI, Kind: "Job", Name: job}
				if ref := metav1.GetControllerOf(pod); ref != nil && ref.Name == job {
					o.UID = ref.UID
				}
				return o
			}
			return Owner{APIVersion: kueueWorkloadAPI, Kind: workloadKindName, Name: name}
		},
	},
}

// kueueLabels are the labels Kueue v0.17.0 puts on (or asks of) the pods
// it manages: the user's queue-name, the pod set Kueue assigned, a plain
// pod group's name and its managed mark (kueue pkg/controller/constants,
// jobs/pod/constants).
var kueueLabels = []string{"kueue.x-k8s.io/queue-name", kueuePodSet, kueuePodGroup, "kueue.x-k8s.io/managed"}

// KueueManaged reports whether Kueue manages pod's workload.
func KueueManaged(pod *corev1.Pod) bool {
	return slices.ContainsFunc(kueueLabels, func(k string) bool { return pod.Labels[k] != "" })
}

// Finder finds gangs by the kinds of table and the policy's own label keys.
type Finder struct {
	// extra are label keys of the policy: pods with equal values of one of
	// them in one namespace are a gang, when no kind marks them.
	extra []string
}

// NewFinder returns a Finder that also takes each of extraLabelKeys as the
// name of a gang.
func NewFinder(extraLabelKeys []string) Finder {
	return Finder{extra: slices.Clone(extraLabelKeys)}
}

// Of returns the gang pod belongs to, or false when it is in none. A name
// that could not be an object's (an annotation's value may be anything)
// marks no gang.
func (f Finder) Of(pod *corev1.Pod) (Key, bool) {
	for _, r := range table {
		if name, part, ok := r.of(pod); ok {
			if len(validation.IsDNS1123Subdomain(strings.TrimPrefix(name, "job/"))) > 0 {
				return Key{}, false
			}
			return Key{Kind: r.kind, Namespace: pod.Namespace, Name: name, Part: part}, true
		}
	}
	for _, k := range f.extra {
		if v := pod.Labels[k]; v != "" {
			return Key{Kind: Label, Namespace: pod.Namespace, Name: v, Part: k}, true
		}
	}
	return Key{}, false
}

// Candidates is a label selector narrowing a list of the gang's namespace
// to pods that may belong to it (labels.Everything when the gang's mark is
// not a label); Of decides each.
func (f Finder) Candidates(k Key) labels.Selector {
	if k.Kind == Label {
		return mustSelector(k.Part, selection.Equals, k.Name)
	}
	for _, r := range table {
		if r.kind == k.Kind && r.selector != nil {
			if s := r.selector(k.Name, k.Part); s != nil {
				return s
			}
		}
	}
	return labels.Everything()
}

// OwnerOf returns the object standing for the gang of pod (a member).
func (f Finder) OwnerOf(k Key, pod *corev1.Pod) Owner {
	for _, r := range table {
		if r.kind == k.Kind {
			return r.owner(k.Name, pod)
		}
	}
	return Owner{}
}

// labelPair returns a row's of for a gang named by label key and told
// apart by label part (none when part is ""; an absent part label is "").
func labelPair(key, part string) func(pod *corev1.Pod) (string, string, bool) {
	return func(pod *corev1.Pod) (string, string, bool) {
		name := pod.Labels[key]
		if name == "" {
			return "", "", false
		}
		if part == "" {
			return name, "", true
		}
		return name, pod.Labels[part], true
	}
}

// pairSelector is labelPair's candidates: key equal to name, and part
// equal to the part when it has one (a pod without the part label, or with
// it empty, is left to Of).
func pairSelector(key, part string) func(name, value string) labels.Selector {
	return func(name, value string) labels.Selector {
		s := mustSelector(key, selection.Equals, name)
		if part == "" || value == "" {
			return s
		}
		req, err := labels.NewRequirement(part, selection.Equals, []string{value})
		if err != nil {
			return s
		}
		return s.Add(*req)
	}
}

// mustSelector is a one-requirement selector; a value that is not a valid
// label value (it came from an annotation or an owner) gives a selector
// that narrows nothing, so Of still decides and no member is missed.
func mustSelector(key string, op selection.Operator, value string) labels.Selector {
	if len(value) > maxLabelValueLength {
		return labels.Everything()
	}
	req, err := labels.NewRequirement(key, op, []string{value})
	if err != nil {
		return labels.Everything()
	}
	return labels.NewSelector().Add(*req)
}
