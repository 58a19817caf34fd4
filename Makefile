# UCM-Go. Two commands set everything up on a fresh machine with Go, gcc, make and git:
#   make run    the main job: multi-turn chats on the small model through the reference connector
#               loop, with and without an embedded default store under ./ucm-data/chat (needs
#               nothing but Go and gcc)
#   make test   the whole test suite, as root: `make deps` first (the Debian packages it needs,
#               installed with apt-get where missing), then lint, go test -race with both I/O
#               backends (including the power-loss simulation, fault injection, 20 kill -9 cycles
#               and 10 more on a tiered store), the sharing kill tests on GlusterFS volumes mounted
#               twice (two instances; eight over a volume of two bricks), Prometheus evaluating
#               the dashboards' queries against a store, a 10 s fuzz smoke per target
# CI (.ci/run) runs make test, then make test-mooncake.

GO          ?= go
# The io_uring backend (github.com/iceber/iouring-go) links into syscall internals:
# Go >= 1.23 needs -checklinkname=0. It is behind the `uring` build tag so that plain
# `go build ./...` works for anyone embedding the engine; everything here builds with it.
# CRC32C, the checksum of every stored byte, comes from Intel's ISA-L (Debian's libisal-dev:
# AVX-512 where the CPU has it, about twice Go's rate on large buffers; internal/crc32c) when
# its header is installed, which make deps does; otherwise from Go's hash/crc32, bit for bit
# the same. The unit tests check that the binary uses the one these tags select.
ISAL_HEADER ?= /usr/include/isa-l/crc.h
# Tags are comma-separated: BUILDFLAGS is also used inside single-quoted sh -c scripts.
comma       := ,
TAGS        ?= uring$(if $(wildcard $(ISAL_HEADER)),$(comma)isal)
CRC32C_IMPL := $(if $(findstring isal,$(TAGS)),isa-l,go)
LDFLAGS     ?= -checklinkname=0
BUILDFLAGS  := -tags '$(TAGS)' -ldflags '$(LDFLAGS)'
STATICCHECK_VERSION := v0.8.2
BIN         := $(CURDIR)/bin
FUZZTIME    ?= 60s

.PHONY: all build lib run bench bench-check train-model deps test test-python test-pip test-prometheus lint lint-history vet staticcheck unit fuzz fuzz-smoke fuzz-run crashtest crashtest-long test-gluster test-gluster-long clean mooncake test-mooncake bench-mooncake

all: build

# bin/ucm-tool, the operator's tool (verify, inspect, stats, compact, gc, evict, devices), and
# bin/ucm-lab, the lab's command (bench, eval, chat).
build:
	$(GO) build $(BUILDFLAGS) -o $(BIN)/ucm-tool ./tools/ucm-tool
	$(GO) build $(BUILDFLAGS) -o $(BIN)/ucm-lab ./lab/cmd/ucm-lab

# The C ABI for inference engines (docs/connector.md): lib/libucmgo.so and its header lib/ucmgo.h.
# The nonvml tag leaves NVML discovery out of the library: go-nvml leaves NVML's symbols
# unresolved, which a program linking the library would fail on (kernels/nvml_nocgo.go).
LIB := $(CURDIR)/lib
lib:
	$(GO) build -tags '$(TAGS),nonvml' -ldflags '$(LDFLAGS)' -buildmode=c-shared -o $(LIB)/libucmgo.so ./connector/capi
	rm -f $(LIB)/libucmgo.h
	cp connector/capi/ucmgo.h $(LIB)/ucmgo.h

run: build
	$(BIN)/ucm-lab chat --dir ./ucm-data/chat

# Retrains the small model (lab/model; docs/model.md): Debian's python3-torch, and
# libopenblas0-pthread for speed (train.py uses it without touching the system's BLAS). CI never
# trains; the weights, manifest and golden fixture it rewrites are committed.
MODEL_MINUTES ?= 95
train-model:
	/usr/bin/python3 lab/model/train.py --steps 8000 --max-minutes $(MODEL_MINUTES) --batch 2 --ctx 1024 \
		--short-ctx 256 --long-frac 0.3 --lr 3e-3 --warmup 50 --log-every 50 --eval-windows 96

bench: deps build
	$(BIN)/ucm-lab bench --dir ./ucm-data --workload seq --block-size 2MiB --shards 32 --total 2GiB

