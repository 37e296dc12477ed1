# Thin aliases for ./dev.sh, which creates and reuses .venv.
.PHONY: setup run test test-fast
setup:
	./dev.sh setup
run:
	./dev.sh run $(ARGS)
test:
	./dev.sh test
test-fast:
	./dev.sh test -m "not slow"
