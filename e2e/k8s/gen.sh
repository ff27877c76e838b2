#!/usr/bin/env bash
# Regenerate go.mod for the throwaway build module that builds the real Kubernetes control plane
# (kube-apiserver, kube-scheduler, kube-controller-manager) and etcd from the Go module proxy.
# k8s.io/kubernetes replaces its 33 staging modules with ./staging paths; a module that requires
# it must replace each of them with the published v0.X.Y version.
set -euo pipefail
K8S=${K8S:-v1.37.2}
STAGING=v0.${K8S#v1.}
cd "$(dirname "$0")"
rm -f go.mod go.sum
go mod init github.com/edgeflow/edgeflow/e2e/k8s >/dev/null 2>&1
GOMOD=$(go mod download -json "k8s.io/kubernetes@$K8S" | sed -n 's/^\s*"GoMod": "\(.*\)",\?$/\1/p')
args=()
for m in $(awk '$2=="=>" && $3 ~ /^\.\/staging\/src\// {print $1}' "$GOMOD"); do
  args+=("-replace=$m=$m@$STAGING")
done
go mod edit "${args[@]}"
go mod edit -go=1.26.0
go get -tool "k8s.io/kubernetes/cmd/kube-apiserver@$K8S" "k8s.io/kubernetes/cmd/kube-scheduler@$K8S" "k8s.io/kubernetes/cmd/kube-controller-manager@$K8S"