# The performance regression guard (docs/performance.md, "Regression guard"): a short fixed set
# (seq against fio, layer-wise against whole blocks in both shapes, lookups against a Go map,
# gathers and scatters against Go's copy), 7 interleaved rounds, each case's median ratio
# compared with lab/benchcheck/baseline.json; exits 1 when one dropped more than 10 % with
# every round below the baseline. A few minutes; needs fio. Not part of make test. BENCH_CHECK=--update rewrites the baseline.
BENCH_CHECK ?=
bench-check: deps build
	$(BIN)/ucm-lab bench-check $(BENCH_CHECK)

# The Debian packages make test needs beyond Go, gcc, make and git: Debian's python3 with numpy,
# pytest and torch, python3-pip and python3-venv, glusterfs-server and -client, prometheus,
# procps, and fio for make bench and bench-check (tools/deps.sh). Each is checked first and apt-get installs only what is missing, so on
# a machine that has them it installs nothing and says so. Installing needs root; so does make
# test (test-gluster mounts volumes).
deps:
	PYTHON=$(PYTHON) bash tools/deps.sh

# deps finishes before any step starts, also under make -j.
TEST_STEPS := lint unit test-python test-pip test-prometheus test-gluster fuzz-smoke
test: deps
	@$(MAKE) --no-print-directory $(TEST_STEPS)

# The Python package (connector/python/ucmgo) against the library `make lib` builds, with
# Debian's python3 (a python3 earlier on PATH may lack numpy, pytest and torch).
PYTHON ?= /usr/bin/python3
test-python: lib build
	UCMGO_LIB=$(LIB)/libucmgo.so $(PYTHON) -m pytest -q -p no:cacheprovider connector/python/tests tools/ucm-e2e

# The package as a user installs it: `pip install ./connector/python` (and `pip install -e`) into
# fresh venvs of Debian's python3 (python3-venv, python3-pip) with no package index reachable,
# then `import ucmgo`, UCM's factory, a dump and a load outside the repository with no
# PYTHONPATH or UCMGO_LIB (connector/python/tests/pip_install.sh; docs/connector.md).
test-pip:
	PYTHON=$(PYTHON) bash connector/python/tests/pip_install.sh

unit:
	UCM_CRC32C=$(CRC32C_IMPL) $(GO) test -race -count=1 -timeout 30m $(BUILDFLAGS) -skip '^TestPrometheusDashboards$$' ./...
	UCM_CRC32C=go $(GO) test -count=1 ./internal/crc32c/ ./format/
	UCM_KILL_MODE=tiered UCM_KILL_CYCLES=10 $(GO) test -race -count=1 -timeout 10m $(BUILDFLAGS) -run '^TestKillLoop$$' ./fuzz/

# A real Prometheus (Debian's prometheus package, which make deps installs) scrapes a worker's and
# a device-less store's endpoints while a workload runs, and every PromQL expression and
# template query of docs/grafana-ucmgo.json, and the series UCM's dashboard charts
# (connector/testdata/ucm-dashboard-series.txt), must return series through its HTTP API. UCM's
# dashboard itself is evaluated too when UCM_GRAFANA_JSON names it, or UCM_MIRROR names a git
# mirror of UCM to take examples/metrics/grafana.json from (it is never committed here).
# Without a prometheus binary the test is skipped, and says so loudly.
test-prometheus:
	@if ! command -v prometheus >/dev/null 2>&1; then \
		echo '!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!'; \
		echo '!!! test-prometheus SKIPPED: no prometheus binary (apt-get install prometheus) !!!'; \
		echo '!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!'; \
	fi
	@set -e; dash="$(UCM_GRAFANA_JSON)"; tmp=""; \
	if [ -z "$$dash" ] && [ -n "$(UCM_MIRROR)" ]; then \
		tmp=$$(mktemp); dash=$$tmp; git --git-dir="$(UCM_MIRROR)" show HEAD:examples/metrics/grafana.json > "$$tmp"; \
	fi; \
	rc=0; UCM_GRAFANA_JSON="$$dash" $(GO) test -count=1 -timeout 5m $(BUILDFLAGS) -run '^TestPrometheusDashboards$$' -v ./connector/ || rc=$$?; \
	if [ -n "$$tmp" ]; then rm -f "$$tmp"; fi; exit $$rc

