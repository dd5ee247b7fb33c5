"""The ways a transfer moves bytes, and which one it takes.

* :mod:`.choice`: which backends this machine has, the plan a transfer follows, the fallbacks.
* :mod:`.cma`: cross-memory attach (``process_vm_readv``/``writev``), one host.
* :mod:`.shm`: a sealed memfd handed to the owner's transfer service, one host.
* :mod:`.cuda`: CUDA IPC on one host, pinned host staging across hosts.
* :mod:`.stream`: the TCP backend's client, parallel authenticated streams.

The ibverbs backend has its own package, :mod:`regency.rdma._ibverbs`. Nothing is imported here,
so loading one backend loads no other.
"""
