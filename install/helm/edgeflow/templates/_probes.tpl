{{/* The probed nodes as a JSON list of {name, address}: latencyProbes.nodes, else every Node of
the cluster at install/upgrade (Helm's lookup; none under `helm template`). */}}
{{- define "edgeflow.probeNodes" -}}
{{- $out := list -}}
{{- if .Values.latencyProbes.nodes -}}
{{- range .Values.latencyProbes.nodes -}}
{{- if or (not .name) (not .address) -}}
{{- fail (printf "latencyProbes.nodes: every entry needs a name and an address, not %v" .) -}}
{{- end -}}
{{- $out = append $out (dict "name" .name "address" .address) -}}
{{- end -}}
{{- else -}}
{{- $nodes := lookup "v1" "Node" "" "" -}}
{{- range ($nodes.items | default list) -}}
{{- $node := . -}}
{{- range .status.addresses -}}
{{- if eq .type $.Values.latencyProbes.addressType -}}
{{- $out = append $out (dict "name" $node.metadata.name "address" .address) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- toJson $out -}}
{{- end -}}

{{/* host:port of the exporter on a node's address (IPv6 in brackets). */}}
{{- define "edgeflow.exporterAddress" -}}
{{- if contains ":" .address -}}[{{ .address }}]:{{ .port }}{{- else -}}{{ .address }}:{{ .port }}{{- end -}}
{{- end -}}