# The sharing tests on a real GlusterFS volume mounted twice (two "hosts"): the harness starts
# glusterd unless one runs, creates and mounts its own volume and removes what it created, also on
# failure; concurrent runs leave each other alone (needs root, FUSE and Debian's glusterfs-server
# and glusterfs-client, which make deps installs).
SHARE_KILL_CYCLES ?= 5
test-gluster:
	bash fuzz/gluster/harness.sh sh -c 'UCM_SHARE_KILL_DIR=$$UCM_GLUSTER_A UCM_SHARE_KILL_DIR2=$$UCM_GLUSTER_B \
		UCM_SHARE_KILL_CYCLES=$(SHARE_KILL_CYCLES) $(GO) test -count=1 -timeout 10m $(BUILDFLAGS) -run "^TestSharedKillWhileReading$$|^TestSharedReadYourWritesKill$$" -v ./fuzz/ && \
		UCM_SHARED_TEST_A=$$UCM_GLUSTER_A UCM_SHARED_TEST_B=$$UCM_GLUSTER_B UCM_SHARED_TEST_BRICK=$$UCM_GLUSTER_BRICK \
		$(GO) test -count=1 -timeout 10m $(BUILDFLAGS) -run "^TestSharedTier" ./engine/'
	$(call gluster_many,$(SHARE_MANY_KILLS),$(SHARE_MANY_BLOCKS),5m)

# More than two: TestSharedManyKill on a distributed volume of two bricks mounted twice, 8
# instance processes, 4 on each mount (two hosts), killed at random and restarted (KILLS kills),
# each dumping BLOCKS blocks of 128 KiB and loading the others'; then every instance reopened
# loads every acknowledged block byte-exact, and the bricks' bytes, sampled all along, stay under
# the capacity bound (docs/sharing.md). make test runs a short one (about 20 s with the harness),
# test-gluster-long a long one. Then TestSharedLeaseContention on the same volume: 8 processes, 4
# on each mount, for 5 s, every Hold of the reclaimer lease a takeover attempt (two clients
# renaming onto one name at once deadlock such a volume; the lease's lock prevents it).
SHARE_MANY_KILLS ?= 12
SHARE_MANY_BLOCKS ?= 48
gluster_many = UCM_GLUSTER_BRICKS=2 bash fuzz/gluster/harness.sh sh -c 'UCM_SHARE_KILL_DIR=$$UCM_GLUSTER_A \
	UCM_SHARE_KILL_DIR2=$$UCM_GLUSTER_B UCM_SHARE_KILL_BRICKS=$$UCM_GLUSTER_BRICK_DIRS UCM_SHARE_MANY_INSTANCES=8 \
	UCM_SHARE_MANY_KILLS=$(1) UCM_SHARE_MANY_BLOCKS=$(2) $(GO) test -count=1 -timeout $(3) $(BUILDFLAGS) \
	-run "^TestSharedManyKill$$|^TestSharedLeaseContention$$" -v ./fuzz/'
test-gluster-long:
	$(call gluster_many,200,240,30m)

# The mooncake tier (docs/mooncake.md) links Mooncake Store, which is neither a Debian package
# nor a Go module: tools/mooncake/build.sh builds it from ../shared/vendor into
# /var/cache/ucm-mooncake/<hash of the tarballs> (~15 min the first time on a machine, cached
# after; --install-deps installs its Debian build packages), and tools/mooncake/go.sh runs go
# with its cgo flags, the `mooncake` build tag and a workspace that adds Mooncake's Go binding.
# Plain `go build ./...` and the targets above need none of it.
MOONCAKE_GO := bash tools/mooncake/go.sh
mooncake:
	bash tools/mooncake/build.sh --install-deps

# The mooncake tier against real mooncake_master and client processes on loopback (two engine
# processes sharing the pool, client and master killed mid-transfer, master restart, pool-full
# eviction), in tools/mooncake/harness.sh, which leaves nothing running, also on failure.
test-mooncake: mooncake
	bash tools/mooncake/harness.sh $(MOONCAKE_GO) test -count=1 -timeout 20m -v ./fuzz/mooncake/
	bash tools/mooncake/harness.sh $(MOONCAKE_GO) test -race -count=1 -timeout 10m -run Mooncake ./tiers/ ./engine/

