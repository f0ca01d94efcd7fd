# make test: what CI runs (.ci/run). The tests talk to the real PostgreSQL,
# RabbitMQ and Redis on this machine; .ci/run checks and starts them first.
# -count=1: a cached pass would hide a test that can no longer reach its
# service, or one that fails only on a busy machine.
GO ?= go
GOTESTFLAGS ?= -race -count=1 -timeout 20m
FUZZTIME ?= 2m
FUZZFLAGS ?= -parallel 1

.PHONY: test vet unit bench example fmt fuzz sqs-emulator

# After the -race run, the breaker's outage simulation runs again at full
# scale (1,000 msgs/s for 10 minutes of virtual time); under -race it runs at
# 100 msgs/s.
test: vet sqs-emulator
	$(GO) test $(GOTESTFLAGS) ./...
	$(GO) test -count=1 -run '^TestOutage' ./consumer/

vet:
	@unformatted="$$(gofmt -l $$(git ls-files '*.go'))"; if [ -n "$$unformatted" ]; then echo "gofmt needed:"; echo "$$unformatted"; exit 1; fi
	$(GO) vet ./...
	cd bench && $(GO) vet ./...

# Every fuzz target of the module, one after another, FUZZTIME each
# (make fuzz FUZZTIME=10m). The targets are found with go test -list, so a
# new one is picked up; make test runs them over their seed corpora
# (testdata/fuzz) as ordinary tests. A target that fails does not stop the
# others; the run fails at the end, naming them. A crasher is written to the
# package's testdata/fuzz: fix the bug and keep it as a regression seed.
fuzz:
	@list="$$($(GO) test -list '^Fuzz' ./...)" || { echo "$$list"; exit 1; }; \
	echo "$$list" | awk '/^Fuzz/ { names = names " " $$1; next } /^(ok|\?)/ { if (names != "") print $$2 names; names = "" }' | \
	{ failed=""; \
	  while read -r pkg targets; do \
	    for t in $$targets; do \
	      echo "== $$t ($$pkg, $(FUZZTIME))"; \
	      $(GO) test -run '^$$' -fuzz "^$$t\$$" -fuzztime $(FUZZTIME) $(FUZZFLAGS) "$$pkg" || failed="$$failed $$pkg.$$t"; \
	    done; \
	  done; \
	  if [ -n "$$failed" ]; then echo "fuzz: failed:$$failed"; exit 1; fi; }

# The SQS adapter's and the ackwise CLI's tests start local-aws-sqs (a Node program pinned in
# adapters/sqs/testdata/emulator); this installs it (npm ci) when missing.
sqs-emulator:
	@bash adapters/sqs/testdata/emulator/ensure.sh

# The offline unit run: no services needed.
unit:
	$(GO) test -short ./...

example:
	$(GO) run ./examples/checkout

# Side-by-side benchmarks (docs/BENCHMARKS.md says how each was run).
bench:
	$(GO) test -run '^$$' -bench . -benchmem -count 5 ./consumer/
	cd bench && $(GO) test -run '^$$' -bench . -benchmem -count 5 ./...

fmt:
	gofmt -w $$(git ls-files '*.go')
