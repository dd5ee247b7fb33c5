"""The network-namespace fixture itself: real addresses, reachability, cuts, teardown."""

from __future__ import annotations

import fcntl
import select
import shutil
import socket
import subprocess
import sys
import textwrap

import pytest
from netns import (
    BRIDGE,
    BRIDGE_IP,
    LOCK_PATH,
    PREFIX,
    SUBNET_BITS,
    NetnsCluster,
    host_ip,
    unavailable_reason,
)

pytestmark = pytest.mark.timeout(60)

ECHO_SERVER = textwrap.dedent(
    """
    import socket, threading
    def echo(conn):
        with conn:
            while data := conn.recv(65536):
                conn.sendall(data)
    srv = socket.socket()
    srv.bind(("0.0.0.0", 0))
    srv.listen()
    print(srv.getsockname()[1], flush=True)
    while True:
        conn, _ = srv.accept()
        threading.Thread(target=echo, args=(conn,), daemon=True).start()
    """
)


def _readline(proc: subprocess.Popen[str], timeout: float) -> str:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    assert ready, f"no output within {timeout}s (exit status {proc.poll()})"
    return proc.stdout.readline().strip()


def _echo_server(cluster: NetnsCluster, host: int) -> int:
    proc = cluster.popen(
        host, [sys.executable, "-c", ECHO_SERVER], stdout=subprocess.PIPE, text=True
    )
    return int(_readline(proc, 20))


def _recv_within(sock: socket.socket, timeout: float) -> bytes | None:
    ready, _, _ = select.select([sock], [], [], timeout)
    return sock.recv(65536) if ready else None


def _ours() -> tuple[list[str], list[str]]:
    netns = subprocess.run(
        ["ip", "netns", "list"], capture_output=True, text=True, check=False
    ).stdout
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=False).stdout
    return (
        [line.split()[0] for line in netns.splitlines() if line.startswith(PREFIX)],
        [
            line.split(":")[1].strip().split("@")[0]
            for line in links.splitlines()
            if line.split(":")[1].strip().startswith(PREFIX)
        ],
    )