# ucm-lab bench on a memory | mooncake | ssd chain against a master the harness starts, with
# the pool's own put/get rate measured in the same run (docs/mooncake.md). The stores go to a
# fresh directory under MOONCAKE_BENCH_TMPDIR (a real disk: the ssd tier; about 2.2 GB with the
# default sizes), removed when the bench ends, also on failure or interrupt. Keep it off tmpfs
# (docs/mooncake.md, Figures: on these VMs tmpfs pages cost a first touch each).
MOONCAKE_BENCH ?= --total 1GiB --block-size 2MiB --shards 32
MOONCAKE_BENCH_TMPDIR ?= /var/tmp
bench-mooncake: mooncake
	$(MOONCAKE_GO) build -o $(BIN)/ucm-lab-mooncake ./lab/cmd/ucm-lab
	@set -e; dir=$$(mktemp -d $(MOONCAKE_BENCH_TMPDIR)/ucm-mooncake-bench.XXXXXX); \
	trap 'rm -rf "$$dir"' EXIT; trap 'exit 130' INT; trap 'exit 143' TERM; \
	echo "bench-mooncake: stores in $$dir (removed at the end)"; \
	bash tools/mooncake/harness.sh --master $(BIN)/ucm-lab-mooncake bench --workload mooncake --dir "$$dir/store" $(MOONCAKE_BENCH)

lint: vet staticcheck lint-history
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

# No issue numbers, work periods or dated diary headings in any tracked file (tools/lint-history.sh
# says what it flags and what it leaves alone); the self-test plants offences and legitimate lines.
lint-history:
	@bash tools/lint-history.sh --self-test
	@bash tools/lint-history.sh

vet:
	$(GO) vet ./...
	$(GO) vet -tags '$(TAGS)' ./...
	GOOS=darwin $(GO) build ./...
	GOOS=darwin $(GO) vet ./...

$(BIN)/staticcheck:
	GOBIN=$(BIN) $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)

staticcheck: $(BIN)/staticcheck
	$(BIN)/staticcheck ./...
	$(BIN)/staticcheck -tags '$(TAGS)' ./...

# Every fuzz target, as package:FuzzName:smoke-count. Plain `go test` replays their seed corpora
# (testdata/fuzz); `make fuzz` explores each for FUZZTIME, `make fuzz-smoke` (part of `make test`)
# runs each for its smoke count of executions (about 10 s each on the development machine),
# built with the Makefile's tags (so FuzzMatchesHashCRC32 compares ISA-L's CRC32C with Go's).
# The smoke budget is a count, not a duration, because Go 1.26's fuzz coordinator can report a
# spurious "context deadline exceeded" failure when a -fuzztime duration expires mid-exec
# (golang/go#75804, fixed in Go 1.27); a count never arms that deadline. FUZZSMOKE=10s (or
# FUZZSMOKE=1000x) overrides every target's count.
FUZZ_TARGETS := ./format:FuzzDecodeRecordHeader:300000x ./format:FuzzDecodeFooter:500000x \
                ./format:FuzzRecordRoundTrip:400000x ./format:FuzzDecodeCompressedRecordHeader:400000x \
                ./format:FuzzDecodeManifest:300000x ./format:FuzzDecodeSummary:300000x ./format:FuzzDecodeLease:300000x ./format:FuzzDecodePublogEntry:300000x \
                ./format:FuzzDecodeBatchHeader:300000x ./format:FuzzPeekBatchHeader:300000x ./format:FuzzDecodeBatchCommit:300000x \
                ./index:FuzzDecodeLocation:50000x ./index:FuzzDecodeSegmentMeta:100000x \
                ./wal:FuzzScanSegment:5000x ./kernels:FuzzDecodeSidecar:300000x \
                ./connector/ucmhash:FuzzHasher:40000x ./connector/ucmconfig:FuzzParseConfig:50000x ./engine:FuzzOptionsValidate:80000x \
                ./fuzz:FuzzEngineOps:800x ./kernels:FuzzRegister:300000x ./lab/model:FuzzLoadWeights:200000x \
                ./tiers:FuzzDecodeMooncakeHeader:100000x ./connector/capi:FuzzABI:50000x ./connector/capi:FuzzSelectorABI:50000x ./sparse:FuzzSparseConfig:50000x ./sparse:FuzzSelectTopK:100000x ./sparse:FuzzScorePart:100000x ./sparse:FuzzBlendInputs:100000x \
                ./internal/crc32c:FuzzMatchesHashCRC32:300000x
FUZZSMOKE   ?= per-target

