"""torchrun, with its rendezvous store bound to 127.0.0.1.

torchrun's static rendezvous starts a TCPStore server on --master-port listening on every
interface; xp's local launches keep every socket on the loopback interface, so this runs
torchrun's own entry point with that server given a socket bound to --master-addr:
`python -m xp.torchrun ARGS` = `torchrun ARGS`.
"""

from __future__ import annotations

import socket
import sys
from typing import Any


def loopback_store(host: str, port: int, world_size: int | None = None, is_master: bool = False,
                   timeout: Any = None, **kwargs: Any) -> Any:
    from torch.distributed import TCPStore

    if is_master:  # the server listens on a socket bound to `host` only (TCPStore would bind all interfaces)
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((host, port))
        s.listen(128)
        kwargs["master_listen_fd"] = s.detach()
    return TCPStore(host, port, world_size, is_master, timeout, **kwargs)


def main() -> None:
    import torch.distributed.elastic.rendezvous.static_tcp_rendezvous as static
    from torch.distributed.run import main as torchrun

    static.TCPStore = loopback_store
    sys.exit(torchrun())


if __name__ == "__main__":
    main()