def test_each_host_has_its_own_address_and_loopback(netns_cluster: NetnsCluster) -> None:
    bridge = subprocess.run(
        ["ip", "-4", "-o", "addr", "show", "dev", BRIDGE],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    assert f"{BRIDGE_IP}/{SUBNET_BITS}" in bridge
    for host in netns_cluster.hosts:
        addrs = netns_cluster.run(host, ["ip", "-4", "-o", "addr"]).stdout
        assert f"{host.ip}/{SUBNET_BITS}" in addrs
        assert "127.0.0.1/8" in addrs
        others = [h.ip for h in netns_cluster.hosts if h is not host]
        assert not any(f"{ip}/" in addrs for ip in others)
        lo = netns_cluster.run(host, ["ip", "-o", "link", "show", "lo"]).stdout
        assert "UP" in lo.split("<")[1].split(">")[0]


@pytest.mark.skipif(shutil.which("ping") is None, reason="ping (iputils-ping) is not installed")
def test_ping_between_namespaces(netns_cluster: NetnsCluster) -> None:
    h0, h1, h2 = netns_cluster.hosts
    for src, dst in ((h0, h1), (h1, h2), (h2, h0)):
        out = netns_cluster.run(src, ["ping", "-c", "1", "-W", "5", dst.ip])
        assert out.returncode == 0, out.stdout + out.stderr
    # The controller, in the root namespace, reaches the hosts through the bridge.
    out = subprocess.run(
        ["ping", "-c", "1", "-W", "5", h2.ip], capture_output=True, text=True, check=False
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_tcp_between_namespaces_and_loopback_inside(netns_cluster: NetnsCluster) -> None:
    port = _echo_server(netns_cluster, 1)
    h1 = netns_cluster.hosts[1]
    client = textwrap.dedent(
        f"""
        import socket, sys
        for addr in sys.argv[1:]:
            with socket.create_connection((addr, {port}), timeout=10) as s:
                s.sendall(addr.encode())
                print(s.recv(100).decode())
        """
    )
    # From another namespace, and from inside h1 itself over its own lo.
    out = netns_cluster.run(2, [sys.executable, "-c", client, h1.ip])
    assert out.stdout.split() == [h1.ip], out.stderr
    out = netns_cluster.run(1, [sys.executable, "-c", client, "127.0.0.1", h1.ip])
    assert out.stdout.split() == ["127.0.0.1", h1.ip], out.stderr
    # 127.0.0.1 inside h0 is h0's own loopback, not h1's server.
    out = netns_cluster.run(0, [sys.executable, "-c", client, "127.0.0.1"])
    assert out.returncode != 0
    assert "ConnectionRefusedError" in out.stderr


def test_cut_link_makes_tcp_silent_and_restore_delivers(netns_cluster: NetnsCluster) -> None:
    h1 = netns_cluster.hosts[1]
    port = _echo_server(netns_cluster, h1.index)
    with socket.create_connection((h1.ip, port), timeout=10) as sock:
        sock.sendall(b"before")
        assert _recv_within(sock, 10) == b"before"

        netns_cluster.cut(h1)
        # The cut is silent: send() succeeds, no reply, no RST, no error on the socket.
        sock.sendall(b"during")
        assert _recv_within(sock, 1.0) is None
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0
        # A new connection to the cut host gets no answer at all (not refused).
        with pytest.raises(TimeoutError):
            socket.create_connection((h1.ip, port), timeout=0.5)

        netns_cluster.restore(h1)
        # TCP retransmits what was queued; the echo comes back on the same connection.
        got = b""
        while got != b"during":
            chunk = _recv_within(sock, 20)
            assert chunk, f"no reply within 20s after restore (got {got!r})"
            got += chunk
        sock.sendall(b"after")
        assert _recv_within(sock, 10) == b"after"


def test_cut_off_blocks_namespace_to_namespace_traffic(netns_cluster: NetnsCluster) -> None:
    h0, h1, h2 = netns_cluster.hosts
    port = _echo_server(netns_cluster, h2.index)
    probe = textwrap.dedent(
        f"""
        import socket, sys
        try:
            socket.create_connection(("{h2.ip}", {port}), timeout=1).close()
            print("connected")
        except OSError as exc:
            print(type(exc).__name__)
        """
    )
    with netns_cluster.cut_off(h2):
        assert netns_cluster.run(h0, [sys.executable, "-c", probe]).stdout.strip() in (
            "TimeoutError",
            "OSError",
        )
    # Other hosts are unaffected by the cut, and the cut host is back afterwards.
    assert netns_cluster.run(h1, [sys.executable, "-c", probe]).stdout.strip() == "connected"


def test_four_hosts_and_teardown_after_a_failing_test() -> None:
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(f"network namespaces unavailable: {reason}")
    procs: list[subprocess.Popen[str]] = []

    def failing_test() -> None:
        with NetnsCluster(4) as cluster:
            assert [h.ip for h in cluster.hosts] == [f"10.200.0.{10 + i}" for i in range(4)]
            port = _echo_server(cluster, 3)
            with socket.create_connection((cluster.hosts[3].ip, port), timeout=10):
                pass
            procs.append(cluster.popen(0, ["sleep", "600"]))
            raise RuntimeError("the test failed")

    with pytest.raises(RuntimeError, match="the test failed"):
        failing_test()
    assert _ours() == ([], [])
    assert procs[0].poll() is not None


def test_leftovers_of_a_crashed_run_are_removed_at_start() -> None:
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(f"network namespaces unavailable: {reason}")
    # Play a crashed run: a namespace with a process in it, a bridge, a veth; no teardown.
    with open(LOCK_PATH, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        NetnsCluster.remove_leftovers()
        subprocess.run(["ip", "netns", "add", f"{PREFIX}h9"], check=True)
        subprocess.run(["ip", "link", "add", BRIDGE, "type", "bridge"], check=True)
        subprocess.run(
            ["ip", "link", "add", f"{PREFIX}v9", "type", "veth", "peer", "name", f"{PREFIX}p9"],
            check=True,
        )
        orphan = subprocess.Popen(
            ["ip", "netns", "exec", f"{PREFIX}h9", "sh", "-c", "echo ready; exec sleep 600"],
            start_new_session=True,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert _readline(orphan, 20) == "ready"  # it is inside the namespace now
        except BaseException:
            orphan.kill()
            raise
    with NetnsCluster(2) as cluster:
        assert sorted(_ours()[0]) == [f"{PREFIX}h0", f"{PREFIX}h1"]
        assert orphan.wait(timeout=10) == -9
        assert orphan.stdout is not None
        orphan.stdout.close()
        assert len(cluster.hosts) == 2
    assert _ours() == ([], [])


@pytest.mark.timeout(5)
def test_host_addresses_carry_into_the_third_byte_past_host_245() -> None:
    """256 hosts (the scale benchmark's cluster) need addresses beyond one /24."""
    assert [host_ip(i) for i in (0, 245, 246, 255)] == [
        "10.200.0.10",
        "10.200.0.255",
        "10.200.1.0",
        "10.200.1.9",
    ]
    assert len({host_ip(i) for i in range(1000)}) == 1000
