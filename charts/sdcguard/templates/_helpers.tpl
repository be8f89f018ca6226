{{/* Object name prefix: the release name, plus the chart name unless it is already in it. */}}
{{- define "sdcguard.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "sdcguard.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "sdcguard.selectorLabels" -}}
app.kubernetes.io/name: {{ include "sdcguard.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "sdcguard.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "sdcguard.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: sdcguard
{{- end -}}

{{- define "sdcguard.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "sdcguard.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name: set the name of an existing ServiceAccount when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* repository:tag or repository@digest; arguments: (list image appVersion) */}}
{{- define "sdcguard.image" -}}
{{- $image := index . 0 -}}
{{- $appVersion := index . 1 -}}
{{- if $image.digest -}}
{{- printf "%s@%s" $image.repository $image.digest -}}
{{- else -}}
{{- printf "%s:%s" $image.repository (default $appVersion $image.tag) -}}
{{- end -}}
{{- end -}}

{{- define "sdcguard.probeImage" -}}
{{- include "sdcguard.image" (list .Values.probe.image .Chart.AppVersion) -}}
{{- end -}}

{{- define "sdcguard.probePriorityClassName" -}}
{{- if .Values.probe.priorityClass.create -}}
{{- default (printf "%s-probe" (include "sdcguard.fullname" .)) .Values.probe.priorityClass.name -}}
{{- else -}}
{{- .Values.probe.priorityClass.name -}}
{{- end -}}
{{- end -}}

{{/* Whether the operator may delete Nodes: asked for, or needed by the chart's policy. */}}
{{- define "sdcguard.nodeDelete" -}}
{{- $p := .Values.policy -}}
{{- if or .Values.rbac.allowNodeDelete (and $p.create (or (eq $p.repair.strategy "Replace") (eq $p.repair.retireAction "Delete"))) -}}
true
{{- end -}}
{{- end -}}

{{/* Whether the operator may evict Pods: asked for, or the chart's policy drains. */}}
{{- define "sdcguard.eviction" -}}
{{- $p := .Values.policy -}}
{{- if or .Values.rbac.allowEviction (and $p.create $p.quarantine.drain) -}}
true
{{- end -}}
{{- end -}}

{{/* Whether the operator may taint DRA devices: asked for, or the chart's policy has
quarantine.scope Device. */}}
{{- define "sdcguard.deviceTaints" -}}
{{- $p := .Values.policy -}}
{{- if or .Values.rbac.allowDeviceTaints (and $p.create (eq (toString $p.quarantine.scope) "Device")) -}}
true
{{- end -}}
{{- end -}}

{{/*
A map of entries keyed by name -> a list, dropping entries with enabled: false.
Arguments: (list map keyField). Each entry becomes {keyField: name, ...rest}.
*/}}
{{- define "sdcguard.mapToList" -}}
{{- $entries := index . 0 -}}
{{- $keyField := index . 1 -}}
{{- $out := list -}}
{{- range $name := keys $entries | sortAlpha -}}
{{- $entry := get $entries $name | default dict -}}
{{- if ne (toString (get $entry "enabled")) "false" -}}
{{- $item := omit $entry "enabled" -}}
{{- if not (hasKey $item $keyField) -}}
{{- $_ := set $item $keyField $name -}}
{{- end -}}
{{- $out = append $out $item -}}
{{- end -}}
{{- end -}}
{{- toYaml $out -}}
{{- end -}}

{{/*
The checks of one suite as a list in depth order (compute, collective, golden,
memory). Arguments: (list checksMap suiteName).
*/}}
{{- define "sdcguard.checks" -}}
{{- $checks := index . 0 -}}
{{- $suite := index . 1 -}}
{{- $out := list -}}
{{- range $name := list "compute" "collective" "golden" "memory" -}}
{{- if hasKey $checks $name -}}
{{- $c := get $checks $name | default dict -}}
{{- if ne (toString (get $c "enabled")) "false" -}}
{{- $item := dict "name" $name -}}
{{- if $c.params -}}{{- $_ := set $item "params" $c.params -}}{{- end -}}
{{- $out = append $out $item -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if not $out -}}
{{- fail (printf "policy.suites.%s.checks: every check is disabled; enable at least one (compute, collective, golden or memory)" $suite) -}}
{{- end -}}
{{- toYaml $out -}}
{{- end -}}

{{/* The enabled accelerator resources, comma-separated. */}}
{{- define "sdcguard.enabledAccelerators" -}}
{{- $out := list -}}
{{- range $name, $on := .Values.policy.accelerators -}}
{{- if $on -}}{{- $out = append $out $name -}}{{- end -}}
{{- end -}}
{{- $out | sortAlpha | join ", " -}}
{{- end -}}
