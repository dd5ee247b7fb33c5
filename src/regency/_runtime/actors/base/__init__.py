"""What every part of the actor layer shares: errors, futures, ports, value meshes, slicing,
the `Actor`/`@endpoint` definitions, and who is running (identity, context)."""
