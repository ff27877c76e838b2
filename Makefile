# edgeflow — the front door. CI (.ci/run) calls `make test`, exactly as a person does.

GO          ?= go
CACHE       ?= $(HOME)/.cache/edgeflow
STATICCHECK_VERSION := v0.8.2
STATICCHECK := $(CACHE)/bin/staticcheck-$(STATICCHECK_VERSION)/staticcheck
HELM_VERSION := v3.22.0
HELM        := $(CACHE)/bin/helm-$(HELM_VERSION)/helm
# the Kubernetes version helm template renders for (a helm built with go install assumes v1.20)
KUBE_VERSION := v1.37.2
FUZZTIME    ?= 20s

.PHONY: all build demo test lint k8s helm manifests unit e2e-istio e2e-ui e2e-reproduce reproduce reproduce-report fuzz bench bench-solver bench-push bench-watch clean

all: build

## build: the edgeflow binary in bin/ (stamped with the commit it is built from: edgeflow version)
build:
	$(GO) build -buildvcs=auto -o bin/edgeflow ./cmd/edgeflow

## demo: the main job on the embedded default (Bookinfo on 4 emulated nodes, every policy)
demo:
	$(GO) run ./cmd/edgeflow demo

## test: formatting, vet, staticcheck, go.mod tidy, then every test with the race detector
## (the live tests need the Kubernetes control plane binaries and helm: built once, cached; see k8s, helm)
test: lint k8s helm unit e2e-istio e2e-ui e2e-reproduce

## e2e-istio: Istio's own pilot (in-process, the separate module e2e/istio) decides whether the
## EnvoyFilters edgeflow manages work (cold build ~8 min on 2 cores, cached by Go afterwards)
e2e-istio:
	cd e2e/istio && $(GO) vet ./... && $(GO) test -count=1 ./...

## e2e-ui: the web view in headless Chromium (Debian's chromium, driven by chromedp from the separate
## module e2e/ui): the demo topology's nodes and edges shown, a changed file shown within 2 s;
## writes the screenshot docs/webview.png
e2e-ui:
	cd e2e/ui && $(GO) vet ./... && $(GO) test -count=1 ./...

## e2e-reproduce: the paper's experiment's quick preset as a test (make reproduce QUICK=1, report
## in a temporary folder; ~6 min): asserts its qualitative claims on scenario B
e2e-reproduce:
	mkdir -p bin
	cd e2e/reproduce && $(GO) vet ./... && $(GO) test -c -o $(CURDIR)/bin/reproduce.test .
	REPRODUCE_PRESET=quick bin/reproduce.test -test.run '^(TestWriteReport|TestOverrideReplicas|TestReproduce)$$' -test.v -test.count=1 -test.timeout 20m

## reproduce: the paper's experiment on the live loop, real delay, real control plane (root; see
## e2e/reproduce): the full grid writes docs/reproduction.md, .json and the CDF PNGs; QUICK=1
## runs one app, scenario B, 200 req/s, 5 runs (report in bin/reproduction/)
QUICK ?=
reproduce: k8s
	mkdir -p bin
	cd e2e/reproduce && $(GO) test -c -o $(CURDIR)/bin/reproduce.test .
	REPRODUCE_PRESET=$(if $(QUICK),quick,full) REPRODUCE_OUT=$(if $(QUICK),$(CURDIR)/bin/reproduction,$(CURDIR)/docs) \
	  REPRODUCE_RAW=$(CURDIR)/bin/reproduction$(if $(QUICK),-quick).gob \
	  bin/reproduce.test -test.run '^TestReproduce$$' -test.v -test.count=1 -test.timeout 0

## reproduce-report: write the report of the last make reproduce again (into docs/, or
## bin/reproduction/ with QUICK=1) from everything it measured (bin/reproduction.gob), no rerun
reproduce-report:
	cd e2e/reproduce && $(GO) test -c -o $(CURDIR)/bin/reproduce.test .
	REPRODUCE_RAW=$(CURDIR)/bin/reproduction$(if $(QUICK),-quick).gob REPRODUCE_OUT=$(if $(QUICK),$(CURDIR)/bin/reproduction,$(CURDIR)/docs) \
	  bin/reproduce.test -test.run '^TestRenderReport$$' -test.v -test.count=1

## k8s: build kube-apiserver, kube-scheduler and kube-controller-manager from the Go module proxy
## into $(CACHE)/k8s-VERSION (cold: ~14 min on 2 cores; cached: instant)
k8s:
	EDGEFLOW_CACHE=$(CACHE) e2e/k8s/build.sh

## helm: build Helm $(HELM_VERSION) from the Go module proxy into $(CACHE)/bin (cold ~5 min on 2 cores;
## cached: instant); e2e/install renders the chart with it
helm: $(HELM)

$(HELM):
	GOBIN=$(dir $(HELM)) $(GO) install helm.sh/helm/v3/cmd/helm@$(HELM_VERSION)

