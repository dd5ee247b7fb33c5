"""The user's mesh objects: host, proc and actor meshes, endpoints and their send pipeline,
proc control towards host agents, singletons, and the mesh tree that introspection walks."""
