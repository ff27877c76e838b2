{{/* The URL of edgeflow's HTTP service discovery of the latency probes (the metrics Service). */}}
{{- define "edgeflow.probesSDURL" -}}
http://{{ include "edgeflow.fullname" . }}-metrics.{{ .Release.Namespace }}.svc.{{ .Values.clusterDomain }}:{{ .Values.metrics.port }}/sd/probes
{{- end -}}

{{/* latencyProbes.granularity, validated: node (every ordered node pair probed) or zone (one
representative node per zone; edgeflow runs with --latency-granularity=zone). */}}
{{- define "edgeflow.probeGranularity" -}}
{{- $g := .Values.latencyProbes.granularity | default "node" -}}
{{- if not (has $g (list "node" "zone")) -}}
{{- fail (printf "latencyProbes.granularity: want node or zone, not %q" $g) -}}
{{- end -}}
{{- $g -}}
{{- end -}}

{{/* The probe exporter's container securityContext, by latencyProbes.icmpSocket: unprivileged
(ICMP datagram sockets: no capability; user and group from the pod) or raw (raw sockets: root
with NET_RAW only). */}}
{{- define "edgeflow.probeContainerSecurity" -}}
{{- if eq .Values.latencyProbes.icmpSocket "unprivileged" -}}
runAsNonRoot: true
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
privileged: false
capabilities: {drop: [ALL]}
{{- else -}}
# raw ICMP sockets: root with CAP_NET_RAW only
runAsUser: 0
runAsNonRoot: false
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
privileged: false
capabilities: {drop: [ALL], add: [NET_RAW]}
{{- end -}}
{{- end -}}
