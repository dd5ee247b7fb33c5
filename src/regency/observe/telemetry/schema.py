"""The job's telemetry tables: Monarch's names and columns, as users' queries name them.

Every host keeps rows of these tables (:mod:`.rows`); the controller's query engine
(:mod:`.engine`) gathers them and answers SQL over all of them. Ids are 63-bit integers (an
actor's or mesh's id is the same wherever a row names it); ``*_json`` columns hold JSON text;
times are microseconds since the epoch (``timestamp_us``).
"""

from __future__ import annotations

from typing import Final

Column = tuple[str, str]  # (name, SQL type)

TABLES: Final[dict[str, tuple[Column, ...]]] = {
    "actors": (
        ("id", "BIGINT"),
        ("timestamp_us", "BIGINT"),
        ("mesh_id", "BIGINT"),
        ("rank", "BIGINT"),
        ("full_name", "VARCHAR"),
        ("display_name", "VARCHAR"),
    ),
    "meshes": (
        ("id", "BIGINT"),
        ("timestamp_us", "BIGINT"),
        ("class", "VARCHAR"),
        ("given_name", "VARCHAR"),
        ("full_name", "VARCHAR"),
        ("shape_json", "VARCHAR"),
        ("parent_mesh_id", "BIGINT"),
        ("parent_view_json", "VARCHAR"),
    ),
    "actor_status_events": (
        ("id", "BIGINT"),
        ("timestamp_us", "BIGINT"),
        ("actor_id", "BIGINT"),
        ("new_status", "VARCHAR"),
        ("reason", "VARCHAR"),
    ),
    "sent_messages": (
        ("id", "BIGINT"),
        ("timestamp_us", "BIGINT"),
        ("sender_actor_id", "BIGINT"),
        ("actor_mesh_id", "BIGINT"),
        ("view_json", "VARCHAR"),
        ("shape_json", "VARCHAR"),
    ),
    "messages": (
        ("id", "BIGINT"),
        ("timestamp_us", "BIGINT"),
        ("from_actor_id", "BIGINT"),
        ("to_actor_id", "BIGINT"),
        ("endpoint", "VARCHAR"),
        ("port_index", "BIGINT"),
    ),
    "message_status_events": (
        ("id", "BIGINT"),
        ("timestamp_us", "BIGINT"),
        ("message_id", "BIGINT"),
        ("status", "VARCHAR"),
    ),
    "spans": (
        ("id", "BIGINT"),
        ("name", "VARCHAR"),
        ("target", "VARCHAR"),
        ("level", "VARCHAR"),
        ("fields_json", "VARCHAR"),
        ("timestamp_us", "BIGINT"),
        ("parent_id", "BIGINT"),
        ("thread_name", "VARCHAR"),
        ("file", "VARCHAR"),
        ("line", "INTEGER"),
    ),
    "metric_sums": (
        ("name", "VARCHAR"),
        ("timestamp_us", "BIGINT"),
        ("start_timestamp_us", "BIGINT"),
        ("scope_name", "VARCHAR"),
        ("unit", "VARCHAR"),
        ("temporality", "VARCHAR"),
        ("is_monotonic", "BOOLEAN"),
        ("attributes_json", "VARCHAR"),
        ("resource_attributes_json", "VARCHAR"),
        ("sum_f64", "DOUBLE"),
        ("sum_i64", "BIGINT"),
        ("sum_u64", "UBIGINT"),
    ),
    "metric_gauges": (
        ("name", "VARCHAR"),
        ("timestamp_us", "BIGINT"),
        ("start_timestamp_us", "BIGINT"),
        ("scope_name", "VARCHAR"),
        ("unit", "VARCHAR"),
        ("attributes_json", "VARCHAR"),
        ("resource_attributes_json", "VARCHAR"),
        ("value_f64", "DOUBLE"),
        ("value_i64", "BIGINT"),
        ("value_u64", "UBIGINT"),
    ),
    "metric_histograms": (
        ("name", "VARCHAR"),
        ("timestamp_us", "BIGINT"),
        ("start_timestamp_us", "BIGINT"),
        ("scope_name", "VARCHAR"),
        ("unit", "VARCHAR"),
        ("temporality", "VARCHAR"),
        ("attributes_json", "VARCHAR"),
        ("resource_attributes_json", "VARCHAR"),
        ("count", "UBIGINT"),
        ("sum_f64", "DOUBLE"),
        ("min_f64", "DOUBLE"),
        ("max_f64", "DOUBLE"),
        ("bounds_json", "VARCHAR"),
        ("bucket_counts_json", "VARCHAR"),
    ),
    "pyspy_dumps": (
        ("dump_id", "VARCHAR"),
        ("timestamp_us", "BIGINT"),
        ("pid", "INTEGER"),
        ("binary", "VARCHAR"),
        ("proc_ref", "VARCHAR"),
    ),
    "pyspy_stack_traces": (
        ("dump_id", "VARCHAR"),
        ("pid", "INTEGER"),
        ("thread_id", "UBIGINT"),
        ("thread_name", "VARCHAR"),
        ("os_thread_id", "UBIGINT"),
        ("active", "BOOLEAN"),
        ("owns_gil", "BOOLEAN"),
    ),
    "pyspy_frames": (
        ("dump_id", "VARCHAR"),
        ("thread_id", "UBIGINT"),
        ("frame_depth", "INTEGER"),
        ("name", "VARCHAR"),
        ("filename", "VARCHAR"),
        ("module", "VARCHAR"),
        ("short_filename", "VARCHAR"),
        ("line", "INTEGER"),
        ("is_entry", "BOOLEAN"),
    ),
    "pyspy_local_variables": (
        ("dump_id", "VARCHAR"),
        ("thread_id", "UBIGINT"),
        ("frame_depth", "INTEGER"),
        ("name", "VARCHAR"),
        ("addr", "UBIGINT"),
        ("arg", "BOOLEAN"),
        ("repr", "VARCHAR"),
    ),
    # The introspection snapshots (Monarch's names and columns): each capture of the job's
    # tree (root -> hosts -> procs -> actors) is one ``snapshots`` row, its nodes and their
    # parent/child links, and a row per node kind with what that kind says (:mod:`.snapshot`).
    "snapshots": (("snapshot_id", "VARCHAR"), ("snapshot_ts", "BIGINT")),
    "nodes": (
        ("snapshot_id", "VARCHAR"),
        ("node_id", "VARCHAR"),
        ("node_kind", "VARCHAR"),
        ("as_of", "BIGINT"),
    ),
    "children": (
        ("snapshot_id", "VARCHAR"),
        ("parent_id", "VARCHAR"),
        ("child_id", "VARCHAR"),
        ("child_sort_key", "BIGINT"),
        ("is_system", "BOOLEAN"),
        ("is_stopped", "BOOLEAN"),
    ),
    "root_nodes": (
        ("snapshot_id", "VARCHAR"),
        ("node_id", "VARCHAR"),
        ("num_hosts", "BIGINT"),
        ("started_at", "BIGINT"),
        ("started_by", "VARCHAR"),
    ),
    "host_nodes": (
        ("snapshot_id", "VARCHAR"),
        ("node_id", "VARCHAR"),
        ("addr", "VARCHAR"),
        ("host_num_procs", "BIGINT"),
    ),
    "proc_nodes": (
        ("snapshot_id", "VARCHAR"),
        ("node_id", "VARCHAR"),
        ("proc_name", "VARCHAR"),
        ("num_actors", "BIGINT"),
        ("stopped_retention_cap", "BIGINT"),
        ("is_poisoned", "BOOLEAN"),
        ("failed_actor_count", "BIGINT"),
    ),
    "actor_nodes": (
        ("snapshot_id", "VARCHAR"),
        ("node_id", "VARCHAR"),
        ("actor_status", "VARCHAR"),
        ("actor_type", "VARCHAR"),
        ("instance_id", "VARCHAR"),
        ("messages_processed", "BIGINT"),
        ("created_at", "BIGINT"),
        ("last_message_handler", "VARCHAR"),
        ("total_processing_time_us", "BIGINT"),
        ("queue_depth", "BIGINT"),
        ("is_system", "BOOLEAN"),
    ),
    "actor_failures": (
        ("snapshot_id", "VARCHAR"),
        ("node_id", "VARCHAR"),
        ("failure_error_message", "VARCHAR"),
        ("failure_root_cause_actor", "VARCHAR"),
        ("failure_root_cause_name", "VARCHAR"),
        ("failure_occurred_at", "BIGINT"),
        ("failure_is_propagated", "BOOLEAN"),
    ),
    "actor_inbound_orderings": (
        ("snapshot_id", "VARCHAR"),
        ("node_id", "VARCHAR"),
        ("enabled", "BOOLEAN"),
        ("snapshot_complete", "BOOLEAN"),
        ("skipped_session_count", "BIGINT"),
        ("known_session_count", "BIGINT"),
        ("returned_buffered_session_count", "BIGINT"),
        ("returned_buffered_message_count", "BIGINT"),
        ("returned_max_buffered_count", "BIGINT"),
    ),
    "ordering_sessions": (
        ("snapshot_id", "VARCHAR"),
        ("node_id", "VARCHAR"),
        ("session_id", "VARCHAR"),
        ("sender", "VARCHAR"),
        ("last_released_seq", "BIGINT"),
        ("expected_next_seq", "BIGINT"),
        ("buffered_count", "BIGINT"),
        ("oldest_buffered_seq", "BIGINT"),
        ("newest_buffered_seq", "BIGINT"),
    ),
    "resolution_errors": (
        ("snapshot_id", "VARCHAR"),
        ("node_id", "VARCHAR"),
        ("error_code", "VARCHAR"),
        ("error_message", "VARCHAR"),
    ),
}
"""Each table's columns, in order."""

# Tables that only grow with the job's own entities: kept however old (rows of the others
# leave after the retention period). Monarch keeps these too, so a query still joins an old
# message to its actor and mesh.
ENTITY_TABLES: Final = frozenset({"actors", "meshes"})


def check_row(table: str, row: tuple[object, ...]) -> None:
    """Raise ``ValueError`` unless ``row`` has one value per column of ``table``."""
    columns = TABLES.get(table)
    if columns is None:
        raise ValueError(f"no telemetry table named {table!r}; the tables are {sorted(TABLES)}")
    if len(row) != len(columns):
        raise ValueError(
            f"a row of {table} has {len(columns)} columns "
            f"({', '.join(c for c, _ in columns)}), got {len(row)} values"
        )
