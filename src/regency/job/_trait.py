"""The job model: a declarative spec (:class:`JobTrait`) and the meshes it yields (``JobState``).

A job describes hosts to run on. ``apply()`` makes them exist (starts worker daemons, submits an
allocation); ``state()`` attaches to them and returns one ``HostMesh`` per named mesh. The job
pickles itself (with its secret) to a cache file, so running the same script again reconnects to
the running workers instead of starting new ones.
"""

from __future__ import annotations

import abc
import contextlib
import logging
import os
import pickle
import stat
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from regency import config as settings
from regency._private_paths import (
    UnsafePathError,
    private_dir,
    read_private_file,
    write_private_file,
)
from regency.actor import HostMesh
from regency.observe import AdminServer, start_admin
from regency.observe.telemetry import disable_telemetry, enable_telemetry, query_engine_client
from regency.observe.telemetry.snapshot import PeriodicSnapshots
from regency.observe.telemetry.switch import start_snapshots

DEFAULT_JOB_PATH = ".regency/job_state.pkl"
_STOP_TIMEOUT = 10.0
log = logging.getLogger("regency.job")


@dataclass(frozen=True)
class TelemetryConfig:
    """Monarch's telemetry settings, accepted by :meth:`JobTrait.enable_telemetry`.

    ``state()`` then switches telemetry on (:func:`regency.observe.telemetry.enable_telemetry`)
    in the controller and on every host, keeping spans and metrics for ``retention_secs`` (0:
    the ``telemetry_retention`` setting) in the local recorder, and serves the admin API (its
    ``/v1/telemetry`` routes are ``JobState.telemetry_url``). Every ``snapshot_interval_secs``
    (0: never) the controller captures the job's tree into the snapshot tables (``snapshots``,
    ``nodes``, ...; :mod:`regency.observe.telemetry.snapshot`), the first one interval after
    ``state()``. ``include_dashboard`` and ``dashboard_port`` are recorded and change nothing.
    """

    retention_secs: int = 3600
    include_dashboard: bool = False
    dashboard_port: int = 8265
    snapshot_interval_secs: float = 30.0


@dataclass(frozen=True)
class MeshAdminConfig:
    """Monarch's mesh-admin settings, accepted by :meth:`JobTrait.enable_admin`.

    ``admin_addr`` (``HOST:PORT``; default ``127.0.0.1:0``, any free loopback port) is where
    ``state()`` serves the admin API (:func:`regency.observe.start_admin`); a non-loopback
    address needs ``allow_remote=True``.
    """

    admin_addr: str | None = None
    allow_remote: bool = False


_J = TypeVar("_J", bound="JobTrait")


class JobState:
    """The host meshes of a running job, one attribute per mesh name (``state.trainers``).

    ``query_engine_client``, ``telemetry_url``, ``dashboard_url`` and ``admin_url`` are
    Monarch's service handles. ``admin_url`` is set when the job's admin API is enabled
    (:meth:`JobTrait.enable_admin`), its bearer token being ``admin_token``; ``telemetry_url``
    when telemetry is (:meth:`JobTrait.enable_telemetry`): the admin API's per-endpoint
    statistics route. With telemetry enabled, ``query_engine_client`` runs SQL over the
    whole job's telemetry tables (``.query(sql)``, ``.store_pyspy_dump(...)``; see
    ``docs/introspection.md``); ``query_engine`` stays ``None``, as in Monarch's sidecar mode.
    Regency has no separate dashboard service: ``dashboard_url`` stays ``None``.
    """

    query_engine: Any = None
    query_engine_client: Any = None
    telemetry_url: str | None = None
    dashboard_url: str | None = None
    admin_url: str | None = None
    admin_token: str | None = None

    def __init__(self, meshes: Mapping[str, HostMesh]) -> None:
        self._meshes = dict(meshes)

    def __getattr__(self, name: str) -> HostMesh:
        meshes = self.__dict__.get("_meshes", {})
        try:
            return meshes[name]  # type: ignore[no-any-return]
        except KeyError:
            raise AttributeError(
                f"job has no mesh named {name!r}; its meshes are {sorted(meshes)}"
            ) from None

    def __dir__(self) -> list[str]:
        return sorted({*super().__dir__(), *self._meshes})

    def __repr__(self) -> str:
        return f"JobState({', '.join(sorted(self._meshes))})"


