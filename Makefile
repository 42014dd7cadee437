# txmq: build, test and code generation. `make test` is what CI runs.

GO ?= go
# The race detector needs cgo, hence a C compiler: `make test RACE=` without one.
RACE ?= -race

# Every build, test and tool run here uses this toolchain; the machine's own
# Go (1.26 or newer) fetches it from the module proxy once. go1.26.8 lacks
# standard library security fixes (net/http, crypto/tls, crypto/x509) that
# govulncheck reports; go.mod still says 1.26, so `go run ./cmd/broker`
# works with the machine's Go.
export GOTOOLCHAIN := go1.27.3

# Code generators, pinned; the versions are also in the headers of the
# generated files. After changing a version, delete bin/tools.
BUF_VERSION := v1.75.0
PROTOC_GEN_GO_VERSION := v1.36.12
PROTOC_GEN_GO_GRPC_VERSION := v1.6.2
# Checkers, pinned. govulncheck reads the Go vulnerability database from the
# golang.org/x/vulndb module (the Go module proxy serves it; vuln.go.dev is
# out of reach here), indexed by that module's own indexdb.
STATICCHECK_VERSION := v0.8.2
GOVULNCHECK_VERSION := v1.9.0
VULNDB_VERSION := v0.0.0-20261105234957-e22db6528018
TOOLS := $(CURDIR)/bin/tools
VULNDB := $(CURDIR)/bin/vulndb-$(VULNDB_VERSION)
# The buf modules of the workspace (buf.yaml), each with its buf.gen.yaml.
PROTO_MODULES := api/proto halfstore/storepb raftlog/raftpb

.PHONY: build test lint proto run cluster bench bench-peers chaos clean

build:
	$(GO) build -o bin/ ./cmd/...

# Modules of their own, so that their database drivers stay out of the root
# go.mod; ./... does not reach into them. client/go/dbtest tests the
# client's database helpers against SQLite, and against PostgreSQL and
# MariaDB when TXMQ_TEST_POSTGRES_DSN and TXMQ_TEST_MYSQL_DSN are set (.ci/run
# starts both servers; without them those tests skip, or fail under CI).
EXAMPLES := examples/points client/go/dbtest

test: lint
	$(GO) vet ./...
	for dir in $(EXAMPLES); do (cd $$dir && $(GO) vet ./...) || exit 1; done
	$(GO) test $(RACE) -count=1 -timeout 20m ./...
	for dir in $(EXAMPLES); do (cd $$dir && $(GO) test $(RACE) -count=1 -timeout 10m ./...) || exit 1; done
	# rocketmq/clienttest, a module of its own too, tests the RocketMQ front
	# end with the real github.com/apache/rocketmq-client-go/v2, without
	# the race detector: it reports the client's own race (rmqClient.close,
	# a bool Shutdown writes while the client's goroutines read it). The
	# front end is race-tested in ./rocketmq.
	cd rocketmq/clienttest && $(GO) vet ./... && $(GO) test -count=1 -timeout 10m ./...
	# A smoke run of every txmq-bench workload with tiny sizes (about 20 s),
	# so that the bench cannot rot; its figures mean nothing.
	$(GO) test $(RACE) -count=1 -timeout 5m -run '^$$' -bench . -benchtime 1x ./cmd/txmq-bench/
	# The NATS peer (a module of its own) is built, vetted and its report
	# tested here; it runs in `make bench-peers`.
	cd bench/peers && $(GO) vet ./... && $(GO) test -count=1 ./...

# gofmt, go.mod tidy, staticcheck and govulncheck over the root module.
lint: $(TOOLS)/staticcheck $(TOOLS)/govulncheck $(VULNDB)/index/db.json
	@files="$$(git ls-files '*.go')" && [ -n "$$files" ] && unformatted="$$(gofmt -l $$files)" || exit 1; \
	if [ -n "$$unformatted" ]; then echo "gofmt -l lists these files; run gofmt -w on them:"; echo "$$unformatted"; exit 1; fi
	$(GO) mod tidy -diff || { echo "go.mod/go.sum are not tidy: run go mod tidy"; exit 1; }
	$(TOOLS)/staticcheck ./...
	$(TOOLS)/govulncheck -db file://$(VULNDB) ./...