fuzz:
	@$(MAKE) --no-print-directory fuzz-run FUZZ_FOR=$(FUZZTIME)

fuzz-smoke:
	@$(MAKE) --no-print-directory fuzz-run FUZZ_FOR=$(FUZZSMOKE)

fuzz-run:
	@for t in $(FUZZ_TARGETS); do \
		pkg=$${t%%:*}; rest=$${t#*:}; fn=$${rest%%:*}; budget=$(FUZZ_FOR); \
		if [ "$$budget" = per-target ]; then budget=$${rest##*:}; fi; \
		echo "== $$fn ($$pkg, $$budget)"; \
		$(GO) test $(BUILDFLAGS) -run '^$$' -fuzz "^$$fn$$" -fuzztime $$budget -fuzzminimizetime 2s $$pkg || exit 1; \
	done

# The kill -9 loop on the real disk: the io_uring + O_DIRECT build, then the psync build (which
# a SIGKILL can tear mid-write). 200 cycles each; make test runs 20 under the race detector.
CRASHCYCLES ?= 200
crashtest:
	UCM_KILL_CYCLES=$(CRASHCYCLES) $(GO) test -count=1 -timeout 60m $(BUILDFLAGS) -run '^TestKillLoop$$' -v ./fuzz/
	UCM_KILL_MODE=psync UCM_KILL_CYCLES=$(CRASHCYCLES) $(GO) test -count=1 -timeout 60m -run '^TestKillLoop$$' -v ./fuzz/
	UCM_KILL_MODE=tiered UCM_KILL_CYCLES=$(CRASHCYCLES) $(GO) test -count=1 -timeout 60m $(BUILDFLAGS) -run '^TestKillLoop$$' -v ./fuzz/

# The longer campaign: the kill -9 loop in every mode of UCM_KILL_MODE (fuzz/killloop_test.go:
# flat, tiered, shared, memory, interval sync, psync, compaction, segment recycling),
# LONGCYCLES cycles each (8 x 125 = 1,000 kills by default), psync on the build without the
# uring tag and the others with it, one after the other. Each mode's run asserts its feature was
# exercised and ends with a kill-summary line; the target prints them as one table with a total
# row, and on a failure the tail of that mode's log. Not part of make test (it takes tens of
# minutes); LONGLOG keeps the logs (default: a temporary directory removed at the end).
LONGCYCLES ?= 125
KILL_MODES ?= flat tiered shared memory interval psync compaction recycling
LONGLOG ?=
crashtest-long:
	@set -e; tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; logs=$${LONGLOG:-$$tmp}; mkdir -p "$$logs"; \
	$(GO) test -c -o $$tmp/fuzz.test $(BUILDFLAGS) ./fuzz/; \
	$(GO) test -c -o $$tmp/fuzz-psync.test ./fuzz/; \
	$(GO) build -o $$tmp/ucm-tool $(BUILDFLAGS) ./tools/ucm-tool; \
	$(GO) build -o $$tmp/ucm-tool-psync ./tools/ucm-tool; \
	for m in $(KILL_MODES); do \
		bin=$$tmp/fuzz.test; tool=$$tmp/ucm-tool; \
		if [ $$m = psync ]; then bin=$$tmp/fuzz-psync.test; tool=$$tmp/ucm-tool-psync; fi; \
		echo "== kill loop, mode $$m: $(LONGCYCLES) cycles ($$logs/$$m.log)"; \
		if ! UCM_KILL_MODE=$$m UCM_KILL_CYCLES=$(LONGCYCLES) UCM_KILL_TOOL=$$tool $$bin \
			-test.run '^TestKillLoop$$' -test.count=1 -test.timeout 180m -test.v > $$logs/$$m.log 2>&1; then \
			tail -n 60 $$logs/$$m.log; grep -h 'kill-summary' $$logs/$$m.log || true; echo "crashtest-long: mode $$m FAILED"; exit 1; \
		fi; \
		grep -h 'kill-summary' $$logs/$$m.log; \
	done; \
	echo; echo "crashtest-long: $(LONGCYCLES) cycles a mode, $$(date -u '+%Y-%m-%d %H:%M UTC')"; \
	for m in $(KILL_MODES); do grep -h kill-summary $$logs/$$m.log; done | awk -f tools/killsummary.awk

clean:
	rm -rf $(BIN) ./ucm-data