class JobTrait(abc.ABC):
    """A job: where the hosts come from, how to start them, and how to tear them down.

    Subclasses implement ``_create`` (start the worker daemons; may return before they are up),
    ``_running``, ``_worker_addresses`` (mesh name -> ``tcp://IP:PORT`` of each host in rank
    order; may block until known) and ``_kill``; ``_spec`` is what ``can_run`` compares. Every
    worker of a job holds ``secret``, generated here and pickled with the job.
    """

    def __init__(self) -> None:
        self.secret: bytes = os.urandom(32)
        self.apply_id: str | None = None
        self._state: JobState | None = None
        self._attached: list[JobState] = []  # the meshes earlier state() calls returned
        self._admin: AdminServer | None = None  # serving once enable_admin() and state()
        self._telemetry_on = False  # this controller's telemetry, switched on by state()
        self._snapshots: PeriodicSnapshots | None = None  # capturing once state() with telemetry

    # -- lifecycle -----------------------------------------------------------------------------

    def apply(self) -> None:
        """Create the job's hosts unless they are running already; stamp a new ``apply_id``."""
        if not self._running():
            self._create()
        self.apply_id = uuid.uuid4().hex

    @property
    def active(self) -> bool:
        """Whether this job was applied or adopted from a cache (as in Monarch, `kill` keeps it)."""
        return self.apply_id is not None

    def state(self, cached_path: str | Path | None = DEFAULT_JOB_PATH) -> JobState:
        """Attach to the job's hosts, creating them if needed, and return their meshes.

        Every call attaches anew, as Monarch's does: its host meshes are new ones, whose
        ``stop()`` drains only the procs spawned through them.

        With ``cached_path``, a job pickled there by an earlier run is reused when it is still
        running and ``can_run`` this spec (no new allocation); otherwise it is killed, the file
        removed, this job applied and pickled there (mode 0600). A cache file not private to
        this user (owned by another, or group/world-writable) is never unpickled: it raises
        :class:`~regency._private_paths.UnsafePathError`.
        """
        if self._state is not None and self._running():
            self._attached.append(self._state)
            self._state = self._connect()
            return self._state
        path = resolve_cache_link(Path(cached_path)) if cached_path is not None else None
        if self.apply_id is None and path is not None:
            cached = _load_cache(path)
            if cached is not None:
                if cached._running() and cached.can_run(self):
                    self._adopt(cached)
                    self._state = self._connect()
                    return self._state
                cached.kill()
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
        if self.apply_id is None or not self._running():
            self.apply()
        self._state = self._connect()
        if path is not None:
            self.dump(path)
        return self._state

    def kill(self) -> None:
        """Stop this controller's procs on the job's hosts, then tear the hosts down.

        Telemetry that ``state()`` switched on is switched off (what it recorded stays).
        Idempotent.
        """
        states = [*getattr(self, "_attached", ()), self._state]
        self._attached, self._state = [], None
        admin, self._admin = getattr(self, "_admin", None), None
        if admin is not None:
            admin.stop()
        snapshots, self._snapshots = getattr(self, "_snapshots", None), None
        if snapshots is not None:
            snapshots.stop()
        if getattr(self, "_telemetry_on", False):
            self._telemetry_on = False
            disable_telemetry()
        for state in states:
            if state is None:
                continue
            for name, mesh in state._meshes.items():
                if mesh._lease is not None and mesh._lease.shut_down:
                    continue  # HostMesh.shutdown() stopped them already
                try:
                    error = mesh.stop()._wait_quietly(_STOP_TIMEOUT)
                except Exception as exc:
                    error = exc
                if error is not None:  # the hosts go anyway; their procs with them
                    log.warning(
                        "stopping the procs of mesh %r before the kill failed: %s", name, error
                    )
        self._kill()

    telemetry_config: TelemetryConfig | None = None
    admin_config: MeshAdminConfig | None = None

    def enable_telemetry(
        self: _J,
        config: TelemetryConfig | None = None,
        *,
        mesh_admin_config: MeshAdminConfig | None = None,
        **kwargs: Any,
    ) -> _J:
        """Switch telemetry on from ``state()`` on, with the admin API; returns ``self``.

        The settings are built from ``kwargs`` if ``config`` is None; see
        :class:`TelemetryConfig`.
        """
        self.telemetry_config = config if config is not None else TelemetryConfig(**kwargs)
        if mesh_admin_config is not None or self.admin_config is None:
            self.admin_config = mesh_admin_config or MeshAdminConfig()
        return self

    def enable_admin(self: _J, config: MeshAdminConfig | None = None, **kwargs: Any) -> _J:
        """Serve the admin API from ``state()`` on; returns ``self``.

        ``state().admin_url`` is where, and ``state().admin_token`` (derived from the job
        secret: :func:`regency.observe.admin_token`) its bearer token.
        """
        self.admin_config = config if config is not None else MeshAdminConfig(**kwargs)
        return self

    def can_run(self, spec: JobTrait) -> bool:
        """Whether this (running) job can serve ``spec``: same type and same ``_spec()``."""
        return type(spec) is type(self) and spec._spec() == self._spec()

    # -- pickling ------------------------------------------------------------------------------

    def dumps(self) -> bytes:
        """The job, pickled (its secret included: keep it private)."""
        return pickle.dumps(self)

    def dump(self, path: str | Path) -> None:
        """Pickle the job to ``path``: a new file of mode 0600 replacing any file there.

        Missing parent directories are created (mode 0700). A context link (see
        :func:`resolve_cache_link`) is written through, to the context's state file.
        """
        target = resolve_cache_link(Path(path))
        if not target.parent.exists():
            private_dir(target.parent)
        write_private_file(target, self.dumps())

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_state"] = None  # meshes belong to the controller that attached them
        state["_attached"] = []
        state["_admin"] = None  # so does its admin server
        state["_telemetry_on"] = False  # and its telemetry
        state["_snapshots"] = None  # and its snapshot captures
        return state

    # -- hooks ---------------------------------------------------------------------------------

    def _spec(self) -> Any:
        """What ``can_run`` compares: the job's declarative parameters."""
        return None

    def _adopt(self, running: JobTrait) -> None:
        """Take over a running job's identity (secret, workers) found in the cache."""
        self.__dict__.update(running.__getstate__())

    def _connect(self) -> JobState:
        """Attach to every mesh's workers."""
        from regency.actor._attach import attach_to_workers

        telemetry = getattr(self, "telemetry_config", None)
        if telemetry is not None:  # before attaching: the hosts take the controller's settings
            if telemetry.retention_secs > 0:
                settings.configure(telemetry_retention=float(telemetry.retention_secs))
            enable_telemetry()
            self._telemetry_on = True
        state = JobState(
            {
                name: attach_to_workers(
                    addresses,
                    secret=self.secret,
                    name=name,
                    forwarded=self._forwarded(addresses) or None,
                )
                for name, addresses in self._worker_addresses().items()
            }
        )
        config = getattr(self, "admin_config", None)
        if config is not None:
            if getattr(self, "_admin", None) is None:  # a job cached before it had one
                self._admin = start_admin(
                    config.admin_addr or "127.0.0.1:0",
                    secret=self.secret,
                    allow_remote=config.allow_remote,
                )
            assert self._admin is not None
            state.admin_url, state.admin_token = self._admin.url, self._admin.token
            if telemetry is not None:
                state.telemetry_url = f"{self._admin.url}/v1/telemetry/endpoints"
        if telemetry is not None:
            state.query_engine_client = query_engine_client()
            interval = float(telemetry.snapshot_interval_secs)
            if interval > 0 and getattr(self, "_snapshots", None) is None:
                self._snapshots = start_snapshots(interval)
        return state

    def _forwarded(self, addresses: list[str]) -> dict[str, str]:
        """The port forwards to reach ``addresses`` through (worker -> local address).

        Empty unless this controller reaches those workers only that way (see
        ``attach_to_workers(forwarded=)``).
        """
        return {}

    @abc.abstractmethod
    def _create(self) -> None:
        """Start the worker daemons (may return before they are up)."""

    @abc.abstractmethod
    def _running(self) -> bool:
        """Whether the job's workers are (still) running."""

    @abc.abstractmethod
    def _worker_addresses(self) -> dict[str, list[str]]:
        """Mesh name -> ``tcp://IP:PORT`` of each of its hosts, in rank order."""

    @abc.abstractmethod
    def _kill(self) -> None:
        """Tear the workers down."""


