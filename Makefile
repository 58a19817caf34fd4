# UCM-Go. Two commands set everything up on a fresh machine with Go, gcc and git:
#   make run    the main job: the seq benchmark on an embedded default store under ./ucm-data
#   make test   the whole test suite (lint, race detector, both I/O backends)

GO          ?= go
# The io_uring backend (github.com/iceber/iouring-go) links into syscall internals:
# Go >= 1.23 needs -checklinkname=0. It is behind the `uring` build tag so that plain
# `go build ./...` works for anyone embedding the engine; everything here builds with it.
TAGS        ?= uring
LDFLAGS     ?= -checklinkname=0
BUILDFLAGS  := -tags '$(TAGS)' -ldflags '$(LDFLAGS)'
STATICCHECK_VERSION := v0.8.2
BIN         := $(CURDIR)/bin
FUZZTIME    ?= 60s

.PHONY: all build run test lint vet staticcheck unit fuzz clean

all: build

build:
	$(GO) build $(BUILDFLAGS) -o $(BIN)/ucm-tool ./tools/ucm-tool

run: build
	$(BIN)/ucm-tool bench --dir ./ucm-data --workload seq --block-size 2MiB --shards 32 --total 2GiB

test: lint unit

unit:
	$(GO) test -race -count=1 -timeout 20m $(BUILDFLAGS) ./...

lint: vet staticcheck
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

vet:
	$(GO) vet ./...
	$(GO) vet -tags '$(TAGS)' ./...

$(BIN)/staticcheck:
	GOBIN=$(BIN) $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)

staticcheck: $(BIN)/staticcheck
	$(BIN)/staticcheck ./...
	$(BIN)/staticcheck -tags '$(TAGS)' ./...

# Long fuzzing runs: each target for FUZZTIME (default 60s).
fuzz:
	@for pkg_fuzz in ./format:FuzzDecodeRecordHeader ./format:FuzzDecodeFooter \
	                 ./index:FuzzDecodeLocation ./index:FuzzDecodeSegmentMeta; do \
		pkg=$${pkg_fuzz%%:*}; fn=$${pkg_fuzz##*:}; \
		echo "== $$fn ($$pkg, $(FUZZTIME))"; \
		$(GO) test -run '^$$' -fuzz "^$$fn$$" -fuzztime $(FUZZTIME) $$pkg || exit 1; \
	done

clean:
	rm -rf $(BIN) ./ucm-data
