# gpuhealth — build, generate, lint and test.
#
# Tools are installed by version from the Go module proxy into ./bin (the Go
# build cache, outside the repo, makes a reinstall in a fresh clone quick).
# The control-plane binaries (kube-apiserver, etcd, kwok, …) are built by
# hack/controlplane.sh into a versioned cache outside the repo.

SHELL := /usr/bin/env bash -o pipefail
.SHELLFLAGS := -ec
.DEFAULT_GOAL := build

export GOTOOLCHAIN := local
# go-nvml's cgo wrappers call NVML functions NVIDIA marks deprecated; the
# warnings say nothing about this project.
export CGO_CFLAGS ?= -O2 -g -Wno-deprecated-declarations

LOCALBIN ?= $(CURDIR)/bin
CONTROLLER_TOOLS_VERSION ?= v0.23.0
GOLANGCI_LINT_VERSION ?= v2.15.0
HELM_VERSION ?= v3.22.0
CONTROLLER_GEN ?= $(LOCALBIN)/controller-gen-$(CONTROLLER_TOOLS_VERSION)
GOLANGCI_LINT ?= $(LOCALBIN)/golangci-lint-$(GOLANGCI_LINT_VERSION)
HELM ?= $(LOCALBIN)/helm-$(HELM_VERSION)

# Packages whose +kubebuilder:rbac markers make the operator's ClusterRole.
RBAC_PATHS := $(strip $(foreach d,controllers remediation cmd/gpuhealth-operator,$(if $(wildcard $(d)),paths=./$(d)/...)))

# Generated files that verify-generated checks.
GENERATED := api/v1alpha1/zz_generated.deepcopy.go api/xid/zz_generated.catalog.go config/crd config/rbac docs/monitors.md charts/gpuhealth/files \
	config/manager/manager.yaml config/monitor/daemonset.yaml config/jobs/jobs.yaml config/default/gpuhealth.yaml
# Module files that verify-generated checks after go mod tidy.
MODFILES := go.mod go.sum

GO_TEST_FLAGS ?= -count=1
IMAGE_TAG ?= dev
OUTPUT ?= $(CURDIR)/_output
# The operator's metrics as make e2e records them (internal/test/recording's format),
# and what make dashboard-png draws from them.
E2E_METRICS ?= $(OUTPUT)/e2e/operator-metrics.txt
DASHBOARD_PNG ?= docs/dashboard.png

##@ General

.PHONY: help
help: ## Show this help.
	@awk 'BEGIN {FS = ":.*##"; printf "Usage: make <target>\n"} /^[a-zA-Z_0-9-]+:.*?##/ { printf "  %-20s %s\n", $$1, $$2 } /^##@/ { printf "\n%s\n", substr($$0, 5) }' $(MAKEFILE_LIST)

##@ Build

.PHONY: build
build: build-operator build-monitor build-plugin ## Build the binaries into _output/bin.

.PHONY: build-operator
build-operator: ## Build gpuhealth-operator (static, CGO_ENABLED=0).
	CGO_ENABLED=0 go build -trimpath -o $(OUTPUT)/bin/gpuhealth-operator ./cmd/gpuhealth-operator

.PHONY: build-plugin
build-plugin: ## Build the kubectl plugin kubectl-gpuhealth (put _output/bin on PATH, then kubectl gpuhealth).
	CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o $(OUTPUT)/bin/kubectl-gpuhealth ./cmd/kubectl-gpuhealth

.PHONY: build-monitor
build-monitor: ## Build gpuhealth-monitor (cgo: go-nvml and go-dcgm dlopen their libraries).
	CGO_ENABLED=1 go build -trimpath -o $(OUTPUT)/bin/gpuhealth-monitor ./cmd/gpuhealth-monitor

.PHONY: image
image: ## Build the operator and monitor images (localhost/gpuhealth-{operator,monitor}:$(IMAGE_TAG)) from the Dockerfile with podman; prints their IDs and sizes.
	IMAGE_TAG=$(IMAGE_TAG) hack/image.sh

