# `make test` and `make demo` each bootstrap .venv on first use (and rebuild the C core when
# csrc/ changes); nothing else needs to be installed first.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
SOURCES := pyproject.toml setup.py engine/_build.py $(wildcard csrc/*.c csrc/*.h)
# The sanitized core is installed apart with a copy of the package: a change to it reinstalls.
PACKAGE := $(shell find engine -name '*.py' -o -name '*.lua' -o -name '*.pyi')

.PHONY: test demo bench bench-peers lint test-sanitize tools clean

# A second venv whose C core is built with AddressSanitizer and UndefinedBehaviorSanitizer. The
# interpreter is not instrumented, so the ASan runtime is preloaded and leak checking (which
# would report CPython's own arenas) is off; UBSan stops at the first report.
SAN_VENV := .venv-san
SAN_PY := $(SAN_VENV)/bin/python
SAN_STAMP := $(SAN_VENV)/.installed
SAN_ENV := LD_PRELOAD="$$(gcc -print-file-name=libasan.so) $$(gcc -print-file-name=libubsan.so)" \
	ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1

$(STAMP): $(SOURCES)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test,bench]'
	touch $@

lint: $(STAMP)
	$(VENV)/bin/ruff check engine bench tests
	$(VENV)/bin/mypy engine

# Debian packages the tests run: spin model-checks the floor protocol (tests/test_model.py),
# redis-server (>= 7) serves the Redis backend's tests (they start their own on a unix socket),
# redis-sentinel their failover tests, chromium-headless-shell the browser renders (lanes pool
# --browser's default), chromium the dashboard's tests and the shell's fidelity test, curl and
# wget are the renders of the pool's end-to-end tests, openssl makes the TLS test's CA, iproute2
# (`ip`) the network namespaces of the partition tests (tests/lib/netns.py; they run as root, as
# CI does), wrk the load of bench_store's smoke run (tests/test_bench_smoke.py); nginx (in
# /usr/sbin, not always on PATH) and node with npm run tests/e2e/test_loop.py, whose Express
# app's packages (prerender-node, pinned by its package-lock.json) npm installs in
# tests/e2e/node/node_modules. Each command is named with its package where they differ.
# Whatever is missing is installed (root, apt and the npm registry reachable); when that fails
# the tests that need it fail and say so.
E2E_NODE := tests/e2e/node
tools:
	@pkgs=""; for t in spin redis-server redis-sentinel chromium chromium-headless-shell curl wget \
		openssl nginx node:nodejs npm ip:iproute2 wrk; do \
		PATH="$$PATH:/usr/sbin" command -v $${t%%:*} >/dev/null || pkgs="$$pkgs $${t#*:}"; done; \
	[ -z "$$pkgs" ] && exit 0; \
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q $$pkgs >/dev/null 2>&1 || \
		(apt-get update -q >/dev/null 2>&1 && \
		 DEBIAN_FRONTEND=noninteractive apt-get install -y -q $$pkgs >/dev/null 2>&1) || \
		echo "warning: could not install$$pkgs; the tests that need them will fail"
	@test -d $(E2E_NODE)/node_modules || (cd $(E2E_NODE) && npm ci --no-audit --no-fund -q) || \
		echo "warning: npm could not install $(E2E_NODE)'s packages; tests/e2e will fail"

test: lint tools
	$(VENV)/bin/pytest -q -m "not slow"

# The long forms of the stress runs (marked slow): minutes each.
test-slow: $(STAMP) tools
	$(VENV)/bin/pytest -q -m slow

# The demo's loop renders in Chromium's headless shell: installed when missing (root, apt
# reachable); without it the loop is skipped and says why.
demo: $(STAMP)
	@PATH="$$PATH:/usr/sbin" command -v chromium-headless-shell >/dev/null || \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium-headless-shell \
		>/dev/null 2>&1 || echo "demo: could not install chromium-headless-shell"
	$(VENV)/bin/lanes demo

# The peers the benchmark compares against are Debian's redis-server and postgresql; install
# whichever is missing when we can (root, apt reachable). When that fails the benchmark skips
# the peer and prints why; it never fakes a figure.
bench-peers:
	@pkgs=""; command -v redis-server >/dev/null || pkgs="redis-server"; \
	ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || pkgs="$$pkgs postgresql"; \
	[ -z "$$pkgs" ] && exit 0; \
	[ "$$(id -u)" = 0 ] || { echo "bench: not root, not installing $$pkgs"; exit 0; }; \
	echo "bench: installing $$pkgs"; \
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q $$pkgs >/dev/null 2>&1 || \
		(apt-get update -q >/dev/null 2>&1 && \
		 DEBIAN_FRONTEND=noninteractive apt-get install -y -q $$pkgs >/dev/null 2>&1) || \
		echo "bench: could not install $$pkgs; those peers will be skipped"

bench: $(STAMP) bench-peers
	$(PY) bench/run_all.py

$(SAN_STAMP): $(SOURCES) $(PACKAGE) Makefile
	test -x $(SAN_PY) || $(PYTHON) -m venv $(SAN_VENV)
	$(SAN_PY) -m pip install -q --upgrade pip setuptools wheel cffi
	rm -rf $(SAN_VENV)/src $(SAN_VENV)/core && mkdir -p $(SAN_VENV)/src
	cp -r pyproject.toml setup.py README.md engine csrc $(SAN_VENV)/src/
	rm -rf $(SAN_VENV)/src/engine/_core*.so $(SAN_VENV)/src/engine/_hot*.so $(SAN_VENV)/src/engine/_core.c
	cd $(SAN_VENV)/src && RL_SANITIZE=address,undefined ../bin/python -m pip install -q \
		--no-build-isolation --target ../core --no-deps .
	$(SAN_PY) -m pip install -q numpy psutil pytest hypothesis defusedxml rich prometheus_client redis \
		matplotlib aiohttp jinja2 crawler-user-agents w3lib
	touch $@

# The suites that drive the C core, against the sanitized core (installed apart, put first on
# the path): the contract on shared memory, its mechanics, the stateful machines, the kill chaos
# and the pool's own tests. Left out: what never reaches the C core (the Redis backend, the
# store, the server, the dashboard, the browser's renders), the model check (spin's verifier is
# not instrumented) and the benchmark smoke test (it builds its own module).
SAN_TESTS = tests/contract tests/shm tests/chaos tests/test_stateful.py tests/test_backends_agree.py \
	tests/pool/test_pool.py tests/pool/test_pool_failures.py tests/pool/test_pool_files.py \
	tests/pool/test_cli.py tests/pool/test_real_site.py
test-sanitize: $(SAN_STAMP) tools
	nm -D $(SAN_VENV)/core/engine/_core*.so | grep -q __ubsan_handle  # really instrumented
	$(SAN_ENV) PYTHONPATH=$(SAN_VENV)/core $(SAN_VENV)/bin/pytest -q -p no:cacheprovider \
		-m "not slow" -k "not redis" $(SAN_TESTS)

clean:
	rm -rf $(VENV) $(SAN_VENV) build *.egg-info engine/_core*.so engine/_hot*.so engine/_core.c
