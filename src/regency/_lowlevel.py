"""The runtime's extension face (like ``trio.lowlevel``): all that packages built on it may use.

``regency.rdma``, ``regency.job``, ``regency.spmd`` and the tensor engine import the runtime only
from here (``tests/unit/test_import_layers.py`` pins it), so the runtime's folders can change
under them. The first use of :func:`runtime` in the controller's process starts its runtime.

The kernel, for messages that are not actor calls:

- :func:`runtime` -- this process's :class:`ProcRuntime` (the router): its ``address``,
  ``secret``, ``job_id`` and ``transport``; ``open_port``/``close_port`` for a
  :class:`PortHandler` that takes raw replies on the I/O thread; ``send_port`` (pre-encoded
  :class:`Part` s to a :class:`PortRef` anywhere) and ``send_control`` (a request to a service
  of the process at an address, e.g. :data:`SERVICE_HOST`).
- :class:`PeerLostError` -- what a send to a process that is gone raises (the transport's
  error, translated by the router).
- :class:`Pending` -- a reply not yet there, which a :class:`Future` wraps
  (``Future._from_pending``).
- :func:`carry` -- for a value that travels in an actor call as a reference its own layer
  resolves (a mesh tensor): called while the call's arguments are pickled or unpickled, it
  hands the value to the send pipeline and the receiving actor, which pass what was carried to
  the tensor engine (``before_actor_send``, ``bind_arrivals``). :data:`FLAG_ERROR` marks a port
  message whose parts are a pickled exception (an endpoint's error reply). :func:`guard_loads`
  -- what the tensor engine wraps every unpickling that names modules in (no interception, so
  a reply's tensors read inside ``activate()`` are local ones).
- :func:`gateway_toward` / :func:`gateway_ips` -- the controller's listeners that other hosts
  reach it on (RDMA listens there too).

The actor layer:

- :func:`current_context` -- who is running (the actor instance, its rank), booting the runtime.
- :func:`current_client` -- the instance that sends for code outside any actor (the root
  client in the controller), if the runtime was started.
- ``Actor``, ``endpoint``, ``Port``, ``Channel`` and :func:`get_or_spawn_controller`: the
  same objects ``regency.actor`` exports, for ``regency.observe`` alone, which sits below
  ``regency.actor`` (it offers telemetry's and the debugger's names); every other package takes
  the actor API from ``regency.actor``.
- :func:`when_endpoint_finishes` -- a callback for when the endpoint running on this thread
  has finished (the debugger ends a ``pdb`` session with it).
- :func:`mesh_tree` / :func:`find` -- a snapshot of the hosts, procs and actors this controller
  runs, with their states, and one node of it by ``ref``; :func:`stacks_of` -- the stacks of
  procs by address (``regency.observe``'s admin API serves these); :func:`live_proc_addresses`
  -- the live procs this controller spawned.
- :mod:`tracing` -- the runtime's telemetry seam (its ``probe``, the records the hot path
  appends, the current span), :class:`SetTelemetry` -- a proc agent's switch for it,
  :data:`SERVICE_PROC` / :data:`SERVICE_TELEMETRY` -- a proc's agent and the root's telemetry
  intake, :class:`Service` -- a thread that serves requests to a service id,
  :func:`root_address` -- where the root controller is; :data:`SERVICE_TELEMETRY_ROWS` and
  :func:`host_agent_address` -- a host's rows of the job's telemetry tables, and where this
  process's host agent is.

The host layer:

- :func:`proc_log_root` -- where a host keeps its procs' log files (one directory per run).
- :func:`share_secret` -- the secret this process's controller will run with, shared by the
  ranks of a job whose every process is a controller (``regency.spmd.host_mesh_from_store``).
- :class:`Attach` and :func:`serve_worker` / :func:`start_worker` /
  :func:`serve_worker_until_shutdown` -- the worker daemon that ``regency.job`` attaches to.
"""

from __future__ import annotations

from regency._runtime.actors.base.context import current_client
from regency._runtime.actors.base.endpoint_def import Actor, endpoint
from regency._runtime.actors.base.ports import Channel, Port
from regency._runtime.actors.control.control import SetTelemetry
from regency._runtime.actors.meshes.introspect import find, live_proc_addresses, mesh_tree
from regency._runtime.actors.meshes.meshes import (
    HostInfo,
    WorkerLease,
    current_context,
    this_host_mesh,
)
from regency._runtime.actors.meshes.singletons import get_or_spawn_controller
from regency._runtime.actors.observe import tracing
from regency._runtime.actors.observe.breakpoints import when_endpoint_finishes
from regency._runtime.actors.observe.stacks import stacks_of
from regency._runtime.host.controller import share_secret
from regency._runtime.host.output import proc_log_root
from regency._runtime.host.worker_daemon import Attach
from regency._runtime.host.worker_daemon import serve as serve_worker
from regency._runtime.host.worker_daemon import serve_until_shutdown as serve_worker_until_shutdown
from regency._runtime.host.worker_daemon import start as start_worker
from regency._runtime.kernel.codec import carry, guard_loads
from regency._runtime.kernel.errors import PeerLostError
from regency._runtime.kernel.gateways import gateway_ips, gateway_toward
from regency._runtime.kernel.pending import Pending
from regency._runtime.kernel.port_handlers import PortHandler
from regency._runtime.kernel.proc_runtime import ProcRuntime
from regency._runtime.kernel.refs import Part, PortRef
from regency._runtime.kernel.service import Service
from regency._runtime.kernel.state import host_agent_address, root_address, runtime
from regency._runtime.kernel.wire import (
    FLAG_ERROR,
    SERVICE_HOST,
    SERVICE_PROC,
    SERVICE_TELEMETRY,
    SERVICE_TELEMETRY_ROWS,
)

__all__ = [
    "FLAG_ERROR",
    "SERVICE_HOST",
    "SERVICE_PROC",
    "SERVICE_TELEMETRY",
    "SERVICE_TELEMETRY_ROWS",
    "Actor",
    "Attach",
    "Channel",
    "HostInfo",
    "Part",
    "PeerLostError",
    "Pending",
    "Port",
    "PortHandler",
    "PortRef",
    "ProcRuntime",
    "Service",
    "SetTelemetry",
    "WorkerLease",
    "carry",
    "current_client",
    "current_context",
    "endpoint",
    "find",
    "gateway_ips",
    "gateway_toward",
    "get_or_spawn_controller",
    "guard_loads",
    "host_agent_address",
    "live_proc_addresses",
    "mesh_tree",
    "proc_log_root",
    "root_address",
    "runtime",
    "serve_worker",
    "serve_worker_until_shutdown",
    "share_secret",
    "stacks_of",
    "start_worker",
    "this_host_mesh",
    "tracing",
    "when_endpoint_finishes",
]
