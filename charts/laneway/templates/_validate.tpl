{{/*
Rules across values that values.schema.json cannot express. Each message names the values
to change, so `helm install` fails at once instead of the gateway crash-looping later.
*/}}
{{- define "laneway.validate" -}}
{{- $gw := .Values.gateway }}
{{- $auto := $gw.autoscaling }}
{{- if and $auto.enabled (gt (int $auto.minReplicas) (int $auto.maxReplicas)) }}
{{- fail (printf "gateway.autoscaling.minReplicas (%d) must not exceed gateway.autoscaling.maxReplicas (%d)" (int $auto.minReplicas) (int $auto.maxReplicas)) }}
{{- end }}
{{- $drain := int (default 30000 $gw.config.drainTimeoutMillis) }}
{{- $preStop := int $gw.preStopSleepSeconds }}
{{- if ge (add $drain (mul $preStop 1000)) (mul (int $gw.terminationGracePeriodSeconds) 1000) }}
{{- fail (printf "gateway.preStopSleepSeconds (%d s) plus gateway.config.drainTimeoutMillis (%d) must be below gateway.terminationGracePeriodSeconds (%d s), or Kubernetes kills open streams mid-drain" $preStop $drain (int $gw.terminationGracePeriodSeconds)) }}
{{- end }}
{{- $scrape := default dict $gw.config.scrape }}
{{- if and (hasKey $scrape "intervalMillis") (hasKey $scrape "staleAfterMillis") (lt (int $scrape.staleAfterMillis) (int $scrape.intervalMillis)) }}
{{- fail (printf "gateway.config.scrape.staleAfterMillis (%d) must be >= gateway.config.scrape.intervalMillis (%d)" (int $scrape.staleAfterMillis) (int $scrape.intervalMillis)) }}
{{- end }}
{{- $picking := default dict $gw.config.picking }}
{{- if and (eq (default "scored" $picking.policy) "scored") $picking.weights }}
{{- $total := 0 }}
{{- range $name, $weight := $picking.weights }}{{ $total = add $total $weight }}{{ end }}
{{- if eq (int $total) 0 }}
{{- fail "gateway.config.picking.weights: the scored policy needs at least one scorer with a weight above 0" }}
{{- end }}
{{- end }}
{{- if and $gw.tenants.existingSecret (not $gw.auth.enabled) }}
{{- fail "gateway.tenants.existingSecret holds API keys, but gateway.auth.enabled is false: turn auth on, or drop the Secret" }}
{{- end }}
{{- if and $gw.metricsPort (eq (int $gw.metricsPort) (int $gw.port)) }}
{{- fail (printf "gateway.metricsPort (%d) must differ from gateway.port, or be null to serve /metrics on the API port" (int $gw.metricsPort)) }}
{{- end }}
{{- $kvPorts := dict }}
{{- $kvPools := dict }}
{{- range (include "laneway.gateway.kvEventsPorts" . | fromJson).ports }}
{{- if or (lt (int .port) 1024) (gt (int .port) 65535) }}
{{- fail (printf "gateway.config.picking.prefix.kvEvents: pool %s binds port %d; use 1024-65535 (the gateway is not root)" .pool (int .port)) }}
{{- end }}
{{- if or (eq (int .port) (int $gw.port)) (and $gw.metricsPort (eq (int .port) (int $gw.metricsPort))) }}
{{- fail (printf "gateway.config.picking.prefix.kvEvents: pool %s binds port %d, which gateway.port or gateway.metricsPort already uses" .pool (int .port)) }}
{{- end }}
{{- if hasKey $kvPorts (toString .port) }}
{{- fail (printf "gateway.config.picking.prefix.kvEvents: port %d is bound twice; each pool needs a port of its own" (int .port)) }}
{{- end }}
{{- if hasKey $kvPools .pool }}
{{- fail (printf "gateway.config.picking.prefix.kvEvents: pool %s is listed twice" .pool) }}
{{- end }}
{{- $_ := set $kvPorts (toString .port) true }}
{{- $_ := set $kvPools .pool true }}
{{- end }}
{{- if and .Values.networkPolicy.engineNamespaces (not .Values.watchAllNamespaces) }}
{{- fail "networkPolicy.engineNamespaces guards engines in other namespaces, which only a gateway with watchAllNamespaces serves: set watchAllNamespaces, or empty the list" }}
{{- end }}
{{- if not (or .Values.redis.enabled .Values.redis.url) }}
{{- if and (not $auto.enabled) (gt (int $gw.replicaCount) 1) }}
{{- fail (printf "gateway.replicaCount (%d) needs shared state: set redis.enabled=true (the bundled Redis) or redis.url, or keep one replica; apart, each replica keeps its own endpoint load and tenant limits, and the Files and Batches API answers 501" (int $gw.replicaCount)) }}
{{- end }}
{{- if and $auto.enabled (gt (int $auto.maxReplicas) 1) }}
{{- fail (printf "gateway.autoscaling.maxReplicas (%d) needs shared state: set redis.enabled=true (the bundled Redis) or redis.url, or turn gateway.autoscaling off" (int $auto.maxReplicas)) }}
{{- end }}
{{- if and .Values.picker.enabled (gt (int .Values.picker.replicaCount) 1) }}
{{- fail (printf "picker.replicaCount (%d) needs shared state: set redis.enabled=true (the bundled Redis) or redis.url, or keep one replica; apart, each replica keeps its own endpoint load and tenant limits" (int .Values.picker.replicaCount)) }}
{{- end }}
{{- end }}
{{- if and .Values.picker.enabled .Values.picker.watchObjectives .Values.picker.objectives }}
{{- fail "picker.watchObjectives takes the objectives from the cluster, in place of picker.objectives: empty picker.objectives, or turn watchObjectives off" }}
{{- end }}
{{- if and .Values.picker.enabled .Values.picker.trustFairnessId (not $gw.auth.enabled) }}
{{- fail "picker.trustFairnessId lets the fairness id name a tenant of the tenants file, which gateway.auth.enabled=false turns off: turn auth on, or trustFairnessId off" }}
{{- end }}
{{- range $cap := list "maxConcurrentRequests" "maxQueuedRequests" "maxConcurrentPromptTokens" }}
{{- if and (index $gw.tenants $cap) (not $gw.auth.enabled) }}
{{- fail (printf "gateway.tenants.%s caps each tenant of the tenants file, which gateway.auth.enabled=false turns off (every client anonymous): turn auth on, or leave the cap out" $cap) }}
{{- end }}
{{- end }}
{{- $maxFile := include "laneway.gateway.maxFileBytes" . | int64 }}
{{- $quota := include "laneway.gateway.tenantFileBytes" . | int64 }}
{{- if gt $maxFile $quota }}
{{- fail (printf "gateway.batch.maxFileBytes (%d) exceeds gateway.batch.tenantFileBytes (%d), so a file that large could never be kept: lower maxFileBytes or raise tenantFileBytes" $maxFile $quota) }}
{{- end }}
{{- if and .Values.redis.enabled .Values.redis.url }}
{{- fail "set either redis.enabled (the bundled Redis) or redis.url (your own), not both" }}
{{- end }}
{{- if and .Values.redis.auth.existingSecret .Values.redis.auth.password }}
{{- fail "set either redis.auth.existingSecret or redis.auth.password, not both" }}
{{- end }}
{{- if .Values.examplePools.enabled }}
{{- $names := dict }}
{{- range .Values.examplePools.pools }}
{{- if hasKey $names .name }}
{{- fail (printf "examplePools.pools: the name %q is used twice" .name) }}
{{- end }}
{{- $_ := set $names .name true }}
{{- end }}
{{- end }}
{{- end }}
