"""A real TCP port forwarder into a network-namespace host: what ``kubectl port-forward`` is.

``kubectl port-forward --namespace NS pod/NAME :PORT [--address 127.0.0.1] [--kubeconfig F]``
listens on a free local port, prints ``Forwarding from 127.0.0.1:LOCAL -> PORT``, and for each
connection it accepts opens one to ``localhost:PORT`` inside the pod's network namespace (the
API server and the kubelet carry the bytes in between) and relays both ways, printing
``Handling connection for LOCAL``. This script does exactly that without a cluster: it accepts
in the namespace it was started in, then enters the pod's network namespace (``setns``), so
every connection it opens to ``127.0.0.1:PORT`` arrives at the worker on that host's loopback,
as kubectl's do in a pod. Killing it cuts every forwarded connection, as killing kubectl does.

It takes kubectl's command line (run it as ``python port_forwarder.py port-forward ...``); the
pod names map to namespaces through ``REGENCY_TEST_PODS`` (JSON: pod name -> netns name). With
``REGENCY_TEST_RECORD`` (a directory) it also appends every byte it relays, both ways, to a file
there: what someone on the forward's path would see.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import socket
import sys
import threading

_CLONE_NEWNET = 0x40000000
_record_lock = threading.Lock()


def _enter_netns(name: str) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/run/netns/{name}", os.O_RDONLY | os.O_CLOEXEC)
    try:
        if libc.setns(fd, _CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns into {name}: {os.strerror(err)}")
    finally:
        os.close(fd)


def _record(data: bytes) -> None:
    where = os.environ.get("REGENCY_TEST_RECORD")
    if where:
        with _record_lock, open(os.path.join(where, f"{os.getpid()}.bin"), "ab") as out:
            out.write(data)


def _pump(src: socket.socket, dst: socket.socket) -> None:
    while True:
        try:
            data = src.recv(65536)
        except OSError:
            data = b""
        if not data:
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)
            return
        _record(data)
        try:
            dst.sendall(data)
        except OSError:
            with contextlib.suppress(OSError):
                src.shutdown(socket.SHUT_RD)
            return


def _relay(client: socket.socket, port: int) -> None:
    try:
        server = socket.create_connection(("127.0.0.1", port), timeout=10)
    except OSError as exc:
        print(f"error forwarding port {port}: {exc}", file=sys.stderr, flush=True)
        client.close()
        return
    server.settimeout(None)
    back = threading.Thread(target=_pump, args=(server, client), daemon=True)
    back.start()
    _pump(client, server)
    back.join()
    client.close()
    server.close()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="kubectl")
    parser.add_argument("command", choices=["port-forward"])
    parser.add_argument("--namespace", "-n", default="default")
    parser.add_argument("--address", default="127.0.0.1")
    parser.add_argument("--kubeconfig")
    parser.add_argument("target")
    parser.add_argument("ports")
    args = parser.parse_args(argv)
    kind, _, pod = args.target.partition("/")
    pods = json.loads(os.environ.get("REGENCY_TEST_PODS", "{}"))
    if kind != "pod" or pod not in pods:
        print(f'error: pods "{pod}" not found', file=sys.stderr, flush=True)
        return 1
    local, _, remote = args.ports.rpartition(":")
    listener = socket.create_server((args.address, int(local or 0)))
    _enter_netns(pods[pod])  # this thread, and the threads it starts, connect in the pod
    bound = listener.getsockname()[1]
    print(f"Forwarding from {args.address}:{bound} -> {remote}", flush=True)
    while True:
        client, _ = listener.accept()
        print(f"Handling connection for {bound}", flush=True)
        threading.Thread(target=_relay, args=(client, int(remote)), daemon=True).start()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
