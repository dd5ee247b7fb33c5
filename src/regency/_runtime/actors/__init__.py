"""The actor layer on the kernel: actors, endpoints, meshes and supervision.

Actor and endpoints, the send pipeline, host/proc/actor meshes and spawning, ValueMesh, Future,
ports, the current context, the instance executors, supervision, singletons, the proc agent and
the proc-control requests to host agents. It imports the kernel, never the host layer.
"""
