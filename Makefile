# edgeflow — the front door. CI (.ci/run) calls `make test`, exactly as a person does.

GO          ?= go
SHELL       := /bin/bash
.SHELLFLAGS := -o pipefail -c
CACHE       ?= $(HOME)/.cache/edgeflow
STATICCHECK_VERSION := v0.8.2
STATICCHECK := $(CACHE)/bin/staticcheck-$(STATICCHECK_VERSION)/staticcheck
HELM_VERSION := v3.22.0
HELM        := $(CACHE)/bin/helm-$(HELM_VERSION)/helm
# the Kubernetes version helm template renders for (a helm built with go install assumes v1.20)
KUBE_VERSION := v1.37.2
# what that Kubernetes serves that helm template cannot know without a cluster (it knows API group
# versions, not kinds): the chart's admission policy is rendered where this is served
KUBE_API_VERSIONS := admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy
FUZZTIME    ?= 20s

.PHONY: all build image demo docs test test-lint test-unit test-e2e test-quiet test-istio test-ui test-smoke test-image prebuild-unit prebuild-e2e prebuild-istio prebuild-smoke lint k8s helm manifests e2e-istio e2e-ui e2e-reproduce reproduce reproduce-report reproduce-check fuzz bench bench-solver bench-push bench-watch clean

all: build

## build: the edgeflow binary in bin/ (stamped with the commit it is built from: edgeflow version)
build:
	$(GO) build -buildvcs=auto -o bin/edgeflow ./cmd/edgeflow

# the image's name (the chart's default image.repository and appVersion), its architecture, and
# an optional PEM bundle installed as /etc/ssl/certs/ca-certificates.crt
IMAGE       ?= ghcr.io/edgeflow/edgeflow:$(shell sed -n 's/^appVersion: "\(.*\)"/\1/p' install/helm/edgeflow/Chart.yaml)
IMAGE_ARCH  ?= $(shell $(GO) env GOARCH)
IMAGE_CA_CERTS ?=
IMAGE_OUT   := bin/image

## image: edgeflow's container image with no Docker daemon (install/image, go-containerregistry): the
## static binary (CGO_ENABLED=0) as user 65532, entrypoint /edgeflow, as an OCI layout (bin/image/oci)
## and a tarball (bin/image/edgeflow.tar): crane push bin/image/edgeflow.tar $$IMAGE, or
## docker load -i bin/image/edgeflow.tar. IMAGE names it, IMAGE_ARCH=arm64 builds for arm64
image:
	@mkdir -p $(IMAGE_OUT)
	CGO_ENABLED=0 GOOS=linux GOARCH=$(IMAGE_ARCH) $(GO) build -trimpath -buildvcs=auto -ldflags='-s -w' \
	  -o $(IMAGE_OUT)/edgeflow-linux-$(IMAGE_ARCH) ./cmd/edgeflow
	cd install/image && $(GO) run . -binary $(CURDIR)/$(IMAGE_OUT)/edgeflow-linux-$(IMAGE_ARCH) -tag $(IMAGE) \
	  $(if $(IMAGE_CA_CERTS),-ca-certs $(abspath $(IMAGE_CA_CERTS))) -layout $(CURDIR)/$(IMAGE_OUT)/oci -tarball $(CURDIR)/$(IMAGE_OUT)/edgeflow.tar

## demo: the main job on the embedded default (Bookinfo on 4 emulated nodes, every policy)
demo:
	$(GO) run ./cmd/edgeflow demo

