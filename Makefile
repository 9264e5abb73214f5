# sasflow build / test entry points. Every target creates what it needs on a fresh machine.
#
#   make venv         .venv      (Python 3.11) with requirements-dev.txt
#   make sam-venv     .venv-sam  (Python 3.12, the Lambda runtime) with aws-sam-cli + cfn-lint
#   make checkov-venv .venv-checkov (Python 3.11) with checkov
#   make docs-venv    .venv-docs (Python 3.11) with mkdocs-material
#   make docs         the manual in docs/ as a site (mkdocs build --strict, offline) -> site/
#   make security     checkov on template.yaml, cfn-lint's serverless rules, bandit on layers/ + functions/ (offline;
#                     0 unsuppressed findings, and it prints every suppression with its reason)
#   make test         lint, typecheck, cfn-lint, sam-validate, security, docs, pytest, mutants-fast (all run; fails on any)
#   make browser      Debian's chromium (apt, when missing) for tests/browser; make screenshots redraws the docs' PNGs
#   make check        the edit-test loop (~80 s): lint, typecheck, tests/unit + tests/integration
#   make template     render the agents' parts of template.yaml from agents.yaml (build, run and up do it first)
#   make build        sam build (no container) -> .aws-sam/build
#   make run | up     the local stack (python -m devstack run | up); pass extra args with ARGS="..."
#   make load         1,000 trip bookings under faults on the local stack, checked (python -m devstack load)
#   make burst        500 trip bookings at once against the hotels service limited as agents.yaml says, checked
#   make map          one workflow with a map step of 10,000 children on the local stack, checked
#   make fuzz         schemathesis against the local API's /openapi.json, >= 2,000 cases (tools/fuzz.py)
#   make sim          deterministic fault-injection simulation, >= 10,000 workflows (python -m simulation)
#   make bench        cost per step vs Step Functions, requests vs the minimum, sweep, throughput, cold start
#   make mutants      break each core rule in turn (tools/mutations.toml); the tests must catch every one
#   make lock         refresh tools/constraints-*.txt (transitive pins) after changing a requirement
#   make clean        remove build output, caches and local-stack logs (make distclean also removes the venvs)

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help
MAKEFLAGS += --no-print-directory

ROOT := $(CURDIR)

