"""The bad-input catalogue: every case exits 2 with one line naming the problem, prints no
traceback, and leaves no MLflow run RUNNING and no checkpoint touched. The README reports
the count (len(CASES))."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import ROOT, mlflow_runs, run_xp
from images import make_folder

OWN = ROOT / "tests" / "own"  # a user's code: factories that go wrong, and the config files naming them

# (command-line arguments, a fragment the one line must contain); {tmp} is the test's folder
CASES = [
    # group options and keys
    ("model=alexnet", "model=alexnet: no such model; did you mean model=lenet? valid: lenet, resnet152"),
    ("dataset=imagenet", "dataset=imagenet: no such dataset"),
    ("backend=nope", "backend=nope: no such backend; valid: gluon, horovod, module, torch"),
    ("kvstore=zmq", "kvstore=zmq: no such kvstore"),
    ("dtype=int8", "dtype=int8: no such dtype"),
    ("hardware=tpu", "hardware=tpu: no such hardware"),
    ("bach=3", "unknown key 'bach'; did you mean batch?"),
    ("model=resnet19", "model=resnet19: no such model; did you mean model=resnet18? valid: lenet"),
    ("-m sweep=lr_bach", "sweep=lr_bach: no such study; did you mean sweep=lr_batch? valid:"),
    ("--model resnet18", "--model resnet18: xp's settings are KEY=VALUE: write model=resnet18"),
    ("--batch=64", "--batch=64: xp's settings are KEY=VALUE: write batch=64"),
    ("+foo=bar", "+foo=bar: xp has no key 'foo', nothing would read it"),
    ("+lrr=0.1", "+lrr=0.1: xp has no key 'lrr', nothing would read it; did you mean lr?"),
    ("++model.widht=2", "xp has no key 'model.widht'"),
    # a value with a space, split by the shell; a key of another option of the group (issue 29)
    ("dataset=folder dataset.root=/data/my dir", "cannot parse the command line: 'dir' is not KEY=VALUE; if it belongs "
     "to dataset.root's value, quote the whole value for the shell and for Hydra: \"dataset.root='/data/my dir'\""),
    ("dataset.root=/data", "dataset.root=/data: unknown key 'dataset.root'; the chosen dataset has no such key"),
    # wrong types and out-of-range numbers
    ("batch=0", "batch=0: must be an integer from 1"),
    ("batch=abc", "batch='abc': must be an integer"),
    ("epochs=ten", "epochs='ten': must be an integer"),
    ("epochs=0", "epochs=0: must be an integer from 1"),
    ("lr=-0.1", "lr=-0.1: must be a number > 0.0"),
    ("lr=1000", "lr=1000: must be a number > 0.0 and <= 100.0"),
    ("lr_ref_batch=0", "lr_ref_batch=0: must be an integer >= 1"),
    ("momentum=1.5", "momentum=1.5: must be a number >= 0.0 and < 1.0"),
    ("wd=-1", "wd=-1: must be a number >= 0.0"),
    ("lr_schedule=linear", "lr_schedule='linear': not supported; valid: constant, step, cosine"),
    ("optimizer=adamw", "optimizer='adamw': not supported; valid: sgd, nag"),
    ("seed=-1", "seed=-1: must be an integer from 0"),
    ("cpu_devices=0", "cpu_devices=0: must be an integer from 1"),
    ("gpus=-1", "gpus=-1: must be an integer from 0"),
    ("target_accuracy=2", "target_accuracy=2: must be a number >= 0.0 and <= 1.0"),
    ("timing_warmup_batches=-1", "timing_warmup_batches=-1: must be an integer from 0"),
    ("data_nthreads=0", "data_nthreads=0: must be an integer from 1"),
    ("pricing=cheap", "pricing='cheap': not supported; valid: on_demand, spot"),
    ("lr=[1", "cannot parse the command line"),
    ("batch=16,32", "add -m to run one experiment per value"),
    # hardware this machine does not have
    ("gpus=4", "gpus=4: 4 GPUs asked for, 0 visible"),
    ("dtype=float16", "dtype=float16: MXNet 1.9.1 has no float16 CPU kernels"),
    ("kvstore=nccl", "kvstore=nccl: NCCL aggregates gradients between GPUs"),
    # distributed and elastic settings
    ("workers=2", "workers=2: several worker processes need a distributed kvstore"),
    ("workers=0", "workers=0: must be an integer from 1"),
    ("kvstore=dist_sync port=80", "port=80: must be an integer from 1024 to 65535"),
    ("kvstore=dist_sync dist_timeout_s=0", "dist_timeout_s=0: must be a number >= 1"),
    ("kvstore=dist_sync launcher=k8s", "launcher=k8s: no such launcher; valid: local, ray, slurm, ssh"),
    ("kvstore=dist_sync workers=2 launcher=ssh", "launcher=ssh: needs launcher.hosts_file=PATH"),
    ("kvstore=dist_sync workers=2 launcher=mpi", "launcher=mpi: no such launcher; valid: "),
    ("kvstore=dist_sync workers=2 launcher=ssh launcher.hosts_file={tmp}/no-hosts", "no-hosts: cannot read it"),
    ("kvstore=dist_sync workers=2 launcher=ssh launcher.hosts_file={tmp}/hosts host_ip=h1", "host_ip=h1: must be an IPv4"),
    ("kvstore=dist_sync workers=3 launcher=ssh launcher.hosts_file={tmp}/hosts", "workers: 3 processes need 3 slots"),
    ("kvstore=dist_sync workers=2 launcher=ssh launcher.hosts_file={tmp}/hosts", "launcher=ssh: needs host_ip=ADDRESS"),
    ("kvstore=dist_sync workers=2 launcher=ssh launcher.hosts_file={tmp}/hosts launcher.identity={tmp}/no-key",
     "no-key: no such file"),
    ("kvstore=dist_sync elastic.enabled=true launcher=ssh elastic.discovery={tmp}/d",
     "elastic.enabled=true launcher=ssh: needs checkpoint_dir=PATH on storage every host"),
    ("kvstore=dist_sync elastic.enabled=true launcher=ssh checkpoint_dir={tmp}/ck",
     "elastic.enabled=true launcher=ssh: needs elastic.discovery=FILE|SCRIPT listing the hosts"),
    ("elastic.enabled=true", "elastic.enabled=true: needs kvstore=dist_sync"),
    ("kvstore=dist_sync elastic.enabled=true elastic.min_workers=3 elastic.max_workers=2",
     "need integers with 1 <= min_workers <= max_workers"),
    ("backend=horovod cpu_devices=2", "backend=horovod: one device per worker process (2 asked)"),
    ("backend=horovod backend.api=symbol", "backend.api='symbol': must be one of gluon, module"),
    ("backend=torch kvstore=dist_sync", "kvstore=dist_sync: backend=torch allreduces gradients with DDP"),
    ("backend=torch kvstore=dist_sync elastic.enabled=true", "kvstore=dist_sync: backend=torch allreduces gradients"),
    ("backend=torch workers=2 elastic.enabled=true", "elastic.enabled=true: backend=torch is elastic across hosts "
     "(torchrun's elastic agent, one per host): launcher=ssh"),
    ("backend=torch optimizer=nag momentum=0", "optimizer=nag: Nesterov momentum needs momentum > 0"),
    ("pretrained=models:/nope@best", "pretrained=models:/nope@best: no such model in"),
    ("pretrained=runs:/0123/model", "pretrained=runs:/0123/model: no such model in"),
    ("checkpoint_keep=3", "checkpoint_keep=3: now checkpoint.keep_last=3"),
    ("checkpoint.keep_last=0", "checkpoint.keep_last=0: must be an integer from 1"),
    ("model.log=sometimes", "model.log=sometimes: one of best, last, none"),
    ("-m sweep=lr_batch sweep.register_model=a/b", "register_model='a/b': a Model Registry name (no / or @), or none"),
    ("backend=torch backend.compile=fast", "backend.compile=fast: true, false or a torch.compile mode (default, "),
    ("dtype=bfloat16", "dtype=bfloat16: the MXNet backends reach bfloat16 through AMP"),
    ("dataset=folder dataset.root={tmp}/imgs dataset.decode=fpga", "dataset.decode='fpga': must be cpu (the decode workers)"),
    ("backend=torch dataset=folder dataset.root={tmp}/imgs batch=4 dataset.decode=gpu", "dataset.decode=gpu: needs GPUs (gpus=N)"),
    ("dataset=folder dataset.root={tmp}/imgs batch=4 dataset.decode=gpu", "dataset.decode=gpu: backend=gluon decodes on the CPU"),
    # plugins and command-line code
    ("+backend._target_=os.system", "setting _target_ from the command line is refused"),
    ("+hydra.callbacks.x._target_=os.getcwd", "setting _target_ from the command line is refused"),
    # a user's own network and data (issue 57): a registered name, or a factory a config file of theirs names
    ("model=tinynett", "model=tinynett: no such model; did you mean model=tinynet?"),
    ("dataset=shape", "dataset=shape: no such dataset; did you mean dataset=shapes?"),
    ("--config-dir {own}/conf model=broken_import", "model.factory=badnets_import:net: badnets_import:net failed "
     "to import: ZeroDivisionError: division by zero ({own}/badnets_import.py:3)"),
    ("--config-dir {own}/conf model=wrong_type", "model=wrong_type: its mxnet factory returned builtins.str; "
     "backend=gluon trains a Gluon HybridBlock"),
    ("--config-dir {own}/conf model=wrong_type backend=torch", "its torch factory returned builtins.str; "
     "backend=torch trains a torch.nn.Module"),
    ("--config-dir {own}/conf model=wrong_classes", "model=wrong_classes: gives (2, 3) for 2 images; the data set "
     "has 10 classes, so (2, 10) was expected"),
    ("--config-dir {own}/conf model=wants_rgb backend=torch", "model=wants_rgb: refuses the data set's input "
     "(2, 1, 8, 8): RuntimeError: "),
    ("--config-dir {own}/conf model=torch_only", "model=torch_only: offered for torch only, not for backend=gluon; "
     "use backend=torch"),
    ("--config-dir {own}/conf dataset=empty_data", "dataset=empty_data: its train "
     "part has no samples"),
    ("--config-dir {own}/conf dataset=bad_labels", "dataset=bad_labels: its train part: label 7 is out of range "
     "for 4 classes (0 to 3)"),
    ("model.factory=os:system", "model.factory=os:system: an import path on the command line is refused"),
    ("+dataset.factory=os:system", "an import path on the command line is refused"),
    # missing and corrupt files
    ("dataset=folder dataset.root={tmp}/no-images", "no such directory"),
    ("dataset=rec dataset.train_rec={tmp}/no.rec dataset.val_rec={tmp}/no.rec", "no.rec: no such file"),
    ("resume={tmp}/no-checkpoint", "no committed state there"),
    ("resume={tmp}/corrupt-checkpoint", "the latest commit epoch-1 cannot be read"),
    ("resume=true", "resume=true: no interrupted run with a checkpoint_dir"),
    ("checkpoint_dir={tmp}/hosts", "hosts: a file, not a folder"),
    ("checkpoint_dir={tmp}/hosts/ckpt", "ckpt: cannot create it (Not a directory"),
    ("diagnose=true test_io=true", "diagnose=true test_io=true: pick one"),
    ("pretrained={tmp}/no-model", "weights not found"),
    ("backend=torch model=resnet18 pretrained=resnet18", "pretrained=resnet18: weights not found; tried"),
    ("backend=torch pretrained={tmp}/no.pth", "weights not found; tried"),
    ("-m sweep=nonexistent", "sweep=nonexistent: no such study"),
    ("-m hydra.sweeper.n_trials=3 batch=16,32", "sets a field of a study; choose the study too: -m sweep=NAME"),
    ("-m batch=16,32 hydra.launcher.n_jobs=2", "hydra.launcher.n_jobs=2: unknown key 'hydra.launcher.n_jobs'"),
    ("-m sweep=lr_batch sweep.n_trials=abc", "sweep.n_trials=abc: Value 'abc' of type 'str' could not be converted"),
    ("-m sweep=lr_batch sweep.confirm=-1", "sweep=lr_batch: confirm=-1: must be an integer >= 0"),
    ("-m sweep=lr_batch sweep.confirm=2 seed=1,2", "confirm=2: retrains the best trial of one objective with other "
     "seeds; this study searches the seed"),
    ("-m sweep=lr_batch batch=32 lr=0.1 momentum=0.9", "every parameter it searches is fixed on the command line "
     "(batch=32, lr=0.1, momentum=0.9)"),
    # environments: an unwritable store, an unreachable database
    ("tracking_uri=sqlite:////proc/no-such-dir/mlflow.db", "cannot create /proc/no-such-dir"),
    ("tracking_uri=postgresql://xp:hunter2@127.0.0.1:9/mlflow", "tracking_uri postgresql://xp:***@127.0.0.1:9/mlflow: cannot connect"),
    ("tracking_uri=http://127.0.0.1:9", "tracking_uri=http://127.0.0.1:9: no MLflow server answers"),
    ("-m batch=16,32 tracking_uri=http://127.0.0.1:9", "tracking_uri=http://127.0.0.1:9: no MLflow server answers"),
    ("-m sweep=lr_batch sweep.budget_usd=5", "sweep.budget_usd=5: hardware=local has no price; choose an instance"),
    ("-m sweep=lr_batch sweep.timeout_s=-1", "sweep=lr_batch: timeout_s=-1.0: must be a number > 0, or null"),
    ("-m sweep=lr_batch sweep.storage=sqlite:////proc/nope/o.db", "its folder cannot be made (No such file or directory: /proc/nope)"),
    ("-m sweep=lr_batch sweep.storage=sqlite:///{tmp}/hosts", "hosts: cannot connect (DatabaseError: (sqlite3."
     "DatabaseError) file is not a database"),
]


def test_the_catalogue_is_at_least_40_cases():
    assert len(CASES) >= 40


@pytest.mark.slow
@pytest.mark.parametrize("args, fragment", CASES, ids=[a for a, _ in CASES])
def test_bad_input_is_one_line_and_exit_2(tmp_path, store, args, fragment):
    bad = tmp_path / "corrupt-checkpoint"
    (bad / "epoch-1").mkdir(parents=True)
    (bad / "latest").write_text("epoch-1")
    (bad / "epoch-1" / "meta.json").write_text("{not json")
    (tmp_path / "hosts").write_text("10.0.0.2:1\n10.0.0.3:1\n")  # never reached: each case fails before
    make_folder(tmp_path / "imgs", per_class=5, size=(8, 8), with_photos=False)
    r = run_xp(tmp_path, store, *args.format(tmp=tmp_path, own=OWN).split(), timeout=120,
               env={"PYTHONPATH": str(OWN)})  # the user's own modules (tests/own)
    assert r.returncode == 2, r.stdout[-1000:] + r.stderr[-1000:]
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("xp: error: "), r.stderr
    assert fragment.format(tmp=tmp_path, own=OWN) in lines[0], lines[0]
    assert "Traceback" not in r.stdout + r.stderr and "hunter2" not in r.stdout + r.stderr
    if Path(store.removeprefix("sqlite:///")).exists():  # (most cases never create the store: nothing to look at)
        assert all(run.info.status != "RUNNING" for run in mlflow_runs(store)[1])
    assert (bad / "epoch-1" / "meta.json").read_text() == "{not json"  # a bad checkpoint is reported, not rewritten