## test: lint, then every suite at once (the product's packages with -race; the e2e harnesses
## without it, running the product as a -race binary; Istio's pilot; the web view; a smoke of the
## paper's experiment; make image and the image read back), then the quiet group alone; go test -json goes to bin/test/, and the
## report (each suite's and package's wall time, the 20 slowest tests, the totals) ends the run.
## Builds of tools (staticcheck, Helm, the Kubernetes control plane, Istio's pilot) run niced
## while tests wait.
test:
	@rm -rf $(TESTOUT) && mkdir -p $(TESTOUT)
	@$(MAKE) --no-print-directory $(REPORT)
	@status=0; start=$$(date +%s); \
	  $(MAKE) --no-print-directory -k -j$(TEST_JOBS) test-lint test-unit test-e2e test-istio test-smoke test-image || status=1; \
	  $(MAKE) --no-print-directory -k test-quiet test-ui || status=1; \
	  echo "make test: $$(( $$(date +%s) - start )) s, status $$status (go test -json in $(TESTOUT)/)"; \
	  $(REPORT) -want unit,e2e,istio,smoke,smoke-pod,image,quiet-race,quiet,quiet-testbed,ui $(TESTOUT)/*.json | tee $(TESTOUT)/report.txt; exit $$status

TESTOUT     := bin/test
REPORT      := bin/testreport
# the edgeflow binary the e2e tests run as a process (testkit.Binary), built once, with -race
EDGEFLOW_RACE := $(CURDIR)/bin/edgeflow-race
TEST_JOBS   ?= 8
NICE        := nice -n 10
# the product's packages outside the quiet group: everything but e2e/ (the harnesses) and the demo
UNIT_PKGS    = $$($(GO) list ./... | grep -v -e '/e2e/' -e '/internal/demo')

# The quiet group: tests that time things or count allocations, run alone after every other
# suite, without the race detector (it slows the code they time ~10x; they skip under it).
QUIET_TESTS := TestInjectedLatency|TestClosedLoopRoutesAroundL7Penalty|TestClosedLoopLearnsCapacity|TestClosedLoopFollowsASlowdown|TestClosedLoopBreakerFallsBackToLATA|TestPlaceLargeInstance|TestPlaceBudgetLargeInstance|TestNoAllocs|TestWatchScale|TestWatchAtScale|TestIstioWriterIsLeaderElected|TestReplicaKilledMidPush|TestLeaderChangeMidMove
QUIET_PKGS  := ./internal/demo ./optimizer ./optimizer/mcf ./watcher/kube ./e2e/live ./e2e/install ./e2e/replicas ./e2e/rebalance
# Packages whose every test runs in the quiet group, with -race (the demo times its latencies).
QUIET_RACE_PKGS := ./internal/demo/...
# The quiet group's test of e2e/reproduce (a module of its own, the smoke's test binary): the
# closed loop's capacity estimates on the testbed must hold to ±10 % of the truth. Beside every
# other suite one estimate came out −11 %: the queueing bound, from the pod's measured own time,
# which late timers on a starved machine lengthen.
QUIET_TESTBED := TestClosedLoopOnTestbed|TestClosedLoopFindsL7PenaltyOnTestbed
# e2e/reproduce's test binary (prebuild-smoke) under test2json, as the smoke and the quiet group run it
REPRODUCE_TEST = EDGEFLOW_BIN=$(EDGEFLOW_RACE) $(GO) tool test2json -t -p github.com/edgeflow/edgeflow/e2e/reproduce \
	  bin/reproduce.test -test.v=test2json -test.count=1 -test.timeout 10m

$(REPORT): $(wildcard internal/testkit/testreport/*.go)
	@mkdir -p bin && $(GO) build -o $@ ./internal/testkit/testreport

$(EDGEFLOW_RACE): FORCE
	@mkdir -p bin && $(GO) build -race -buildvcs=auto -o $@ ./cmd/edgeflow

FORCE:

## test-lint: gofmt, vet, staticcheck, go.mod tidy (niced: it runs beside the tests)
test-lint: lint

## test-unit: the product's packages, with the race detector (all but the quiet group)
test-unit: k8s $(REPORT) prebuild-unit
	$(GO) test -race -count=1 -json -timeout 30m -skip '^($(QUIET_TESTS))$$' $(UNIT_PKGS) | $(REPORT) -stream unit > $(TESTOUT)/unit.json

## test-e2e: the harnesses (apiserver, testbed, install, rebalance, replicas), without -race; the
## product they run as a process is the -race binary
test-e2e: k8s helm $(EDGEFLOW_RACE) $(REPORT) prebuild-e2e
	EDGEFLOW_BIN=$(EDGEFLOW_RACE) $(GO) test -count=1 -json -timeout 30m -p 4 -parallel 8 \
	  -skip '^($(QUIET_TESTS))$$' ./e2e/... | $(REPORT) -stream e2e > $(TESTOUT)/e2e.json

## test-quiet: the timing tests, alone, after every other suite
test-quiet: k8s $(EDGEFLOW_RACE) $(REPORT) prebuild-smoke
	status=0; \
	$(GO) test -race -count=1 -json -timeout 20m -p 1 $(QUIET_RACE_PKGS) | $(REPORT) -stream quiet-race > $(TESTOUT)/quiet-race.json || status=1; \
	$(GO) test -count=1 -json -timeout 20m -p 1 -run '^($(QUIET_TESTS))$$' $(QUIET_PKGS) | $(REPORT) -stream quiet > $(TESTOUT)/quiet.json || status=1; \
	$(REPRODUCE_TEST) -test.run '^($(QUIET_TESTBED))$$' | $(REPORT) -stream quiet-testbed > $(TESTOUT)/quiet-testbed.json || status=1; \
	exit $$status

## e2e-istio: Istio's own pilot (in-process, the separate module e2e/istio) decides whether the
## EnvoyFilters edgeflow manages work (cold build ~8 min on 2 cores, niced, cached by Go afterwards)
test-istio e2e-istio: k8s $(REPORT) prebuild-istio
	cd e2e/istio && $(NICE) $(GO) test -count=1 -json -parallel 8 ./... \
	  | $(CURDIR)/$(REPORT) -stream istio > $(CURDIR)/$(TESTOUT)/istio.json

## test-ui, e2e-ui: (quiet: it runs after the parallel suites) the web view in headless Chromium (Debian's chromium, driven by chromedp from the separate
## module e2e/ui): the demo topology's nodes and edges shown, a changed file shown within 2 s;
## writes the screenshot docs/webview.png
test-ui e2e-ui: $(EDGEFLOW_RACE) $(REPORT)
	cd e2e/ui && $(GO) vet ./... && EDGEFLOW_BIN=$(EDGEFLOW_RACE) $(GO) test -count=1 -json ./... \
	  | $(CURDIR)/$(REPORT) -stream ui > $(CURDIR)/$(TESTOUT)/ui.json

## e2e-reproduce: a smoke of the paper's experiment (the live loop end to end, the report's schema,
## the plan's network cost ordered as the policies promise) and the pod's and tools' tests; its P99
## claims run in make reproduce, and the closed loop on the testbed in test-quiet (QUIET_TESTBED)
test-smoke e2e-reproduce: k8s $(EDGEFLOW_RACE) $(REPORT) prebuild-smoke
	status=0; \
	REPRODUCE_PRESET=smoke $(REPRODUCE_TEST) -test.skip '^(TestRenderReport|$(QUIET_TESTBED))$$' \
	  | $(REPORT) -stream smoke > $(TESTOUT)/smoke.json || status=1; \
	(cd e2e/reproduce && $(GO) test -race -count=1 -json ./pod ./cmd/... | $(CURDIR)/$(REPORT) -stream smoke-pod > $(CURDIR)/$(TESTOUT)/smoke-pod.json) || status=1; \
	exit $$status

## test-image: make image (niced), then install/image's test reads it back from the layout and the
## tarball, checks its config against the chart's securityContext and runs edgeflow version from its layer
test-image: $(REPORT)
	@mkdir -p $(TESTOUT)
	@$(MAKE) --no-print-directory image GO='$(NICE) $(GO)'
	cd install/image && $(GO) mod tidy -diff && $(NICE) $(GO) vet ./... && \
	  EDGEFLOW_IMAGE_LAYOUT=$(CURDIR)/$(IMAGE_OUT)/oci EDGEFLOW_IMAGE_TARBALL=$(CURDIR)/$(IMAGE_OUT)/edgeflow.tar EDGEFLOW_IMAGE_TAG=$(IMAGE) \
	  $(GO) test -count=1 -json ./... | $(CURDIR)/$(REPORT) -stream image > $(CURDIR)/$(TESTOUT)/image.json

# prebuild-*: compile a suite's tests (niced) while the Kubernetes control plane it needs builds,
# so that on a cold machine its tests start as soon as that build is done
prebuild-unit:
	$(NICE) $(GO) test -race -count=1 -run '^$$' $(UNIT_PKGS) > /dev/null
prebuild-e2e:
	$(NICE) $(GO) test -count=1 -run '^$$' ./e2e/... > /dev/null
prebuild-istio:
	cd e2e/istio && $(NICE) $(GO) vet ./... && $(NICE) $(GO) test -count=1 -run '^$$' ./... > /dev/null
prebuild-smoke:
	mkdir -p bin
	cd e2e/reproduce && $(NICE) $(GO) vet ./... && $(NICE) $(GO) test -c -o $(CURDIR)/bin/reproduce.test .

## reproduce: the paper's experiment on the live loop, real delay, real control plane (root; see
## e2e/reproduce): the full grid writes docs/reproduction.md, .json and the CDF PNGs; QUICK=1
## runs one app, scenario B, 200 req/s, 5 runs (report in bin/reproduction/); PRESET=NAME runs
## another preset (e2e/reproduce Presets: paper, closedloop, …; report in bin/reproduction-NAME/).
## REPRODUCE_OUT and REPRODUCE_RAW, when set, say where the report and the raw outcome go.
## REPRODUCE_SERVE_LOG=FILE keeps serve's log of every measured slice, at debug level, in FILE.
## SETUP=APP/SCENARIO runs one part of the preset's grid (report in bin/reproduction-PRESET-APP-
## SCENARIO/, the raw outcome gzipped beside it: bin/reproduction-PRESET-APP-SCENARIO.gob.gz);
## make reproduce-report REPRODUCE_RAW='PARTS' merges the parts into one report
QUICK ?=
PRESET ?= $(if $(QUICK),quick,full)
SETUP ?=
SETUP_WORDS = $(subst /, ,$(SETUP))
ifneq ($(SETUP),)
ifneq ($(words $(SETUP_WORDS)),2)
$(error SETUP=$(SETUP): want APP/SCENARIO, e.g. SETUP=bookinfo/A)
endif
endif
SETUP_NAME = $(if $(SETUP),-$(word 1,$(SETUP_WORDS))-$(word 2,$(SETUP_WORDS)))
REPRODUCE_DIR = $(or $(REPRODUCE_OUT),$(if $(and $(filter full,$(PRESET)),$(if $(SETUP),,1)),$(CURDIR)/docs,$(if $(filter quick,$(PRESET)),$(CURDIR)/bin/reproduction,$(CURDIR)/bin/reproduction-$(PRESET)$(SETUP_NAME))))
REPRODUCE_GOB = $(or $(REPRODUCE_RAW),$(CURDIR)/bin/reproduction$(if $(filter full,$(PRESET)),,-$(PRESET))$(SETUP_NAME).gob$(if $(SETUP),.gz))
reproduce: k8s
	mkdir -p bin
	cd e2e/reproduce && $(GO) test -c -o $(CURDIR)/bin/reproduce.test .
	$(if $(SETUP),REPRODUCE_APPS=$(word 1,$(SETUP_WORDS)) REPRODUCE_SCENARIOS=$(word 2,$(SETUP_WORDS))) \
	REPRODUCE_PRESET=$(PRESET) REPRODUCE_OUT='$(REPRODUCE_DIR)' REPRODUCE_RAW='$(REPRODUCE_GOB)' \
	  bin/reproduce.test -test.run '^TestReproduce$$' -test.v -test.count=1 -test.timeout 0

## reproduce-report: write the report of the last make reproduce again (into docs/, or
## bin/reproduction/ with QUICK=1, bin/reproduction-NAME/ with PRESET=NAME) from everything it
## measured (bin/reproduction.gob, or REPRODUCE_RAW: a list or a glob of parts), no rerun
reproduce-report:
	cd e2e/reproduce && $(GO) test -c -o $(CURDIR)/bin/reproduce.test .
	REPRODUCE_RAW='$(REPRODUCE_GOB)' REPRODUCE_OUT='$(REPRODUCE_DIR)' \
	  bin/reproduce.test -test.run '^TestRenderReport$$' -test.v -test.count=1

## reproduce-check: recompute every figure of docs/reproduction.md and .json from the JSON's per-run
## latencies and counts (e2e/reproduce/cmd/recompute); fails, listing them, on any mismatch
reproduce-check:
	cd e2e/reproduce && $(GO) run ./cmd/recompute -json $(CURDIR)/docs/reproduction.json -md $(CURDIR)/docs/reproduction.md

## k8s: build kube-apiserver, kube-scheduler and kube-controller-manager from the Go module proxy
## into $(CACHE)/k8s-VERSION (cold: ~14 min on 2 cores; cached: instant)
k8s:
	EDGEFLOW_CACHE=$(CACHE) e2e/k8s/build.sh

## helm: build Helm $(HELM_VERSION) from the Go module proxy into $(CACHE)/bin (cold ~5 min on 2 cores;
## cached: instant); e2e/install renders the chart with it
helm: $(HELM)

$(HELM):
	GOBIN=$(dir $(HELM)) $(NICE) $(GO) install helm.sh/helm/v3/cmd/helm@$(HELM_VERSION)

## manifests: install/manifests/edgeflow.yaml, the chart rendered with its default values for
## Kubernetes $(KUBE_VERSION) (its admission policy included) and without its Helm hooks (the
## cleanup Jobs: with plain manifests, run edgeflow uninstall yourself); e2e/install's
## TestManifestsUpToDate fails when it is stale
manifests: $(HELM)
	$(HELM) template edgeflow install/helm/edgeflow --namespace edgeflow --kube-version $(KUBE_VERSION) --set 'watch.namespaces={*}' \
	  $(addprefix --api-versions ,$(KUBE_API_VERSIONS)) --no-hooks > install/manifests/edgeflow.yaml

## docs: the CLI reference, docs/reference/cli (cmd/edgeflow's TestCLIDocsUpToDate fails when it is stale),
## and the chart README's values table from values.yaml (e2e/install's TestValuesTable likewise)
docs:
	$(GO) run ./cmd/edgeflow docs docs/reference/cli
	$(GO) test -count=1 -run '^TestValuesTable$$' ./e2e/install -update

lint: $(STATICCHECK)
	@fmt=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$fmt" ]; then echo "gofmt would change:"; echo "$$fmt"; exit 1; fi
	$(NICE) $(GO) vet ./...
	$(NICE) $(STATICCHECK) ./...
	@$(GO) mod tidy -diff || { echo "go.mod/go.sum are not tidy: run go mod tidy"; exit 1; }

$(STATICCHECK):
	GOBIN=$(dir $(STATICCHECK)) $(NICE) $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)

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
## bare go-control-plane server (own process, same resources), N raw ADS clients each (50 streams
## per connection, every response checked), interleaved rounds of file rename + SIGHUP; median per
## N, ratio, per-stream p50/p99, RSS per stream, server CPU per round, and the stages from the
## servers' own clocks (compiled → planned → translated → published → first/last response → last
## ACK) (e2e/pushbench; e.g. BENCH_PUSH_FLAGS='-sizes 1000 -rounds 3' or '-profile DIR')
BENCH_PUSH_FLAGS ?=
bench-push:
	$(GO) build -o bin/edgeflow ./cmd/edgeflow
	$(GO) build -o bin/pushbench ./e2e/pushbench
	$(GO) build -o bin/pushbench-bare ./e2e/pushbench/bare
	bin/pushbench -edgeflow bin/edgeflow -bare bin/pushbench-bare $(BENCH_PUSH_FLAGS)

clean:
	rm -rf bin
