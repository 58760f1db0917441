{{/* Common names and labels. */}}
{{- define "plrl.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "plrl.serviceAccountName" -}}
{{- default (include "plrl.fullname" .) .Values.serviceAccount.name -}}
{{- end -}}

{{/* The ClusterRole every job's workers are bound to in their namespace (rbac.yaml). */}}
{{- define "plrl.workerRoleName" -}}
{{- printf "%s-worker" (include "plrl.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "plrl.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "plrl.labels" -}}
{{ include "plrl.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/*
The rules the operator needs in every namespace it watches. Children are garbage-collected
through owner references, so "delete" appears once: on pods, for replacing a hung worker (its
process is alive, so its kubelet would never restart it).
It creates no Roles: each job's RoleBinding grants the chart's worker ClusterRole
("plrl.workerRoleName", Leases only) to the job's ServiceAccount, and `bind` is allowed on that one
ClusterRole by name, so the operator cannot grant any other role, nor write one.
*/}}
{{- define "plrl.namespacedRules" -}}
- apiGroups: [pipelinerl.io]
  resources: [pipelinerljobs]
  verbs: [get, list, watch, patch]
- apiGroups: [pipelinerl.io]
  resources: [pipelinerljobs/status]
  verbs: [get, patch]
- apiGroups: [pipelinerl.io]
  resources: [pipelinerljobs/finalizers]
  verbs: [update]
- apiGroups: [apps]
  resources: [statefulsets]
  verbs: [get, list, watch, create, patch]
- apiGroups: [""]
  resources: [configmaps, services, serviceaccounts]
  verbs: [get, list, create, patch]
# Secrets: only the job's token Secret, created once and read back by its name; never list or watch
# (that would read every Secret in the namespace).
- apiGroups: [""]
  resources: [secrets]
  verbs: [get, create]
- apiGroups: [rbac.authorization.k8s.io]
  resources: [rolebindings]
  verbs: [get, list, create, patch]
- apiGroups: [rbac.authorization.k8s.io]
  resources: [clusterroles]
  verbs: [bind]
  resourceNames: [{{ include "plrl.workerRoleName" . }}]
- apiGroups: [networking.k8s.io]
  resources: [networkpolicies]
  verbs: [get, list, create, patch]
- apiGroups: [""]
  resources: [pods]
  verbs: [list, watch, delete]
- apiGroups: [coordination.k8s.io]
  resources: [leases]
  verbs: [get, list, watch, create, update, patch]
- apiGroups: ["", events.k8s.io]
  resources: [events]
  verbs: [create, patch]
{{- end -}}