$(TOOLS)/staticcheck:
	GOBIN=$(TOOLS) $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)

$(TOOLS)/govulncheck:
	GOBIN=$(TOOLS) $(GO) install golang.org/x/vuln/cmd/govulncheck@$(GOVULNCHECK_VERSION)

$(VULNDB)/index/db.json:
	GOBIN=$(TOOLS) GOFLAGS=-mod=mod $(GO) install golang.org/x/vulndb/cmd/indexdb@$(VULNDB_VERSION)
	rm -rf $(VULNDB) && $(TOOLS)/indexdb -vulns "$$($(GO) mod download -json golang.org/x/vulndb@$(VULNDB_VERSION) | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$$/\1/p')/data/osv" -out $(VULNDB)

proto: $(TOOLS)/buf $(TOOLS)/protoc-gen-go $(TOOLS)/protoc-gen-go-grpc
	for dir in $(PROTO_MODULES); do PATH="$(TOOLS):$$PATH" $(TOOLS)/buf generate $$dir --template $$dir/buf.gen.yaml || exit 1; done

$(TOOLS)/buf:
	GOBIN=$(TOOLS) $(GO) install github.com/bufbuild/buf/cmd/buf@$(BUF_VERSION)

$(TOOLS)/protoc-gen-go:
	GOBIN=$(TOOLS) $(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@$(PROTOC_GEN_GO_VERSION)

$(TOOLS)/protoc-gen-go-grpc:
	GOBIN=$(TOOLS) $(GO) install google.golang.org/grpc/cmd/protoc-gen-go-grpc@$(PROTOC_GEN_GO_GRPC_VERSION)

run:
	$(GO) run ./cmd/broker

# A local three-node cluster on loopback until Ctrl-C (scripts/cluster.sh);
# `make cluster CLUSTER_FLAGS=--fresh` starts it with empty data.
cluster:
	GO="$(GO)" bash scripts/cluster.sh $(CLUSTER_FLAGS)

# The benchmarks (docs/benchmarks.md): every txmq-bench workload on a fresh
# three-node cluster of broker processes on loopback. Not part of `make test`.
# `make bench BENCH_FLAGS='--workloads tx --producers 16 --duration 30s'`.
bench: build
	bin/txmq-bench --broker-bin bin/broker $(BENCH_FLAGS)

# txmq-bench (JSON), the Raft floor (raftlog's BenchmarkRaftFloor:
# hashicorp/raft alone as txmq configures it) and NATS JetStream R3
# (bench/peers, nats-server v2.15.2 with its default fsync and with
# sync_interval: always) on this machine in one go, then BENCH_ROUNDS
# alternated rounds of the throughput and e2e targets
# (scripts/bench-rounds.sh; 0 for none), then the side-by-side tables and
# the ratios against the targets.
BENCH_ROUNDS ?= 3
bench-peers: build
	@mkdir -p bin/bench
	bin/txmq-bench --broker-bin bin/broker -o json --breakdown $(BENCH_FLAGS) > bin/bench/txmq.json
	$(GO) test -run '^$$' -bench RaftFloor -benchtime 1x ./raftlog > bin/bench/floor.txt || { cat bin/bench/floor.txt; exit 1; }
	cd bench/peers && $(GO) build -o ../../bin/bench/peers .
	bash scripts/bench-rounds.sh $(BENCH_ROUNDS) bin/bench
	bin/bench/peers --txmq bin/bench/txmq.json --floor bin/bench/floor.txt $(foreach i,$(shell seq $(BENCH_ROUNDS)),--round bin/bench/round-$(i).json) $(PEER_FLAGS)

# The fault suite (docs/reliability.md): real broker processes on loopback,
# faults, heal, drain, check; exits 1 on a lost message, a ghost, a half
# message left pending or diverged stores. CI: `make chaos ARGS=--short`
# (every fault variant once and two combinations, about 4 minutes); `make chaos ARGS='--soak 30m'`.
chaos: build
	bin/txmq-chaos --broker-bin bin/broker $(ARGS)

clean:
	rm -rf bin