def job_loads(data: bytes) -> JobTrait:
    """A job from :meth:`JobTrait.dumps` bytes."""
    job = pickle.loads(data)
    if not isinstance(job, JobTrait):
        raise TypeError(f"expected a pickled regency job, got {type(job).__name__}")
    return job


def job_load(path: str | Path) -> JobTrait:
    """A job from a file written by :meth:`JobTrait.dump`.

    The file is unpickled only when it is a regular file owned by this user that neither group
    nor others may write: otherwise :class:`~regency._private_paths.UnsafePathError` (a file
    another user planted would run their code as this user). A context link is followed
    (:func:`resolve_cache_link`).
    """
    return job_loads(read_private_file(resolve_cache_link(Path(path))))


def resolve_cache_link(path: Path) -> Path:
    """The job cache file ``path`` stands for: the target of a context link, else ``path``.

    ``.regency/job_state.pkl`` is a symlink to ``<context>/state.pkl`` once job contexts are in
    use (``regency apply``, ``regency context``). Only such a link is followed: one owned by
    this user whose target is ``NAME/state.pkl`` in the link's folder. Any other symlink is
    returned as it is, so reading it is refused as before.
    """
    try:
        st = os.lstat(path)
    except OSError:
        return path
    if not stat.S_ISLNK(st.st_mode) or st.st_uid != os.geteuid():
        return path
    target = Path(os.readlink(path))
    parts = target.parts
    if len(parts) != 2 or parts[1] != "state.pkl" or parts[0] in ("/", ".", ".."):
        return path
    return path.parent / target


def _load_cache(path: Path) -> JobTrait | None:
    """The job cached at ``path``, or ``None`` when there is none or it cannot be read.

    A file that is not private to this user raises
    :class:`~regency._private_paths.UnsafePathError`.
    """
    try:
        return job_load(path)
    except FileNotFoundError:
        return None
    except UnsafePathError:
        raise  # never delete or overwrite what another user planted: the user decides
    except Exception:
        # A cache from another version or a torn write: start afresh.
        with contextlib.suppress(OSError):
            path.unlink()
        return None
