"""Jobs: where a controller's hosts come from (Monarch's ``monarch.job``).

A worker daemon (``python -m regency worker --listen tcp://HOST:PORT``) serves a machine as a
host; :func:`attach_to_workers` turns running workers into a ``HostMesh``. Jobs start the workers
for you and cache themselves so a re-run reconnects::

    from regency.job import ProcessJob

    job = ProcessJob({"hosts": 2})
    hosts = job.state().hosts                      # HostMesh of 2 worker hosts
    procs = hosts.spawn_procs(per_host={"gpus": 4})  # {hosts: 2, gpus: 4} procs
    ...
    job.kill()

A job described once in a module is reused by later commands: ``regency apply myjob.job``
starts it, and scripts get it back with :func:`load_current_job` (job contexts). A torchrun
command becomes a job with :func:`regency.job.spmd.serve`.

See ``docs/multihost.md``.
"""

from __future__ import annotations

from regency import _public
from regency.actor._attach import AttachError, attach_to_workers
from regency.actor._worker import (
    run_worker_loop_forever,
    run_worker_loop_until_shutdown,
    start_worker_loop_forever,
    worker_command,
    worker_env,
)
from regency.job._context import load_current_job, set_current_job
from regency.job._errors import JobError
from regency.job._exec import CommandResult, exec_command
from regency.job._forwarder import PortForwarder
from regency.job._hosts_from_config import hosts_from_config
from regency.job._kubernetes import ImageSpec, KubernetesJob
from regency.job._local import LocalJob
from regency.job._process import ProcessJob
from regency.job._shell import shell
from regency.job._slurm import SlurmJob
from regency.job._ssh import SSHJob
from regency.job._trait import (
    DEFAULT_JOB_PATH,
    JobState,
    JobTrait,
    MeshAdminConfig,
    TelemetryConfig,
    job_load,
    job_loads,
)
from regency.job._workspace import Workspace, sync_workspace

__all__ = [
    "DEFAULT_JOB_PATH",
    "AttachError",
    "CommandResult",
    "ImageSpec",
    "JobError",
    "JobState",
    "JobTrait",
    "KubernetesJob",
    "LocalJob",
    "MeshAdminConfig",
    "PortForwarder",
    "ProcessJob",
    "SSHJob",
    "SlurmJob",
    "TelemetryConfig",
    "Workspace",
    "attach_to_workers",
    "exec_command",
    "hosts_from_config",
    "job_load",
    "job_loads",
    "load_current_job",
    "run_worker_loop_forever",
    "run_worker_loop_until_shutdown",
    "set_current_job",
    "shell",
    "start_worker_loop_forever",
    "sync_workspace",
    "worker_command",
    "worker_env",
]

_public.publish(__name__, globals())
