{{/* The name of every object: the release name when it holds "edgeflow", else RELEASE-edgeflow. */}}
{{- define "edgeflow.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* Selector labels of edgeflow's pods. */}}
{{- define "edgeflow.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* Labels of every object but the webhook registration (edgeflow uninstall keys on its own
label there). */}}
{{- define "edgeflow.labels" -}}
{{ include "edgeflow.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
app.kubernetes.io/part-of: edgeflow
{{- end -}}

{{/* The rebalancer acts (evicts, gates, elects a leader). */}}
{{- define "edgeflow.acts" -}}
{{- if eq .Values.rebalancer.mode "act" }}true{{ end -}}
{{- end -}}

{{/* The rebalancer runs (dry-run or act). */}}
{{- define "edgeflow.rebalances" -}}
{{- if has .Values.rebalancer.mode (list "dry-run" "act") }}true{{ end -}}
{{- end -}}

{{/* xDS has clients on the pod network (the sidecars in envoyfilter mode, declared proxyless
clients, or TLS asked for): it listens on 0.0.0.0 behind its Service; otherwise on loopback only. */}}
{{- define "edgeflow.xdsServed" -}}
{{- if or (eq .Values.istio.mode "envoyfilter") .Values.xds.proxylessClients (eq (toString .Values.xds.tls.enabled) "true") }}true{{ end -}}
{{- end -}}

{{/* xDS is served over TLS (xds.tls.enabled true, or auto where it has clients): the Secret is needed. */}}
{{- define "edgeflow.xdsTLS" -}}
{{- $tls := toString .Values.xds.tls.enabled -}}
{{- if or (eq $tls "true") (and (eq $tls "auto") (include "edgeflow.xdsServed" .)) }}true{{ end -}}
{{- end -}}

{{/* edgeflow's SPIFFE id, which its xDS certificate carries (the cert-manager Certificate's URI
SAN) and the sidecars require of it in envoyfilter mode (--istio-xds-server-san). */}}
{{- define "edgeflow.spiffeID" -}}
spiffe://{{ .Values.xds.tls.trustDomain }}/ns/{{ .Release.Namespace }}/sa/{{ .Values.serviceAccount.name }}
{{- end -}}

{{/* The watched namespaces the grants are Roles in: watch.namespaces, none for ["*"] (every namespace). */}}
{{- define "edgeflow.watchedNamespaces" -}}
{{- without .Values.watch.namespaces "*" | toJson -}}
{{- end -}}

{{/* Bad values fail the render, naming the value. */}}
{{- define "edgeflow.validate" -}}
{{- if not (has .Values.istio.mode (list "off" "destinationrule" "envoyfilter")) -}}
{{- fail (printf "istio.mode %q: want off, destinationrule or envoyfilter" .Values.istio.mode) -}}
{{- end -}}
{{- if not (has .Values.rebalancer.mode (list "off" "dry-run" "act")) -}}
{{- fail (printf "rebalancer.mode %q: want off, dry-run or act" .Values.rebalancer.mode) -}}
{{- end -}}
{{- if not (has .Values.webhook.certificate (list "cert-manager" "secret")) -}}
{{- fail (printf "webhook.certificate %q: want cert-manager or secret (edgeflow does not issue its own webhook certificate yet)" .Values.webhook.certificate) -}}
{{- end -}}
{{- if and .Values.istio.labelNodes (ne .Values.istio.mode "destinationrule") -}}
{{- fail "istio.labelNodes needs istio.mode=destinationrule" -}}
{{- end -}}
{{- if and (eq .Values.rebalancer.mode "act") (eq .Values.webhook.certificate "secret") (not .Values.webhook.caBundle) -}}
{{- fail "webhook.certificate=secret needs webhook.caBundle (base64 PEM of the CA that signed webhook.secretName)" -}}
{{- end -}}
{{- if and (not .Values.prometheus.url) (not .Values.callGraph) -}}
{{- fail "without prometheus.url the call graph must be given in callGraph" -}}
{{- end -}}
{{- if not (has (toString .Values.xds.tls.enabled) (list "auto" "true" "false")) -}}
{{- fail (printf "xds.tls.enabled %q: want auto, true or false" (toString .Values.xds.tls.enabled)) -}}
{{- end -}}
{{- if and .Values.xds.tls.certManager.enabled (not .Values.xds.tls.certManager.issuerRef.name) -}}
{{- fail "xds.tls.certManager.enabled needs xds.tls.certManager.issuerRef.name" -}}
{{- end -}}
{{- if and (has "*" .Values.watch.namespaces) (gt (len .Values.watch.namespaces) 1) -}}
{{- fail (printf "watch.namespaces %v: \"*\" is every namespace, so it goes alone" .Values.watch.namespaces) -}}
{{- end -}}
{{- if and (ne .Values.istio.mode "off") (empty .Values.watch.namespaces) -}}
{{- fail (printf "istio.mode=%s needs watch.namespaces: the namespaces whose Services edgeflow manages and writes Istio's objects for (anyone who can label a Service in a watched namespace has edgeflow write for it); [\"*\"] for every namespace" .Values.istio.mode) -}}
{{- end -}}
{{- if and (ne .Values.istio.mode "off") (eq .Values.istio.leaseName .Values.rebalancer.leaseName) -}}
{{- fail "istio.leaseName must differ from rebalancer.leaseName: the Istio writer and the rebalancer elect on Leases of their own" -}}
{{- end -}}
{{- if not (has .Values.antiAffinity (list "required" "preferred")) -}}
{{- fail (printf "antiAffinity %q: want required or preferred" .Values.antiAffinity) -}}
{{- end -}}
{{- end -}}
