{{/* Names, labels and small helpers shared by every template. */}}

{{- define "laneway.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The release's base name: "<release>-laneway", or just "<release>" when it already says laneway. */}}
{{- define "laneway.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "laneway.gateway.fullname" -}}
{{- printf "%s-gateway" (include "laneway.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "laneway.operator.fullname" -}}
{{- printf "%s-operator" (include "laneway.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "laneway.redis.fullname" -}}
{{- printf "%s-redis" (include "laneway.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "laneway.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels every object carries. Call with (dict "root" $ "component" "gateway"). */}}
{{- define "laneway.labels" -}}
helm.sh/chart: {{ include "laneway.chart" .root }}
{{ include "laneway.selectorLabels" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/part-of: laneway
{{- with .root.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* The labels Deployments select their pods by; never change across upgrades. */}}
{{- define "laneway.selectorLabels" -}}
app.kubernetes.io/name: {{ include "laneway.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "laneway.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{- define "laneway.gateway.serviceAccountName" -}}
{{- if .Values.gateway.serviceAccount.create }}
{{- default (include "laneway.gateway.fullname" .) .Values.gateway.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.gateway.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "laneway.operator.serviceAccountName" -}}
{{- if .Values.operator.serviceAccount.create }}
{{- default (include "laneway.operator.fullname" .) .Values.operator.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.operator.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* Redis: the URL the gateway uses, and the Secret holding its password (empty: no password). */}}
{{- define "laneway.redis.url" -}}
{{- if .Values.redis.enabled }}
{{- printf "redis://%s:%d/0" (include "laneway.redis.fullname" .) (int .Values.redis.port) }}
{{- else }}
{{- .Values.redis.url }}
{{- end }}
{{- end }}

{{- define "laneway.redis.passwordSecretName" -}}
{{- if .Values.redis.auth.existingSecret }}
{{- .Values.redis.auth.existingSecret }}
{{- else if or .Values.redis.enabled .Values.redis.auth.password }}
{{- include "laneway.redis.fullname" . }}
{{- end }}
{{- end }}

{{- define "laneway.redis.passwordSecretKey" -}}
{{- if .Values.redis.auth.existingSecret }}
{{- .Values.redis.auth.existingSecretPasswordKey }}
{{- else }}
{{- "password" }}
{{- end }}
{{- end }}

{{/*
The rules of the ClusterRole in a copy of manifests/rbac/<component>.yaml (files/rbac-*.yaml,
kept identical by scripts/gen-manifests.sh), as a YAML list. Those manifests are the one
written record of what each component calls; the chart grants the same, in its namespace.
*/}}
{{- define "laneway.documentedRules" -}}
{{- $path := printf "files/rbac-%s.yaml" .component }}
{{- $rules := list }}
{{- range $document := regexSplit "(?m)^---\\s*$" (.root.Files.Get $path) -1 }}
{{- $object := fromYaml $document }}
{{- if eq (get $object "kind") "ClusterRole" }}
{{- $rules = $object.rules }}
{{- end }}
{{- end }}
{{- if not $rules }}
{{- fail (printf "%s holds no ClusterRole rules: run scripts/gen-manifests.sh" $path) }}
{{- end }}
{{- toYaml $rules }}
{{- end }}

{{/* API-key auth: "true" when the chart generates the key (auth on, no Secret of tenants given). */}}
{{- define "laneway.gateway.generatedKey" -}}
{{- if and .Values.gateway.auth.enabled (not .Values.gateway.tenants.existingSecret) }}true{{ end }}
{{- end }}

{{- define "laneway.gateway.apiKeySecretName" -}}
{{- printf "%s-api-key" (include "laneway.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The ports of the gateway's KV-event SUB sockets (gateway.config.picking.prefix.kvEvents), as
JSON {"ports": [{"name", "port", "pool"}]}: named by position, since a port name has at most
15 characters and a pool name up to 253.
*/}}
{{- define "laneway.gateway.kvEventsPorts" -}}
{{- $ports := list }}
{{- $prefix := default dict (default dict .Values.gateway.config.picking).prefix }}
{{- range $index, $source := default list $prefix.kvEvents }}
{{- $port := regexFind "[0-9]+$" $source.bind | int }}
{{- $ports = append $ports (dict "name" (printf "kv-events-%d" $index) "port" $port "pool" $source.pool) }}
{{- end }}
{{- toJson (dict "ports" $ports) }}
{{- end }}

{{/*
The file limits the gateway runs with. With the bundled Redis (200mb by default, and the
only store of every tenant's files) the defaults are sized to fit it: a tenant's quota a
third of it, a file half a quota. Otherwise the gateway's own defaults.
*/}}
{{- define "laneway.gateway.maxFileBytes" -}}
{{- $batch := .Values.gateway.batch }}
{{- if not (kindIs "invalid" $batch.maxFileBytes) }}{{ $batch.maxFileBytes | int64 }}
{{- else if .Values.redis.enabled }}33554432
{{- else }}104857600
{{- end }}
{{- end }}

{{- define "laneway.gateway.tenantFileBytes" -}}
{{- $batch := .Values.gateway.batch }}
{{- if not (kindIs "invalid" $batch.tenantFileBytes) }}{{ $batch.tenantFileBytes | int64 }}
{{- else if .Values.redis.enabled }}67108864
{{- else }}1073741824
{{- end }}
{{- end }}

{{/*
The name operator/upstream.py's model_slug gives a model: its upstream InferencePool's
name and its pods' label (models.laneway.io/<slug>). Kept equal by tests/test_chart_picker.py.
*/}}
{{- define "laneway.modelSlug" -}}
{{- if and (le (len .) 63) (regexMatch "^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$" .) }}
{{- . }}
{{- else }}
{{- $base := regexReplaceAll "[^a-z0-9]+" (lower .) "-" | trimAll "-" | trunc 54 | trimSuffix "-" }}
{{- $digest := sha256sum . | trunc 8 }}
{{- if $base }}{{ printf "%s-%s" $base $digest }}{{ else }}{{ printf "model-%s" $digest }}{{ end }}
{{- end }}
{{- end }}

{{- define "laneway.picker.fullname" -}}
{{- printf "%s-picker" (include "laneway.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
What the gateway and the picker both take from gateway.auth and gateway.tenants: the
tenants file (--tenants, mounted by "laneway.tenantsVolume") and the default caps. Call
with the root context; a YAML list of args, empty where nothing applies.
*/}}
{{- define "laneway.tenantsArgs" -}}
{{- if .Values.gateway.auth.enabled }}
- --tenants
- /etc/laneway/tenants
{{- end }}
{{- with .Values.gateway.tenants.maxConcurrentRequests }}
- --tenant-max-concurrent
- {{ . | int64 | quote }}
{{- end }}
{{- with .Values.gateway.tenants.maxQueuedRequests }}
- --tenant-max-queued
- {{ . | int64 | quote }}
{{- end }}
{{- with .Values.gateway.tenants.maxConcurrentPromptTokens }}
- --tenant-max-concurrent-prompt-tokens
- {{ . | int64 | quote }}
{{- end }}
{{- end }}

{{/* The volume behind /etc/laneway/tenants: the given Secret, or the generated key's. */}}
{{- define "laneway.tenantsVolume" -}}
{{- if .Values.gateway.tenants.existingSecret }}
- name: tenants
  secret:
    secretName: {{ .Values.gateway.tenants.existingSecret }}
{{- else if .Values.gateway.auth.enabled }}
- name: tenants
  secret:
    secretName: {{ include "laneway.gateway.apiKeySecretName" . }}
    # Only the tenants file: --tenants reads every file of the directory.
    items:
      - key: tenants.yaml
        path: tenants.yaml
{{- end }}
{{- end }}

{{/*
The shared state both read (--redis-url's default and its password): the bundled Redis or
redis.url, as EnvVars; empty without Redis.
*/}}
{{- define "laneway.redisEnv" -}}
{{- $secret := include "laneway.redis.passwordSecretName" . }}
{{- with include "laneway.redis.url" . }}
- name: LANEWAY_REDIS_URL
  value: {{ . | quote }}
{{- end }}
{{- if $secret }}
- name: LANEWAY_REDIS_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ $secret }}
      key: {{ include "laneway.redis.passwordSecretKey" . }}
{{- end }}
{{- end }}