# --------------------------------------------------------------------------------------------- interpreters
# Dev venv: Python 3.11 (the machine's default python3).
ifndef PYTHON311
PYTHON311 := $(shell for p in python3.11 python3; do \
	  if $$p -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' >/dev/null 2>&1; then \
	    $$p -c 'import sys; print(sys.executable)'; break; fi; \
	done)
endif
# SAM venv: Python 3.12 = the Lambda runtime (pyenv's 3.12.1 if present, else a working python3.12 on PATH;
# a pyenv shim that is not activated does not count).
ifndef PYTHON312
PYTHON312 := $(shell for p in $${PYENV_ROOT:-$$HOME/.pyenv}/versions/3.12.*/bin/python python3.12; do \
	  if $$p -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' >/dev/null 2>&1; then \
	    $$p -c 'import sys; print(sys.executable)'; break; fi; \
	done)
endif
export PYTHON311 PYTHON312

VENV      := .venv
PY        := $(VENV)/bin/python
VENV_OK   := $(VENV)/.requirements.stamp
SAM_VENV  := .venv-sam
SAM       := $(SAM_VENV)/bin/sam
SAM_OK    := $(SAM_VENV)/.requirements.stamp
PIPQ      := tools/pipq

DEV_REQS  := requirements-dev.txt layers/sasflow/requirements.txt tools/constraints-dev.txt
SAM_REQS  := tools/requirements-sam.txt tools/constraints-sam.txt
CHECKOV_VENV := .venv-checkov
CHECKOV      := $(CHECKOV_VENV)/bin/checkov
CHECKOV_OK   := $(CHECKOV_VENV)/.requirements.stamp
CHECKOV_REQS := tools/requirements-checkov.txt tools/constraints-checkov.txt
DOCS_VENV := .venv-docs
MKDOCS    := $(DOCS_VENV)/bin/mkdocs
DOCS_OK   := $(DOCS_VENV)/.requirements.stamp
DOCS_REQS := tools/requirements-docs.txt tools/constraints-docs.txt

# Imports exactly as on Lambda: `sasflow` from the layer (/opt/python), devstack/tests from the repo root.
APP_PYTHONPATH := $(ROOT)/layers/sasflow:$(ROOT)

# SAM CLI offline: no telemetry, a region, fake credentials (never a real account), no instance-metadata probe.
SAM_ENV := env -u AWS_PROFILE -u AWS_DEFAULT_PROFILE -u AWS_ENDPOINT_URL \
	SAM_CLI_TELEMETRY=0 \
	AWS_DEFAULT_REGION=us-east-1 AWS_REGION=us-east-1 \
	AWS_ACCESS_KEY_ID=testing AWS_SECRET_ACCESS_KEY=testing AWS_SESSION_TOKEN=testing \
	AWS_EC2_METADATA_DISABLED=true

# Wall-clock budget of the whole pytest run (seconds): about 4x its quiet time (621 s on 2 cores on a fresh clone,
# 2026-12-05; a run sharing the cores with a make sim and a make up took over 1200 s on 2026-12-06), so a busy
# machine slows the gate without failing it. CI allows 90 minutes in all.
PYTEST_TIMEOUT ?= 2400
# pytest-xdist workers; --dist loadfile keeps each file (and its module-scoped fixtures: a local stack, the
# simulation's moto reports) on one worker. The system tests mostly wait on pollers, so 2 workers on 2 cores cut
# the run from about 8.5 to about 5 minutes. PYTEST_JOBS=0 runs in one process.
PYTEST_JOBS ?= 2
PYTEST_ARGS ?=
ARGS ?=

.PHONY: help venv sam-venv checkov-venv docs-venv docs lint fmt typecheck cfn-lint sam-validate pytest test check build run up \
	browser screenshots \
	map lock lock-dev lock-sam lock-checkov lock-docs clean distclean

help:
	@awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' Makefile

# --------------------------------------------------------------------------------------------- venvs
venv: $(VENV_OK)

$(VENV_OK): $(DEV_REQS) cli/pyproject.toml
	@if [ -z "$(PYTHON311)" ]; then echo "error: no Python 3.11 found (python3.11 / python3)" >&2; exit 1; fi
	@if [ -x $(PY) ] && ! $(PY) -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null; then \
		echo "$(VENV) is not Python 3.11: recreating it"; rm -rf $(VENV); fi
	@if [ ! -x $(PY) ]; then echo "creating $(VENV) with $(PYTHON311)"; $(PYTHON311) -m venv $(VENV); fi
	@echo "installing requirements-dev.txt into $(VENV)"
	@$(PIPQ) $(PY) -m pip install --quiet --disable-pip-version-check \
		-r requirements-dev.txt -c tools/constraints-dev.txt
	@echo "installing the sasflow CLI (cli/, editable; its dependencies are pinned above)"
	@$(PIPQ) $(PY) -m pip install --quiet --disable-pip-version-check --no-deps -e cli
	@touch $@

sam-venv: $(SAM_OK)

$(SAM_OK): $(SAM_REQS)
	@if [ -z "$(PYTHON312)" ]; then echo "error: no Python 3.12 found (pyenv: $$PYENV_ROOT/versions/3.12.*, or python3.12 on PATH)" >&2; exit 1; fi
	@if [ -x $(SAM_VENV)/bin/python ] && ! $(SAM_VENV)/bin/python -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' 2>/dev/null; then \
		echo "$(SAM_VENV) is not Python 3.12: recreating it"; rm -rf $(SAM_VENV); fi
	@if [ ! -x $(SAM_VENV)/bin/python ]; then echo "creating $(SAM_VENV) with $(PYTHON312)"; $(PYTHON312) -m venv $(SAM_VENV); fi
	@echo "installing tools/requirements-sam.txt into $(SAM_VENV)"
	@$(PIPQ) $(SAM_VENV)/bin/python -m pip install --quiet --disable-pip-version-check \
		-r tools/requirements-sam.txt -c tools/constraints-sam.txt
	@touch $@

# checkov alone: it pins an old boto3/botocore, networkx 2 and packaging 23 (tools/requirements-checkov.txt). The '*'
# in its own .gitignore (what Python 3.13's venv writes) keeps it out of git status and out of ruff's scan.
checkov-venv: $(CHECKOV_OK)

$(CHECKOV_OK): $(CHECKOV_REQS)
	@if [ -z "$(PYTHON311)" ]; then echo "error: no Python 3.11 found (python3.11 / python3)" >&2; exit 1; fi
	@if [ -x $(CHECKOV_VENV)/bin/python ] && ! $(CHECKOV_VENV)/bin/python -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null; then \
		echo "$(CHECKOV_VENV) is not Python 3.11: recreating it"; rm -rf $(CHECKOV_VENV); fi
	@if [ ! -x $(CHECKOV_VENV)/bin/python ]; then echo "creating $(CHECKOV_VENV) with $(PYTHON311)"; $(PYTHON311) -m venv $(CHECKOV_VENV); fi
	@echo '*' >$(CHECKOV_VENV)/.gitignore
	@echo "installing tools/requirements-checkov.txt into $(CHECKOV_VENV)"
	@$(PIPQ) $(CHECKOV_VENV)/bin/python -m pip install --quiet --disable-pip-version-check \
		-r tools/requirements-checkov.txt -c tools/constraints-checkov.txt
	@touch $@

# mkdocs-material alone, for the manual (docs/, mkdocs.yml); never in .venv. The '*' in its own .gitignore keeps it
# out of git status and out of ruff's scan, as for checkov.
docs-venv: $(DOCS_OK)

$(DOCS_OK): $(DOCS_REQS)
	@if [ -z "$(PYTHON311)" ]; then echo "error: no Python 3.11 found (python3.11 / python3)" >&2; exit 1; fi
	@if [ -x $(DOCS_VENV)/bin/python ] && ! $(DOCS_VENV)/bin/python -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null; then \
		echo "$(DOCS_VENV) is not Python 3.11: recreating it"; rm -rf $(DOCS_VENV); fi
	@if [ ! -x $(DOCS_VENV)/bin/python ]; then echo "creating $(DOCS_VENV) with $(PYTHON311)"; $(PYTHON311) -m venv $(DOCS_VENV); fi
	@echo '*' >$(DOCS_VENV)/.gitignore
	@echo "installing tools/requirements-docs.txt into $(DOCS_VENV)"
	@$(PIPQ) $(DOCS_VENV)/bin/python -m pip install --quiet --disable-pip-version-check \
		-r tools/requirements-docs.txt -c tools/constraints-docs.txt
	@touch $@

# --------------------------------------------------------------------------------------------- checks
lint: venv
	$(VENV)/bin/ruff check --output-format=concise .
	$(VENV)/bin/ruff format --check .

fmt: venv
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

typecheck: venv
	$(VENV)/bin/mypy

cfn-lint: venv
	$(VENV)/bin/cfn-lint template.yaml

sam-validate: sam-venv
	$(SAM_ENV) $(SAM) validate --lint --template-file template.yaml --region us-east-1

# Exit 5 (no tests collected) is a failure: an empty run means collection is broken. ALLOW_NO_TESTS=1 permits it.
pytest: venv
	@rc=0; timeout --kill-after=30 $(PYTEST_TIMEOUT) $(PY) -m pytest -n $(PYTEST_JOBS) --dist loadfile $(PYTEST_ARGS) \
		|| rc=$$?; \
	if [ $$rc -eq 124 ] || [ $$rc -eq 137 ]; then echo "pytest exceeded PYTEST_TIMEOUT=$(PYTEST_TIMEOUT)s" >&2; fi; \
	if [ $$rc -eq 5 ] && [ "$${ALLOW_NO_TESTS:-0}" = 1 ]; then echo "pytest collected no tests (allowed by ALLOW_NO_TESTS=1)"; rc=0; fi; \
	exit $$rc

# Debian's chromium for the console's browser tests (tests/browser; Playwright drives it, never a browser of its own
# download): installed with apt when missing (as root, or with sudo). SASFLOW_CHROMIUM names another chromium.
browser:
	@if [ -n "$${SASFLOW_CHROMIUM:-}" ]; then echo "chromium: $$SASFLOW_CHROMIUM (SASFLOW_CHROMIUM)"; \
	elif command -v chromium >/dev/null 2>&1; then echo "chromium: $$(chromium --version 2>/dev/null | head -1)"; \
	else echo "installing chromium with apt (the console's browser tests drive it headless)"; \
		if [ "$$(id -u)" = 0 ]; then sudo=""; else sudo="sudo"; fi; \
		$$sudo apt-get update -qq && $$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; fi

# The console's screenshots in the docs (docs/assets/console/*.png, 1280x800 and 390x844): the browser tests, run
# with SASFLOW_SCREENSHOTS pointing there.
screenshots: venv browser
	SASFLOW_SCREENSHOTS=docs/assets/console $(PY) -m pytest -q -p no:cacheprovider tests/browser

# Runs every check even when an earlier one fails, then fails if any did.
test: venv sam-venv checkov-venv docs-venv browser
	@failed=""; \
	for t in lint typecheck cfn-lint sam-validate security docs pytest mutants-fast; do \
		echo "==> make $$t"; \
		$(MAKE) $$t || failed="$$failed $$t"; \
	done; \
	if [ -n "$$failed" ]; then echo "make test FAILED:$$failed" >&2; exit 1; fi

# The edit-test loop, about 2 minutes on 2 cores: ruff, mypy, bandit (quick, and the gate's security step fails on
# it), then tests/unit and tests/integration (in process: moto, loopback servers; no local stack, no simulation, no
# template scanners). `make test` is the gate and runs everything.
CHECK_TIMEOUT ?= 300
check: venv sam-venv
	@$(MAKE) lint
	@$(MAKE) typecheck
	@$(MAKE) --no-print-directory security-bandit >/dev/null || { echo "bandit found something: make security-bandit" >&2; exit 1; }
	@timeout --kill-after=30 $(CHECK_TIMEOUT) $(PY) -m pytest -n $(PYTEST_JOBS) --dist loadfile -q tests/unit tests/integration

# The diagrams are drawn in the browser by mermaid, shipped with the site (never fetched from a CDN when a page is
# read): the theme uses a global mermaid when one is loaded. Its pinned release comes from the npm registry once, at
# build time (npm pack checks its integrity), into docs/assets/javascripts/ (ignored by git).
MERMAID_VERSION := 11.17.2
MERMAID_JS := docs/assets/javascripts/mermaid.min.js

# The manual (docs/*.md, mkdocs.yml) as a site in site/. --strict turns every warning into a failure: a link to a
# page or an anchor that does not exist, a page left out of the nav. Offline: the theme's web fonts are off
# (theme.font: false) and no plugin fetches anything; `timeout` is only the backstop. No --quiet: it drops the
# warnings before --strict counts them, so a broken link would pass. Its links, and that every CLI
# command and API route is named, are also checked without mkdocs (tests/unit/test_docs.py).
docs: docs-venv $(MERMAID_JS)
	NO_MKDOCS_2_WARNING=1 timeout --kill-after=10 120 $(MKDOCS) build --strict --site-dir site
	@grep -q '<pre class="mermaid">' site/concepts/index.html \
		|| { echo "docs: the concepts page's diagram is not a mermaid block" >&2; exit 1; }

$(MERMAID_JS):
	@mkdir -p $(@D) .devstack/npm
	cd .devstack/npm && npm pack --silent mermaid@$(MERMAID_VERSION) >/dev/null
	tar -xzf .devstack/npm/mermaid-$(MERMAID_VERSION).tgz -C .devstack/npm package/dist/mermaid.min.js
	cp .devstack/npm/package/dist/mermaid.min.js $@

# --------------------------------------------------------------------------------------------- security scanners
# Three scanners, all run even when one fails; a finding that is accepted is suppressed where it occurs, with its
# reason, and each run prints those reasons:
# - checkov on template.yaml (SAM resources included: it merges Globals into AWS::Serverless::* and has checks for
#   them; the run fails if it evaluated no AWS::Serverless::Function, e.g. a template it could not parse). Skips:
#   `Metadata: checkov: skip: [{id, comment}]` on the resource (the agents' resources: in devstack/agents.py).
# - cfn-lint with the serverless rules of cfn-lint-serverless (0.3.6 works with cfn-lint 1.58). Skips: `Metadata:
#   cfn-lint: config: ignore_checks` on the resource, the reason as a comment after each id.
# - bandit on layers/ and functions/. Skips: `# nosec BXXX # reason` on the line. The second '#' matters: bandit
#   reads every word between "nosec" and the next '#' as a test id or name (a reason saying "eval" would skip B307).
# Offline: no API key (BC_API_KEY unset, HOME pointed at the venv so no ~/.bridgecrew/credentials or ~/.checkov.yaml
# is read), --skip-download and BC_SKIP_MAPPING=TRUE (no guideline/severity download from the platform) and
# CKV_SKIP_PACKAGE_UPDATE_CHECK=true (no version check); strace shows no network connect with these. `timeout` is
# only the backstop.
# No pip-audit: it needs its advisory databases (the PyPI JSON API's vulnerability data, OSV), which these machines
# and CI cannot reach, so a scan here would check nothing.
# What is scanned (another template or more code only to try the scanners, e.g. on a copy with a finding).
SECURITY_TEMPLATE ?= template.yaml
SECURITY_CODE ?= layers functions
CHECKOV_ENV := env -u BC_API_KEY -u BC_API_URL -u PRISMA_API_URL HOME=$(ROOT)/$(CHECKOV_VENV) \
	BC_SKIP_MAPPING=TRUE CKV_SKIP_PACKAGE_UPDATE_CHECK=true CKV_PARSE_ERROR_FAIL=true

.PHONY: security security-checkov security-cfn-lint security-bandit
security: venv checkov-venv
	@failed=""; \
	for t in checkov cfn-lint bandit; do \
		echo "--> make security-$$t"; \
		$(MAKE) security-$$t || failed="$$failed security-$$t"; \
	done; \
	if [ -n "$$failed" ]; then echo "make security FAILED:$$failed" >&2; exit 1; fi

# checkov's CLI report without the passed checks: the summary, then every failed and skipped check (a skipped one
# with its "Suppress comment").
security-checkov: checkov-venv
	@out="$$(mktemp)"; trap 'rm -f "$$out"' EXIT; rc=0; \
	timeout --kill-after=10 300 $(CHECKOV_ENV) $(CHECKOV) --file $(SECURITY_TEMPLATE) --framework cloudformation \
		--skip-download --compact >"$$out" 2>&1 || rc=$$?; \
	awk 'function flush() { if (block !~ /\tPASSED for resource/) printf "%s", block; block = "" } \
		/ scan results:$$/ { on = 1 } !on { next } /^Check: / { flush() } { block = block $$0 "\n" } END { flush() }' "$$out"; \
	if [ $$rc -eq 124 ] || [ $$rc -eq 137 ]; then echo "checkov did not finish in 300 s (waiting for the network?)" >&2; fi; \
	if ! grep -q 'for resource: AWS::Serverless::Function\.' "$$out"; then \
		cat "$$out"; echo "checkov evaluated no AWS::Serverless::Function in $(SECURITY_TEMPLATE)" >&2; rc=1; fi; \
	exit $$rc

security-cfn-lint: venv
	$(VENV)/bin/cfn-lint --append-rules cfn_lint_serverless.rules -- $(SECURITY_TEMPLATE)
	@echo "cfn-lint serverless rules: no finding. Suppressed (resource: rule # reason):"
	@awk '/^  [A-Za-z0-9]+:$$/ { resource = $$1 } /^ +- [A-Z]+[0-9]+ # / { sub(/^ +- /, ""); print "  " resource " " $$0 }' \
		$(SECURITY_TEMPLATE)

# bandit applies a line's nosec to every node of a multi-line literal and warns "nosec encountered ..., but no failed
# test" for each clean one: those warnings are dropped, everything else it prints is kept (and its exit code).
security-bandit: venv
	$(VENV)/bin/bandit --quiet --recursive $(SECURITY_CODE) 2>&1 | { grep -v -e 'but no failed test on file' || true; }
	@echo "bandit: no finding. Suppressed (file:line: nosec test # reason):"
	@{ grep -rnE --include='*.py' '#[[:space:]]*nosec' $(SECURITY_CODE) || true; } \
		| sed -E 's/^([^:]+:[0-9]+):.*#[[:space:]]*(nosec.*)$$/  \1: \2/'

# Mutation check (tools/mutants.py): each entry of tools/mutations.toml breaks one core rule on a scratch copy of the
# working tree and runs the tests that guard it; exits non-zero if any mutation survives. `make test` runs the
# entries marked fast. One mutation: make mutants ARGS='--only "stale reply applied"'.
.PHONY: mutants mutants-fast
mutants: venv
	$(PY) tools/mutants.py $(ARGS)

mutants-fast: venv
	$(PY) tools/mutants.py --fast

# --------------------------------------------------------------------------------------------- build / run
# The agents' parts of template.yaml are rendered from agents.yaml (devstack/agents.py); build, run and up render
# them first, so adding an agent is one edit of agents.yaml. `make test` does not: its test of the template fails
# when the checked-in template.yaml is stale.
.PHONY: template
template: venv
	PYTHONPATH="$(APP_PYTHONPATH)$${PYTHONPATH:+:$$PYTHONPATH}" $(PY) -m devstack template

# No container: lambda-builders needs `python3.12` first on PATH, which .venv-sam/bin provides (the layer's
# requirements are then fetched for python3.12/x86_64 by pip). Afterwards every built handler is imported under
# Python 3.12 with only its code dir and the built layer on sys.path, as on Lambda.
build: sam-venv template
	PATH="$(ROOT)/$(SAM_VENV)/bin:$$PATH" $(SAM_ENV) $(SAM) build --template-file template.yaml --cached
	@echo "CoreLayer: $$(du -sh .aws-sam/build/CoreLayer | cut -f1) on disk ($$(find .aws-sam/build/CoreLayer -type f | wc -l) files; make bench reports its size in bytes, unzipped and zipped)"
	$(SAM_VENV)/bin/python tools/smoke_build.py .aws-sam/build

run: venv sam-venv template
	PYTHONPATH="$(APP_PYTHONPATH)$${PYTHONPATH:+:$$PYTHONPATH}" $(PY) -m devstack run $(ARGS)

up: venv sam-venv template
	PYTHONPATH="$(APP_PYTHONPATH)$${PYTHONPATH:+:$$PYTHONPATH}" $(PY) -m devstack up $(ARGS)

# 1,000 workflows under faults, checked (devstack/load.py). The run stops itself after LOAD_TIME_LIMIT seconds;
# `timeout` is only the backstop (--foreground: Ctrl-C still reaches the run). 20 minutes: the 1,000 take about 5 on
# a 2-core machine (docs/bench.md, Reliability).
LOAD_TIME_LIMIT ?= 1200
.PHONY: load
load: venv sam-venv
	PYTHONPATH="$(APP_PYTHONPATH)$${PYTHONPATH:+:$$PYTHONPATH}" \
		timeout --foreground --kill-after=30 $$(( $(LOAD_TIME_LIMIT) + 180 )) \
		$(PY) -m devstack load --time-limit $(LOAD_TIME_LIMIT) $(ARGS)

# 500 workflows started at once against services limited as agents.yaml declares (the hotels: 5 calls at once,
# 10 a second; a call beyond is answered 429), checked: no call over a quota, every step one attempt
# (devstack/load.py, burst_profile). About 3 minutes on 2 cores.
.PHONY: burst
burst: venv sam-venv template
	PYTHONPATH="$(APP_PYTHONPATH)$${PYTHONPATH:+:$$PYTHONPATH}" $(PY) -m devstack burst $(ARGS)

# The fleet drill at the issue's scale (docs/batches.md): 500 trips held by an outage, retried by one batch whose
# runner is killed midway (make test runs it with 100; BATCH_DRILL_WORKFLOWS sets the number).
BATCH_DRILL_WORKFLOWS ?= 500
.PHONY: batch-drill
batch-drill: venv
	SASFLOW_BATCH_DRILL_WORKFLOWS=$(BATCH_DRILL_WORKFLOWS) $(PY) -m pytest -q -p no:cacheprovider \
		tests/system/test_batch_drill_local.py

# One workflow with a map step of 10,000 children on the local stack, checked (python -m devstack map).
map: venv sam-venv template
	PYTHONPATH="$(APP_PYTHONPATH)$${PYTHONPATH:+:$$PYTHONPATH}" $(PY) -m devstack map $(ARGS)

# --------------------------------------------------------------------------------------------- maintenance
# Re-resolve requirements in throw-away venvs (no constraints) and record every transitive pin.
lock: lock-dev lock-sam lock-checkov lock-docs

lock-dev:
	@tools/lock "$(PYTHON311)" requirements-dev.txt tools/constraints-dev.txt

lock-sam:
	@tools/lock "$(PYTHON312)" tools/requirements-sam.txt tools/constraints-sam.txt

lock-checkov:
	@tools/lock "$(PYTHON311)" tools/requirements-checkov.txt tools/constraints-checkov.txt

lock-docs:
	@tools/lock "$(PYTHON311)" tools/requirements-docs.txt tools/constraints-docs.txt

clean:
	rm -rf .aws-sam .mypy_cache .ruff_cache .pytest_cache .devstack site $(MERMAID_JS)
	find . -path ./$(VENV) -prune -o -path ./$(SAM_VENV) -prune -o -path ./$(CHECKOV_VENV) -prune -o -path ./$(DOCS_VENV) -prune \
		-o -name __pycache__ -type d -prune -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV) $(SAM_VENV) $(CHECKOV_VENV) $(DOCS_VENV)

# --------------------------------------------------------------------------------------------- simulation
# Deterministic fault-injection simulation (real handlers + moto's DynamoDB semantics): >= 10,000 workflows, 0
# invariant violations, workflows/s printed at the end. The fast world (the default) answers DynamoDB's calls from
# moto's backend directly (simulation/direct.py); --world moto sends them through boto3 and moto's HTTP stubs, about
# 5x slower, with the same report for a seed (tests/simulation/test_fast_world.py).
# Replay one seed: make sim ARGS='--seed N --workflows M --runs 1'
# 100 x 100 rather than 50 x 200: moto answers every deadline-index Query by sorting the whole table, so smaller
# tables make the same 10,000 workflows faster.
SIM_ARGS ?= --seed 1 --workflows 100 --runs 100 --jobs 2
.PHONY: sim
sim: venv
	PYTHONPATH="$(APP_PYTHONPATH):$(ROOT)/functions/sample_services$${PYTHONPATH:+:$$PYTHONPATH}" \
		$(PY) -m simulation $(if $(ARGS),$(ARGS),$(SIM_ARGS))

# --------------------------------------------------------------------------------------------- bench
# Cost and scale, measured side by side in one run (python -m bench): prints one markdown table and writes
# bench/results.md + bench/results.json. Not a test: it reports ratios and whether each target is met, and exits 1
# (naming the rows) when one is missed. The layer size comes from `make build`. A quicker look that leaves the results files alone:
# make bench ARGS='--scale 0.2 --no-write'.
.PHONY: bench
bench: venv build
	PYTHONPATH="$(APP_PYTHONPATH):$(ROOT)/functions/sample_services$${PYTHONPATH:+:$$PYTHONPATH}" \
		$(PY) -m bench $(ARGS)

# --------------------------------------------------------------------------------------------- API fuzzing
# schemathesis against the OpenAPI document the API serves, through the local stack on loopback (tools/fuzz.py):
# >= 2,000 test cases, summary by check, non-zero exit on any failure. FUZZ_MAX_TIME bounds the run (seconds);
# `timeout` is only the backstop. Another seed: make fuzz ARGS='--seed 7'. `make test` runs a small round
# (tests/fuzz/test_api_fuzz.py).
FUZZ_MAX_TIME ?= 900
.PHONY: fuzz
fuzz: venv
	PYTHONPATH="$(APP_PYTHONPATH):$(ROOT)/functions/sample_services$${PYTHONPATH:+:$$PYTHONPATH}" \
		timeout --foreground --kill-after=30 $$(( $(FUZZ_MAX_TIME) + 300 )) \
		$(PY) tools/fuzz.py --max-time $(FUZZ_MAX_TIME) $(ARGS)
