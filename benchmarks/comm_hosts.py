"""Per-step gradient exchange across hosts: ps-lite, Horovod and PyTorch DDP, side by side, on shaped links.

    sudo .venv/bin/python benchmarks/comm_hosts.py [--hosts 2 3] [--rates 1gbit 10gbit] [--delay 0.2ms]

Hosts are network namespaces (tests/hosts.py, root needed); every link (both ways) is shaped with tc netem
(rate + delay), or with a token bucket (tbf: rate only) where the kernel has no netem (as on the machines
xp is developed on; the run says which). For each link, host count and engine, xp's own launch engine starts one worker per host over
ssh (benchmarks/comm_worker.py) and the worker times one exchange of a ResNet-18-sized gradient (11.69 M
float32 values, 46.8 MB) with the engine's primitive: ps-lite push+pull (one server per host), Horovod
allreduce, torch.distributed all_reduce (gloo). Printed beside it: the ring-allreduce estimate
2 (N-1)/N x bytes / bandwidth, the floor an allreduce over that link cannot beat.

All hosts share this machine's cores: the figures include the engines' own CPU work (copies, reductions),
which real hosts would each do on their own cores.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

RESNET18 = 11_689_512  # parameters of torchvision's resnet18 (1000 classes)
ENGINES = ("ps-lite", "horovod", "torchrun")


def inner(engine: str, addresses: list[str], host_ip: str, ssh_config: str, elements: int, steps: int) -> None:
    """In the launcher's namespace: launch the workers with xp's engine and let them print their result."""
    from xp.launching.engine import Spec
    from xp.launching.hosts import HostSlots
    from xp.launching.job import Job
    from xp.launching.launcher import Ssh
    from xp.run.settings import LaunchSettings
    from xp.mx.horovodrun import Horovod
    from xp.mx.pslite import PsLite
    from xp.pt.torchrun import Torchrun

    cls = {"ps-lite": PsLite, "horovod": Horovod, "torchrun": Torchrun}[engine]
    n = len(addresses)
    launcher = Ssh(LaunchSettings("ssh", {"config": ssh_config}, host_ip=host_ip, interface="eth0"))
    spec = Spec([engine, str(elements), str(steps)], workers=n, servers=n, launcher=launcher,
                hosts=[HostSlots(a, 1) for a in addresses], host_ip=host_ip, interface="eth0",
                transport=launcher.transport(), timeout_s=600, module="benchmarks.comm_worker")
    job_engine = cls(spec)
    job_engine.check()  # as xp.launching.job.prepared checks a job: the engine's own checks, then the launcher's
    launcher.check(job_engine.hosts(), spec.interface, job_engine.interface_here)
    Job(job_engine).run()


def ring_ms(n: int, nbytes: int, rate: str) -> float:
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(g|m)bit", rate)
    bits_per_s = float(m.group(1)) * (1e9 if m.group(2) == "g" else 1e6)
    return 2 * (n - 1) / n * nbytes * 8 / bits_per_s * 1000


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, nargs="+", default=[2, 3])
    ap.add_argument("--rates", nargs="+", default=["1gbit", "10gbit"])
    ap.add_argument("--delay", default="0.2ms")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--elements", type=int, default=RESNET18)
    ap.add_argument("--inner", nargs=5, metavar=("ENGINE", "ADDRESSES", "HOST_IP", "SSH_CONFIG", "STEPS"),
                    help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.inner:
        engine, addresses, host_ip, cfg, steps = args.inner
        inner(engine, addresses.split(","), host_ip, cfg, args.elements, int(steps))
        return 0
    import hosts

    why = hosts.requirements()
    if why:
        print(f"comm_hosts: {why}", file=sys.stderr)
        return 2
    nbytes = args.elements * 4
    rows = []
    with hosts.Cluster(max(args.hosts) + 1) as c:
        for rate in args.rates:
            link = c.shape(rate, args.delay)
            print(f"links shaped: {link}", flush=True)
            for n in args.hosts:
                addresses = ",".join(h.address for h in c.workers[:n])
                for engine in ENGINES:
                    cmd = c.on_launcher([sys.executable, __file__, "--elements", str(args.elements), "--inner", engine,
                                         addresses, c.launcher.address, str(c.ssh_config), str(args.steps)])
                    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900,
                                       env={**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"})
                    m = re.search(r"RESULT \S+ ([\d.]+) ([\d.]+)", r.stdout)
                    ms = float(m.group(1)) if m else float("nan")
                    if not m:
                        print(f"{engine} on {n} hosts failed:\n{r.stdout[-1500:]}{r.stderr[-1500:]}", file=sys.stderr)
                    est = ring_ms(n, nbytes, rate)
                    rows.append((link, n, engine, ms, est))
                    print(f"{link} | {n} hosts | {engine:9} | {ms:8.1f} ms/step | ring estimate "
                          f"{est:7.1f} ms | measured/estimate {ms / est:5.2f}", flush=True)
    print(f"\n| link | hosts | engine | ms/step (median of {args.steps}) | ring estimate, ms | measured / estimate |")
    print("|---|---|---|---|---|---|")
    for link, n, engine, ms, est in rows:
        print(f"| {link} | {n} | {engine} | {ms:.1f} | {est:.1f} | {ms / est:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
