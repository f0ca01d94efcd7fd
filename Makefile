# make test: what CI runs (.ci/run). The tests talk to the real PostgreSQL,
# RabbitMQ and Redis on this machine; .ci/run checks and starts them first.
GO ?= go
GOTESTFLAGS ?= -race -timeout 20m

.PHONY: test vet unit bench example fmt

# After the -race run, the breaker's outage simulation runs again at full
# scale (1,000 msgs/s for 10 minutes of virtual time); under -race it runs at
# 100 msgs/s.
test: vet
	$(GO) test $(GOTESTFLAGS) ./...
	$(GO) test -count=1 -run '^TestOutage' ./consumer/

vet:
	@unformatted="$$(gofmt -l $$(git ls-files '*.go'))"; if [ -n "$$unformatted" ]; then echo "gofmt needed:"; echo "$$unformatted"; exit 1; fi
	$(GO) vet ./...
	cd bench && $(GO) vet ./...

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