## manifests: install/manifests/edgeflow.yaml, the chart rendered with its default values
## (e2e/install's TestManifestsUpToDate fails when it is stale)
manifests: $(HELM)
	$(HELM) template edgeflow install/helm/edgeflow --namespace edgeflow --kube-version $(KUBE_VERSION) > install/manifests/edgeflow.yaml

# Tests that measure timing or allocations skip under the race detector (it slows them ~10x);
# they run again without it, so every test runs once.
NORACE_TESTS := TestInjectedLatency|TestPlaceLargeInstance|TestPlaceBudgetLargeInstance|TestNoAllocs|TestWatchScale|TestWatchAtScale

# -timeout: e2e/rebalance runs eleven tests on a real control plane (~5 min on a busy machine).
# The e2e packages and the demo (its latencies are timed) run one at a time (-p 1): the testbed's userspace delay, Prometheus scrapes and
# the control plane's timings hold their tolerances only when another package's race-detector
# run is not competing for the 2 cores (the testbed's ±3 ms check failed once that way).
unit:
	$(GO) test -race -count=1 -timeout 30m $$($(GO) list ./... | grep -v -e '/e2e/' -e '/internal/demo')
	$(GO) test -race -count=1 -timeout 30m -p 1 ./e2e/... ./internal/demo/...
	$(GO) test -count=1 -p 1 -run '^($(NORACE_TESTS))$$' ./internal/demo ./optimizer ./optimizer/mcf ./watcher/kube ./e2e/live

lint: $(STATICCHECK)
	@fmt=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$fmt" ]; then echo "gofmt would change:"; echo "$$fmt"; exit 1; fi
	$(GO) vet ./...
	$(STATICCHECK) ./...
	@$(GO) mod tidy -diff || { echo "go.mod/go.sum are not tidy: run go mod tidy"; exit 1; }

$(STATICCHECK):
	GOBIN=$(dir $(STATICCHECK)) $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)

## fuzz: a short run of every fuzzer (FUZZTIME each)
fuzz:
	@for pkg in $$($(GO) list ./...); do \
	  for f in $$($(GO) test -list '^Fuzz' $$pkg | grep '^Fuzz'); do \
	    echo "== $$pkg $$f"; $(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZTIME) $$pkg || exit 1; \
	  done; \
	done

## bench: every benchmark, 5 runs each (compare runs with benchstat)
bench:
	$(GO) test -run '^$$' -bench . -benchmem -count 5 ./...

## bench-solver: edgeflow's network simplex against LEMON 1.3.1's, interleaved on the same
## instances (median ms per n and the ratio), then the peak memory at n = 2000
BENCH_SOLVER_FLAGS ?=
bench-solver:
	@test -f /usr/include/lemon/network_simplex.h && command -v g++ >/dev/null || \
	  { apt-get update && apt-get install -y --no-install-recommends liblemon-dev g++; }
	$(GO) build -o bin/benchsolver ./optimizer/mcf/internal/benchsolver
	bin/benchsolver $(BENCH_SOLVER_FLAGS)
	bin/benchsolver -mem -sizes 2000 -modes rand

## bench-watch: the watcher at cluster scale — client-go's own informers, indexers and handlers fed
## by a fake API server holding 100,000 pods, 5,000 nodes, 2,000 services in 100 namespaces and 50
## zones; one line per scenario (pod-ready, node-heartbeat, churn). make test runs it at 10,000
## pods with generous bounds (TestWatchScale)
BENCH_WATCH_FLAGS ?= -watch.pods=100000 -watch.nodes=5000 -watch.services=2000 -watch.namespaces=100 -watch.zones=50 \
	-watch.ready-samples=200 -watch.heartbeat=30s -watch.churn=60s -watch.check=false
bench-watch:
	@mkdir -p $(CACHE)
	@$(GO) test -count=1 -run '^TestWatchScale$$' -timeout 60m -v ./watcher/kube -args $(BENCH_WATCH_FLAGS) > $(CACHE)/bench-watch.log 2>&1; \
	  status=$$?; grep -E '^watch: ' $(CACHE)/bench-watch.log; \
	  if [ $$status -ne 0 ]; then tail -20 $(CACHE)/bench-watch.log; fi; exit $$status

## bench-push: how long until every sidecar follows a change — the real `edgeflow serve` against a
## bare go-control-plane server (own process, same resources), N raw ADS clients each, interleaved
## rounds of file rename + SIGHUP; median per N, ratio, per-stream p50/p99, RSS per stream
## (e2e/pushbench; e.g. BENCH_PUSH_FLAGS='-sizes 1000 -rounds 3' or '-profile DIR')
BENCH_PUSH_FLAGS ?=
bench-push:
	$(GO) build -o bin/edgeflow ./cmd/edgeflow
	$(GO) build -o bin/pushbench ./e2e/pushbench
	$(GO) build -o bin/pushbench-bare ./e2e/pushbench/bare
	bin/pushbench -edgeflow bin/edgeflow -bare bin/pushbench-bare $(BENCH_PUSH_FLAGS)

clean:
	rm -rf bin
