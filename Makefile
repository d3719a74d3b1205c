# marina's build. `make help` lists the targets.
SHELL := /usr/bin/env bash
export GOTOOLCHAIN := local
export GOFLAGS := -mod=readonly

BIN := $(CURDIR)/bin

# What marina says it is (marina version) and the controller image of that
# version, which marina init installs by default: one stamp for make build
# and make image. Without a v* tag the version is v0.0.0-dev.<commit>.
VERSION ?= $(shell git describe --tags --match 'v*' --dirty 2>/dev/null || echo v0.0.0-dev.$$(git rev-parse --short=12 HEAD)$$(git diff --quiet HEAD -- 2>/dev/null || echo -dirty))
REVISION ?= $(shell git rev-parse HEAD)$(shell git diff --quiet HEAD -- 2>/dev/null || echo -dirty)
IMAGE_REPO ?= localhost/marina
VERSION_PKG := marina.dev/marina/internal/version
LDFLAGS := -X $(VERSION_PKG).version=$(VERSION) -X $(VERSION_PKG).revision=$(REVISION) -X $(VERSION_PKG).imageRepo=$(IMAGE_REPO)
CONTROLLER_GEN := go tool controller-gen

.PHONY: help
help: ## Show this help
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-18s %s\n", $$1, $$2}'

.PHONY: setup
setup: ## Build the pinned etcd and Kubernetes components into bin/ (only what is missing)
	tools/build.sh

.PHONY: build
build: ## Build bin/marina
	go build -ldflags "$(LDFLAGS)" -o $(BIN)/marina ./cmd/marina

.PHONY: image
image: ## Build the controller image (no container daemon) into bin/marina-image.tar and print its digest
	CGO_ENABLED=0 GOOS=linux go build -trimpath -ldflags "-s -w $(LDFLAGS)" -o $(BIN)/image/marina ./cmd/marina
	SOURCE_DATE_EPOCH=$$(git log -1 --format=%ct) go run ./tools/image -binary $(BIN)/image/marina \
		-version $(VERSION) -revision $(REVISION) -repo $(IMAGE_REPO) -out $(BIN)/marina-image.tar

.PHONY: images
images: setup ## Build the images marina up's registry serves real nodes (no container daemon) into bin/images/{pause,hello,coredns}.tar
	SOURCE_DATE_EPOCH=$$(git log -1 --format=%ct) go run ./tools/images/build -out $(BIN)/images -bin $(BIN)

.PHONY: generate
generate: ## Generate deepcopy code, CRDs, RBAC and the webhook configuration from the Go markers
	$(CONTROLLER_GEN) object paths=./api/...
	$(CONTROLLER_GEN) crd paths=./api/... output:crd:artifacts:config=config/crd/bases
	$(CONTROLLER_GEN) rbac:roleName=marina-manager paths=./internal/... output:rbac:artifacts:config=config/rbac
	$(CONTROLLER_GEN) webhook paths=./internal/webhook/... output:webhook:artifacts:config=config/webhook

.PHONY: verify-generated
verify-generated: generate ## Fail when generated files are stale
	@test -z "$$(git status --porcelain -- api config/crd config/rbac config/webhook)" || { git status --short -- api config/crd config/rbac config/webhook; git diff -- api config/crd config/rbac config/webhook | head -50; echo "generated files are stale: run make generate and commit"; exit 1; }

.PHONY: lint
lint: ## gofmt and go vet
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed: $$out"; exit 1; fi
	go vet ./...

.PHONY: test-deps
test-deps: ## Install podman (the e2e tests run marina's image with it) and what real nodes need: runc, CNI plugins, iptables, conntrack (Debian's packages, as root)
	tools/test-deps.sh

.PHONY: node-deps
node-deps: ## Install what real worker nodes need beside make setup's containerd: runc, CNI plugins, iptables, conntrack (Debian's packages, as root)
	tools/test-deps.sh --node

.PHONY: test
# The two longest packages are named first so that go test starts them
# first, and everything else fits beside them (named last, ./... found them
# last, and they ran alone after the others). The e2e tests run side by
# side, up to E2E_PARALLEL at once: most of their time is spent waiting on
# real timeouts with the cores idle. tools/testreport prints each package's
# line, the output of failing tests, and the slowest packages and tests.
E2E_PARALLEL ?= 3
test: setup images test-deps lint ## Build what the tests need, then run every test
	set -o pipefail; go test -count=1 -json -parallel $(E2E_PARALLEL) -timeout 45m ./test/e2e/ ./test/crashpoint/ ./... | go run ./tools/testreport

.PHONY: run
run: setup images node-deps build ## Build what is missing and start the embedded management plane (marina up)
	$(BIN)/marina up

.PHONY: bench
bench: setup build images node-deps ## Run the benchmarks in bench/
	go test -run '^$$' -bench . -benchtime 1x ./bench/...

.PHONY: crash-points
crash-points: setup build ## Stop the controllers at every write of every control-plane scenario on real processes (the long form of test/crashpoint: hours)
	go test -count=1 -v -timeout 48h -run TestCrashPoints ./test/crashpoint/ -crash-points=all
