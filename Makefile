# make test: everything CI runs. It installs what the tests need when it is
# missing (redis-server and friends from Debian, the Node client from npm).
GO ?= go
# A count, not a duration: with a duration, Go before 1.27 can fail the run
# with "context deadline exceeded" at the boundary on a loaded machine,
# having found nothing (golang/go#75804). 300000 runs: ~20 s here.
FUZZTIME ?= 300000x

.PHONY: test deps build bench fuzz redis-suite

build:
	$(GO) build -o hotkeyproxy .

# What the tests run: redis-server, redis-cli, redis-benchmark (Debian
# redis-server, redis-tools), /usr/bin/python3 with redis (python3-redis),
# script (util-linux), node and npm for ioredis and node-redis. Installing
# needs root.
deps:
	@for c in redis-server redis-cli redis-benchmark script node npm; do command -v $$c >/dev/null || missing=1; done; \
	/usr/bin/python3 -c 'import redis' 2>/dev/null || missing=1; \
	[ -z "$$missing" ] || { echo "installing redis-server redis-tools python3-redis util-linux nodejs npm (Debian)"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server redis-tools python3-redis util-linux \
		$$(command -v npm >/dev/null || echo nodejs npm) >/dev/null; }
	@[ -f e2e/clients/node/node_modules/@redis/client/package.json ] || npm ci --silent --prefix e2e/clients/node

test: deps
	$(GO) vet ./...
	$(GO) test -race -timeout 20m ./...
	$(GO) test -run '^$$' -fuzz FuzzCommandReader -fuzztime $(FUZZTIME) ./internal/resp/

fuzz:
	$(GO) test -run '^$$' -fuzz FuzzCommandReader -fuzztime 5m ./internal/resp/

bench: deps
	@command -v nutcracker >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nutcracker >/dev/null; }
	./bench/passthrough.sh

# Redis 7.0's own Tcl suite through the proxy (not in CI: 15 to 25 minutes, more
# with DIRECT=1, which runs each unit against Redis directly too). SRC is a
# Redis 7.0 source tree with its binaries; see bench/redis_suite.sh.
redis-suite:
	@[ -n "$(SRC)" ] || { echo 'usage: make redis-suite SRC=path/to/redis [DIRECT=1] [UNITS="unit/type/list ..."]'; exit 2; }
	DIRECT=$(DIRECT) ./bench/redis_suite.sh $(SRC) $(UNITS)
