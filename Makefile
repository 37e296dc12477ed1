# Thin aliases for ./dev.sh, which creates and reuses .venv.
.PHONY: setup run test test-fast typecheck bench ui dashboard server
HOST ?= 127.0.0.1
PORT ?= 5000
DASHBOARD_PORT ?= 8080
setup:
	./dev.sh setup
run:
	./dev.sh run $(ARGS)
test:
	./dev.sh test
test-fast:
	./dev.sh test -m "not slow"
typecheck: setup
	.venv/bin/python -m mypy
bench: setup
	.venv/bin/python benchmarks/pipeline_overhead.py
	.venv/bin/python benchmarks/loop_overhead.py
	.venv/bin/python benchmarks/loop_overhead.py --model lenet --size 16 --steps 200
	.venv/bin/python benchmarks/loop_overhead.py --data digits --epochs 20
	.venv/bin/python benchmarks/pruning_study.py --seeds 0 1 2
	.venv/bin/python benchmarks/study_scheduler.py --reps 3
	.venv/bin/python benchmarks/input_pipeline.py
	.venv/bin/python benchmarks/comm_overhead.py
	.venv/bin/python benchmarks/backends_side_by_side.py
	.venv/bin/python benchmarks/torch_pipeline.py
	.venv/bin/python benchmarks/tracking_outage.py
# the store xp writes to: $MLFLOW_TRACKING_URI where it is set (a server is already a UI: its address is printed)
STORE = $(or $(MLFLOW_TRACKING_URI),sqlite:///mlruns/mlflow.db)
ui: setup
	@case "$(STORE)" in http://*|https://*) echo "MLFLOW_TRACKING_URI=$(STORE) is a tracking server: open $(STORE)"; exit 0;; esac; \
	.venv/bin/mlflow ui --backend-store-uri "$(STORE)" --host $(HOST) --port $(PORT)
dashboard: setup
	.venv/bin/optuna-dashboard $(or $(XP_OPTUNA_STORAGE),sqlite:///mlruns/optuna.db) --host $(HOST) --port $(DASHBOARD_PORT)
# An MLflow tracking server for runs across hosts (launcher=ssh): bind it to an address the hosts reach,
# e.g. make server HOST=10.0.0.1, then tracking_uri=http://10.0.0.1:5000. Runs and artifacts stay in mlruns/.
server: setup
	MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false .venv/bin/mlflow server --backend-store-uri sqlite:///mlruns/mlflow.db --artifacts-destination mlruns/artifacts --host $(HOST) --port $(PORT)
