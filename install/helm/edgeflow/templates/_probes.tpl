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
{{- $nodes := (lookup "v1" "Node" "" "").items | default list -}}
{{- if eq (include "edgeflow.probeGranularity" .) "zone" -}}
{{- /* One representative per zone: the nodes labelled as such, else the first node by name of
each region/zone, in the API server's order (by name); a node without a zone label is a zone of
its own. */ -}}
{{- $label := .Values.latencyProbes.representativeLabel -}}
{{- $labelled := list -}}
{{- range $nodes -}}
{{- if eq (get (.metadata.labels | default dict) $label) "true" -}}
{{- $labelled = append $labelled . -}}
{{- end -}}
{{- end -}}
{{- if $labelled -}}
{{- $nodes = $labelled -}}
{{- else -}}
{{- $seen := dict -}}
{{- $first := list -}}
{{- range $nodes -}}
{{- $labels := .metadata.labels | default dict -}}
{{- $zone := .metadata.name -}}
{{- with get $labels "topology.kubernetes.io/zone" -}}
{{- $zone = printf "%s/%s" (get $labels "topology.kubernetes.io/region") . -}}
{{- end -}}
{{- if not (hasKey $seen $zone) -}}
{{- $_ := set $seen $zone true -}}
{{- $first = append $first . -}}
{{- end -}}
{{- end -}}
{{- $nodes = $first -}}
{{- end -}}
{{- end -}}
{{- range $nodes -}}
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

{{/* latencyProbes.granularity, validated: node (every ordered node pair probed) or zone (one
representative node per zone; edgeflow runs with --latency-granularity=zone). */}}
{{- define "edgeflow.probeGranularity" -}}
{{- $g := .Values.latencyProbes.granularity | default "node" -}}
{{- if not (has $g (list "node" "zone")) -}}
{{- fail (printf "latencyProbes.granularity: want node or zone, not %q" $g) -}}
{{- end -}}
{{- $g -}}
{{- end -}}
