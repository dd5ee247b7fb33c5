"""The ibverbs backend: one-sided RDMA READ / WRITE through pyverbs (rdma-core's bindings).

Bottom to top:

* :mod:`.wire`: what the two ends tell each other (queue pair info, remote keys).
* :mod:`.status`: what a failed work completion means.
* :mod:`.load`: importing pyverbs on first use, its errors, its objects across a fork.
* :mod:`.port`: which port and GID this process uses, what two ports agree on.
* :mod:`.probe`: whether this process can use ibverbs at all (probed once).
* :mod:`.plan`: how a transfer is cut into work requests.
* :mod:`.verbs`: the device, queue pairs and memory registrations of this process.
* :mod:`.owner`: the owner's side, run by its transfer service.
* :mod:`.client`: the reader's side: channels to owners and transfers over them.

Nothing is imported here; a process without an RDMA NIC never imports pyverbs.
"""