.PHONY: fakenvml
fakenvml: ## Build the fake NVML library (libnvidia-ml.so.1, driven by a scenario file) for tests and the demo.
	mkdir -p $(OUTPUT)/fakenvml
	gcc -shared -fPIC -O2 -Wall -Wextra -o $(OUTPUT)/fakenvml/libnvidia-ml.so.1 monitors/fakenvml/*.c -lpthread

##@ Development

.PHONY: generate
generate: $(CONTROLLER_GEN) $(HELM) ## Generate deepcopy code, CRDs and RBAC from the Go markers, the XID catalog from NVIDIA's tables, and its docs.
	$(CONTROLLER_GEN) object:headerFile=hack/boilerplate.go.txt paths=./api/...
	$(CONTROLLER_GEN) crd paths=./api/... output:crd:artifacts:config=config/crd
	go generate ./api/xid
	go run ./hack/xiddocs -docs docs/monitors.md
	@if [ -n "$(RBAC_PATHS)" ]; then set -x; $(CONTROLLER_GEN) rbac:roleName=gpuhealth-operator $(RBAC_PATHS) output:rbac:artifacts:config=config/rbac; fi
	HELM=$(HELM) hack/chartfiles.sh

.PHONY: verify-generated
verify-generated: generate ## Fail when generated files, go.mod or go.sum (after go mod tidy) differ from what is committed.
	go mod tidy
	@stale=0; \
	changed=$$(git status --porcelain --untracked-files=all -- $(GENERATED)); \
	if [ -n "$$changed" ]; then \
	  echo "Generated files are stale; run 'make generate' and commit the result:"; echo "$$changed"; \
	  git --no-pager diff --stat -- $(GENERATED); stale=1; \
	fi; \
	changed=$$(git status --porcelain --untracked-files=all -- $(MODFILES)); \
	if [ -n "$$changed" ]; then \
	  echo "go.mod or go.sum is not tidy; run 'go mod tidy' and commit the result:"; echo "$$changed"; \
	  git --no-pager diff -- $(MODFILES); stale=1; \
	fi; \
	if [ "$$stale" = 1 ]; then exit 1; fi; echo "generated files and go.mod/go.sum are up to date"

.PHONY: fmt
fmt: ## Run gofmt on the tree.
	gofmt -w $$(git ls-files '*.go')

.PHONY: lint
lint: $(GOLANGCI_LINT) ## Run golangci-lint.
	$(GOLANGCI_LINT) run ./...

##@ Test

.PHONY: controlplane
controlplane: ## Build (or find cached) kube-apiserver, etcd, kwok and friends.
	hack/controlplane.sh >/dev/null

# How many packages make unit builds and tests at once. go test's default
# is the CPU count, and a running test package holds its slot: on 2 cores
# two packages waiting on their envtest apiserver or their own timers kept
# the compiler and the other packages idle. With 4, 232 s went to 193 s
# on an otherwise idle 2-core machine.
UNIT_PARALLEL ?= 4

.PHONY: unit
unit: controlplane $(HELM) ## Run unit and envtest suites (the chart's tests run helm).
	HELM=$(HELM) KUBEBUILDER_ASSETS="$$(hack/controlplane.sh 2>/dev/null | tail -1)" go test -p $(UNIT_PARALLEL) $(GO_TEST_FLAGS) ./...

# Fuzz targets (package:target) that `make fuzz` runs for FUZZTIME each. The
# seed corpora also run as plain tests in `make unit`.
FUZZ_TARGETS := api/xid:FuzzLookup monitors/kmsg:FuzzParse monitors/metrics:FuzzBearer monitors/imex:FuzzParseDaemonStatus \
	monitors/imex:FuzzParseDomainStatus monitors/fakenvml:FuzzParseScenario monitors/agent:FuzzParseConfig \
	remediation/suite:FuzzParseNCCLTests remediation/suite:FuzzParseDCGMDiag remediation/handoff:FuzzRender \
	monitors/dradriver:FuzzFinding monitors/services:FuzzParseDpkgStatus \
	remediation/devicetaint:FuzzParseWouldEvict remediation/suite:FuzzParseIBPerftest monitors/ib:FuzzParseRate
FUZZTIME ?= 3s
# make fuzz keeps one instrumented test binary per package here: a package
# with two targets is linked once, and a later run relinks only what changed.
FUZZ_BIN ?= $(OUTPUT)/fuzz
FUZZ_PKGS := $(sort $(foreach t,$(FUZZ_TARGETS),$(firstword $(subst :, ,$(t)))))

.PHONY: fuzz
fuzz: ## Run every parser's fuzz target briefly (FUZZTIME each; longer: make fuzz FUZZTIME=5m).
	@# go test -c -fuzz builds the binary go test -fuzz would (every
	@# package instrumented); it is run as go test runs it: in the package's
	@# folder, with the fuzz cache go test uses (new inputs land there).
	@# Go 1.26's fuzz coordinator can fail a run at its -fuzztime deadline
	@# with a bare "context deadline exceeded" when a worker answers late
	@# (go.dev/issue/75804, fixed in Go 1.27): such a run, which wrote no
	@# failing input, is run once more; any other failure fails at once.
	@mkdir -p $(FUZZ_BIN); cache=$$(go env GOCACHE)/fuzz; mod=$$(go list -m); \
	for pkg in $(FUZZ_PKGS); do \
	  go test -c -fuzz . -o $(FUZZ_BIN)/$${pkg//\//_}.test ./$$pkg; done; \
	for t in $(FUZZ_TARGETS); do pkg=$${t%%:*}; fn=$${t##*:}; \
	  for try in 1 2; do \
	    echo "fuzz $$pkg $$fn ($(FUZZTIME))"; \
	    rc=0; out=$$(cd $$pkg && $(FUZZ_BIN)/$${pkg//\//_}.test -test.run '^$$' -test.fuzz "^$$fn\$$" -test.fuzztime $(FUZZTIME) \
	      -test.fuzzcachedir "$$cache/$$mod/$$pkg" -test.paniconexit0 -test.timeout 10m 2>&1) || rc=$$?; printf '%s\n' "$$out"; \
	    [ $$rc -eq 0 ] && break; \
	    if [ $$try -eq 1 ] && grep -q '^    context deadline exceeded$$' <<<"$$out" && ! grep -q 'Failing input written' <<<"$$out"; then \
	      echo "fuzz $$pkg $$fn: the coordinator's deadline race (go.dev/issue/75804), no failing input written: run again"; continue; fi; \
	    exit 1; done; done

.PHONY: nvml-real
nvml-real: ## The agent against NVIDIA's real libnvidia-ml.so.1 of driver branch 535 (hack/nvml535.sh caches it): every NVML call it makes unlooked-up exists there, and without a driver it retries the nvml source and keeps running.
	dir=$$(hack/nvml535.sh | tail -1); \
	GPUHEALTH_NVML_REAL_DIR="$$dir" go test -tags nvmlreal $(GO_TEST_FLAGS) -v -timeout 5m ./e2e/nvmlreal/

.PHONY: e2e
e2e: controlplane $(HELM) image ## End-to-end suite: the real binaries on a local kwok cluster, installed with the chart, and the images (GPUHEALTH_E2E_KEEP=1 keeps the logs); records the operator's metrics in E2E_METRICS for dashboard-png.
	HELM=$(HELM) GPUHEALTH_IMAGE_TAG=$(IMAGE_TAG) GPUHEALTH_E2E_METRICS=$(E2E_METRICS) go test -tags e2e -count=1 -v -timeout 25m ./e2e/

.PHONY: e2e-node
e2e-node: controlplane $(HELM) image ## Real-node tier: a kubelet with containerd on this machine (hack/realnode.sh), the chart installed, real pods (GPUHEALTH_E2E_KEEP=1 keeps the node up).
	HELM=$(HELM) hack/controlplane.sh node >/dev/null
	rc=0; GPUHEALTH_IMAGE_TAG=$(IMAGE_TAG) go test -tags e2enode -count=1 -v -timeout 15m ./e2e/realnode/ || rc=$$?; \
	  if [ -z "$$GPUHEALTH_E2E_KEEP" ]; then hack/realnode.sh down >/dev/null 2>&1 || true; fi; exit $$rc

# The chaos soak's smoke (hack/soak): 90 seconds of chaos on the full
# 200-node setup, with the same invariants as the 30-minute run. Each kind
# of chaos still comes: the leader kill, the monitor kill and the first
# outage are placed by fractions of the run, and past its first third
# every third action is of a kind not seen yet. Outages last 10-30 s
# instead of 10-60 s: still past the operator's 10 s renew deadline.
SOAK_SMOKE_FLAGS ?= -duration 90s -outage-max 30s

.PHONY: soak-smoke
soak-smoke: controlplane $(HELM) ## Chaos soak, 90-second smoke: faults, leader kills, an apiserver outage and a monitor kill on a local kwok cluster, with the invariant checks (the full run: go run ./hack/soak).
	HELM=$(HELM) go run ./hack/soak $(SOAK_SMOKE_FLAGS)

.PHONY: dashboard-png
dashboard-png: ## Draw the dashboard's Goodput row into docs/dashboard.png from the operator metrics the last make e2e recorded in _output/e2e/operator-metrics.txt (other files: E2E_METRICS=…, DASHBOARD_PNG=…).
	@test -s $(E2E_METRICS) || { echo "no recording at $(E2E_METRICS): run make e2e first (or set E2E_METRICS)"; exit 1; }
	go run ./hack/dashboard -in $(E2E_METRICS) -out $(DASHBOARD_PNG)

.PHONY: demo
demo: $(HELM) build-plugin ## Start a local cluster with 4 fake GPU nodes, the operator and monitors; inject XID 79 and watch it heal.
	HELM=$(HELM) go run ./e2e/demo

.PHONY: demo-down
demo-down: ## Remove the demo cluster and stop its processes.
	go run ./e2e/demo -down

# The tiers of make test, in order. image is a prerequisite of e2e and
# e2e-node; as a tier of its own its time is not counted in e2e's. Tiers
# joined by "+" run side by side (each its own make, its output held and
# printed whole when it ends, as make -O does; the table gives each its
# own time and the group's in total). The real-NVML tier mostly waits on
# the agent's retry timer, so it runs beside the fuzzers. The real-node tier and the soak
# smoke mostly wait on timers, so they share the machine: 4m38s and 3m34s
# of their own, 4m39s together (docs/e2e.md). They do not share ports: clusters
# are created one at a time under a lock (e2e/framework's lockPorts), and
# the harnesses' own processes take ports below kwokctl's and the
# kernel's ephemeral range (framework.FreeAddr).
TEST_TIERS := controlplane verify-generated lint unit fuzz+nvml-real image e2e e2e-node+soak-smoke
# Where make test writes its table of tier times (it prints it as well).
TEST_TIMES ?= $(OUTPUT)/test-times.txt

.PHONY: test
test: ## Everything CI runs: generated files, lint, unit and envtest suites, short fuzz runs, the end-to-end suite and its real-node tier, the chaos soak's smoke; prints each tier's time at the end.
	@# Each tier is its own make, told (-o) not to make again the tiers
	@# already made, so a prerequisite shared by two tiers is made once and
	@# counted in the first. The table comes also after a failure; make -k
	@# goes on with the next tier.
	@rc=0; made=(); rows=(); start=$$(date +%s); logs=$$(mktemp -d); trap 'rm -rf "$$logs"' EXIT; \
	for group in $(TEST_TIERS); do \
	  IFS=+ read -r -a tiers <<< "$$group"; s=$$(date +%s); \
	  if [ $${#tiers[@]} = 1 ]; then \
	    if $(MAKE) --no-print-directory "$${made[@]}" $$group; then r=ok; else r=FAILED; rc=1; fi; \
	    rows+=("$$group|$$(( $$(date +%s) - s ))|$$r"); \
	  else \
	    for t in "$${tiers[@]}"; do \
	      ( ts=$$(date +%s); r=0; $(MAKE) --no-print-directory "$${made[@]}" $$t > "$$logs/$$t.log" 2>&1 || r=$$?; \
	        echo "$$(( $$(date +%s) - ts )) $$r" > "$$logs/$$t.tmp"; mv "$$logs/$$t.tmp" "$$logs/$$t.rc" ) & \
	    done; \
	    for t in "$${tiers[@]}"; do \
	      while [ ! -e "$$logs/$$t.rc" ]; do sleep 1; done; cat "$$logs/$$t.log"; \
	      set -- $$(cat "$$logs/$$t.rc"); if [ "$$2" = 0 ]; then r=ok; else r=FAILED; rc=1; fi; \
	      rows+=("$$t|$$1|$$r"); \
	    done; wait; \
	    rows+=("($${group//+/ + })|$$(( $$(date +%s) - s ))|side by side"); \
	  fi; \
	  for t in "$${tiers[@]}"; do made+=(-o "$$t"); done; \
	  if [ $$rc != 0 ] && [ -z "$(findstring k,$(firstword x$(MAKEFLAGS)))" ]; then break; fi; \
	done; \
	rows+=("total|$$(( $$(date +%s) - start ))|$$([ $$rc = 0 ] && echo ok || echo FAILED)"); \
	mkdir -p "$$(dirname "$(TEST_TIMES)")"; \
	{ echo; echo "make test, time per tier:"; printf '%-28s %8s  %s\n' tier time result; \
	  for row in "$${rows[@]}"; do IFS='|' read -r n secs r <<< "$$row"; \
	    printf '%-28s %4dm%02ds  %s\n' "$$n" $$(( secs / 60 )) $$(( secs % 60 )) "$$r"; done; \
	} | tee "$(TEST_TIMES)"; \
	exit $$rc

##@ Tools

$(LOCALBIN):
	mkdir -p $(LOCALBIN)

$(CONTROLLER_GEN): | $(LOCALBIN)
	GOBIN=$(LOCALBIN) go install sigs.k8s.io/controller-tools/cmd/controller-gen@$(CONTROLLER_TOOLS_VERSION)
	mv $(LOCALBIN)/controller-gen $@

$(GOLANGCI_LINT): | $(LOCALBIN)
	GOBIN=$(LOCALBIN) go install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_LINT_VERSION)
	mv $(LOCALBIN)/golangci-lint $@

.PHONY: helm
helm: $(HELM) ## Install helm into ./bin.
$(HELM): | $(LOCALBIN)
	GOBIN=$(LOCALBIN) go install helm.sh/helm/v3/cmd/helm@$(HELM_VERSION)
	mv $(LOCALBIN)/helm $@

.PHONY: bench-monitor
bench-monitor: controlplane ## Node agent benchmark: injection-to-object latency, a 10,000-XID storm, idle CPU and RSS (also with the ib source polling 8 adapters each second).
	KUBEBUILDER_ASSETS="$$(hack/controlplane.sh 2>/dev/null | tail -1)" go run ./hack/monitorbench

.PHONY: bench
bench: controlplane build-operator ## Cordon-speed benchmark on a local kwok cluster, 10 pods per node (NODES=100 for a quick look, PODS=0 without pods).
	go run ./hack/bench -nodes $${NODES:-1000} -pods-per-node $${PODS:-10}

.PHONY: bench-scale
bench-scale: controlplane build-operator ## The scale curve: the cordon benchmark at 1,000, 5,000 and 10,000 nodes (1 pod each), each on a fresh cluster; draws docs/scale.png.
	go run ./hack/bench -nodes $${SIZES:-1000,5000,10000} -pods-per-node $${PODS:-1} -backlog-max-nodes 5000 -detect-samples 20 -plot docs/scale.png -out _output/bench-scale.md

.PHONY: bench-device
bench-device: controlplane $(HELM) ## One GPU's fault under scope Device against scope Node, side by side on one kwok cluster: GPU-seconds out, finding to rule, pods disturbed.
	HELM=$(HELM) go run ./hack/devicebench -faults $${FAULTS:-20}

.PHONY: bench-gang
bench-gang: controlplane $(HELM) ## A 16-node × 8-GPU job losing one node, drain.gangs Pods against Gang side by side: stranded GPU-time.
	HELM=$(HELM) go run ./hack/gangbench -collective-timeout $${COLLECTIVE_TIMEOUT:-120s}

.PHONY: bench-drain
bench-drain: controlplane build-operator ## Drain race: gpuhealth (sample and raised eviction limits) against kubectl drain -l on identical fresh node sets.
	go run ./hack/bench -drain -out _output/bench-drain.md
