"""The root of regency's errors: catch :class:`RegencyError` for anything regency itself raised.

Every error class regency defines derives from it, and each keeps the built-in (or Monarch)
base it had, so ``except RuntimeError``, ``except ConnectionError``, ``except TimeoutError``
and Monarch's ``except ActorError`` / ``except SupervisionError`` still catch what they caught.
Bad arguments still raise plain ``ValueError`` / ``TypeError``. The tree (``+`` names the other
base each class keeps; a name marked *internal* does not reach user code, it is translated
first)::

    Exception
     └── RegencyError
          ├── ActorError                     an endpoint raised; the actor lives on
          ├── SupervisionError      +RuntimeError   the target actor, proc or host failed
          ├── JobError              +RuntimeError   a job backend (Slurm, SSH, Kubernetes,
          │                                         processes) could not start or reach hosts
          ├── AttachError           +ConnectionError    a worker could not be attached
          ├── UnsafePathError       +PermissionError    a trusted path is not private to the user
          ├── DimensionNotFoundError +KeyError +ValueError   an unknown dimension label
          ├── EmptySliceError       +IndexError +ValueError  a mesh slice that selects nothing
          ├── NotOwnedError         +RuntimeError +ValueError  only a mesh's owner may do that
          ├── NotAnEndpointError    +RuntimeError +AttributeError  not an endpoint of the actor
          ├── RDMAError             +RuntimeError   a one-sided transfer failed
          │    ├── RDMABufferDroppedError           the registration was dropped
          │    ├── RDMAOwnerGoneError               the owner's process is dead or unreachable
          │    ├── RDMABackendError                 the requested backend cannot serve it
          │    └── RDMATimeoutError  +DeadlineError  it did not finish within its timeout
          ├── DeadlineError         +TimeoutError   an operation's deadline passed
          ├── ConnectionClosedError +ConnectionError  a connection closed under an exchange
          ├── PeerUnreachableError  +ConnectionError  internal: the transport cannot reach a peer
          ├── PeerLostError         +ConnectionError  a peer process is gone: the transport's
          │                                           error, translated by the router
          ├── AuthenticationError   +ConnectionError  a peer failed the handshake
          ├── RouteError            +ConnectionError  internal: a bad route preamble
          ├── AddressError          +ValueError     an address regency cannot listen on or dial
          ├── TLSSetupError         +ValueError     unusable TLS material
          ├── FrameTooLargeError    +ValueError     internal: a frame over the size limit
          ├── FrameError                            internal: bytes that are not a frame
          ├── RemoteException                       tensor engine: a command failed on a worker
          ├── DataDependentError    +RuntimeError   tensor engine: a value only workers know
          ├── ScriptExit                            spmd: a script exited with a failure status
          ├── AdminError                            the admin API refused or failed a request
          ├── RankSpecError         +ValueError     debugger: a rank selection it cannot read
          ├── WireError             +ConnectionError   debugger: a bad frame on its socket
          ├── CmaDeniedError        +PermissionError   internal (rdma): cross-memory attach refused
          ├── CmaProcessGoneError   +ProcessLookupError  internal (rdma): the peer process is gone
          ├── CmaBadAddressError    +OSError        internal (rdma): a remote range not mapped
          ├── CudaIpcUnavailableError +RuntimeError internal (rdma): no CUDA IPC here
          ├── IbvUnavailableError   +RuntimeError   internal (rdma): ibverbs cannot be used
          ├── IbvCompletionError    +OSError        internal (rdma): a work completion failed
          └── RemoteRefusedError                    internal (rdma): the owner refused a request

A few private control-flow errors (the CLI's usage errors, the config parser's, the tensor
engine's poisoned input) join it too: ``tests/unit/test_errors.py`` imports every module and
fails on any exception class outside this tree.

Where they live: :mod:`regency.actor` (``ActorError``, ``SupervisionError``), :mod:`regency.job`
(``JobError``, ``AttachError``), :mod:`regency.rdma` (the ``RDMA*`` family),
:mod:`regency.shape` (``DimensionNotFoundError``); the rest are raised by the transport
(``regency._transport``) and reach user code only where its docs say so. Warnings
(``RDMAFallbackWarning`` ...) are ``Warning`` subclasses, not part of this tree.

This module imports nothing, so every layer (transport, runtime, rdma, job, shape) can use it.
"""

from __future__ import annotations


class RegencyError(Exception):
    """Base class of every error regency defines; see the module's tree."""
