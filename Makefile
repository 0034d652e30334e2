# make test: everything CI runs. It installs what the tests need when it is
# missing (redis-server and friends from Debian, the Node client from npm).
GO ?= go
FUZZTIME ?= 20s

.PHONY: test deps build bench fuzz

build:
	$(GO) build -o hotkeyproxy .

deps:
	@command -v redis-server >/dev/null && command -v nutcracker >/dev/null && /usr/bin/python3 -c 'import redis' 2>/dev/null || { \
		echo "installing redis-server, redis-tools, python3-redis, nutcracker (Debian)"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server redis-tools python3-redis nutcracker >/dev/null; }
	@[ ! -f e2e/clients/node/package-lock.json ] || [ -d e2e/clients/node/node_modules ] || npm ci --silent --prefix e2e/clients/node

test: deps
	$(GO) vet ./...
	$(GO) test -race -timeout 20m ./...
	$(GO) test -run '^$$' -fuzz FuzzCommandReader -fuzztime $(FUZZTIME) ./resp/

fuzz:
	$(GO) test -run '^$$' -fuzz FuzzCommandReader -fuzztime 5m ./resp/

bench: deps build
	./bench/passthrough.sh
