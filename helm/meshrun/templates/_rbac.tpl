{{/*
The operator's permissions, grouped by purpose. Every verb here is one the operator really uses
(meshrun_operator/client/kube.py and reconcile.py for its own calls, kopf for watching and
bookkeeping); tests/helm/test_chart_rbac.py runs the operator with exactly these rules.
*/}}

{{/* Rules on namespaced objects: a ClusterRole in cluster-wide mode, a Role per namespace otherwise. */}}
{{- define "meshrun.namespacedRules" -}}
# ParallelTrainingJobs: kopf lists and watches them and patches its finalizer and bookkeeping
# annotations (meshrun.dev/*); the reconciler re-reads a job after a conflicting write (get) and
# deletes it once ttlSecondsAfterFinished ran out.
- apiGroups: [meshrun.dev]
  resources: [paralleltrainingjobs]
  verbs: [get, list, watch, patch, delete]
# Job status: written with one merge patch of the status subresource per change.
- apiGroups: [meshrun.dev]
  resources: [paralleltrainingjobs/status]
  verbs: [patch]
# Children carry ownerReferences with blockOwnerDeletion; API servers with the
# OwnerReferencesPermissionEnforcement admission plugin (OpenShift) require this to create them.
- apiGroups: [meshrun.dev]
  resources: [paralleltrainingjobs/finalizers]
  verbs: [update]
# Gang pods: watched through a kopf index, created together, read when a name is still held (by a
# pod of the previous attempt or of an earlier job of the same name), deleted for a whole-gang
# restart (force-deleted on a lost node) and when orphaned. No update or patch.
- apiGroups: [""]
  resources: [pods]
  verbs: [list, watch, get, create, delete]
# Rendezvous: one headless Service per job, watched (one deleted while the job runs is created
# again), created once and garbage-collected with the job; read when its name is taken (an
# earlier job's still terminating), deleted (uid and resourceVersion preconditioned) only when
# it is an orphan carrying meshrun's labels and the job's name.
- apiGroups: [""]
  resources: [services]
  verbs: [list, watch, get, create, delete]
# Events on jobs: the reconciler's and kopf's (warnings and errors) for `kubectl describe`.
- apiGroups: [""]
  resources: [events]
  verbs: [create]
{{- if .Values.networkPolicy.enabled }}
# Tenancy: one NetworkPolicy per job (only its own pods, and the operator on 9400, get in),
# watched and created like the Service (read when its name is taken, deleted only when it is
# meshrun's orphan), garbage-collected with the job.
- apiGroups: [networking.k8s.io]
  resources: [networkpolicies]
  verbs: [list, watch, get, create, delete]
{{- end }}
{{- if .Values.operator.kueue }}
# Kueue: one Workload per job with a queue name, created once (garbage-collected with the
# job), watched for Kueue's verdict; its status patched (PodsReady, the release after an
# eviction, Finished); the job's LocalQueue read for the flavors its pods must tolerate.
- apiGroups: [kueue.x-k8s.io]
  resources: [workloads]
  verbs: [list, watch, create]
- apiGroups: [kueue.x-k8s.io]
  resources: [workloads/status]
  verbs: [patch]
- apiGroups: [kueue.x-k8s.io]
  resources: [localqueues]
  verbs: [get]
{{- end }}
{{- if .Values.rbac.podGroups }}
# Gang scheduling: a PodGroup per job for volcano or scheduler-plugins coscheduling.
- apiGroups: [scheduling.volcano.sh, scheduling.x-k8s.io]
  resources: [podgroups]
  verbs: [create]
{{- end }}
{{- end }}

{{/* Rules on cluster-scoped objects: read-only, in both modes. */}}
{{- define "meshrun.clusterRules" -}}
# kopf notices the ParallelTrainingJob CRD being installed, upgraded or removed while it runs
# (without this it scans the API only at start and logs a warning).
- apiGroups: [apiextensions.k8s.io]
  resources: [customresourcedefinitions]
  verbs: [list, watch]
{{- if .Values.watchNamespaces }}
# Namespaced mode only: kopf lists and watches Namespace objects to resolve the namespaces it
# serves; without this it retries the 403 for about a minute before starting (kopf
# _core/reactor/observation.py). Read-only: names and labels, not what is inside.
- apiGroups: [""]
  resources: [namespaces]
  verbs: [list, watch]
{{- end }}
{{- if .Values.operator.kueue }}
# Kueue: a job's priority (WorkloadPriorityClass), its queue's flavors (ClusterQueue) and the
# admitted flavors' node labels and tolerations (ResourceFlavor). Read-only.
- apiGroups: [kueue.x-k8s.io]
  resources: [clusterqueues, resourceflavors, workloadpriorityclasses]
  verbs: [get]
{{- end }}
{{- if .Values.operator.watchNodes }}
# Node health: pods on a NotReady or deleted node are replaced instead of hanging (Kubeflow #2072).
- apiGroups: [""]
  resources: [nodes]
  verbs: [list, watch]
{{- end }}
{{- end }}

{{/* Leader election: the Lease in the release namespace (read, created once, renewed). */}}
{{- define "meshrun.leaderRules" -}}
# Leader election: only the holder of this Lease acts. create cannot be limited to a name.
- apiGroups: [coordination.k8s.io]
  resources: [leases]
  verbs: [create]
- apiGroups: [coordination.k8s.io]
  resources: [leases]
  resourceNames: [{{ include "meshrun.fullname" . }}]
  verbs: [get, update]
{{- end }}
