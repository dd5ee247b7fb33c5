"""The official Kubernetes client, imported only when a job needs it.

``pip install 'regency[kubernetes]'`` installs it; without it these raise ``ImportError`` naming
the extra.
"""

from __future__ import annotations

import json
import os
from typing import Any

_MISSING = (
    "KubernetesJob needs the official Kubernetes client, which is not installed: "
    "pip install 'regency[kubernetes]'"
)


def client() -> Any:
    """The ``kubernetes.client`` module, or an ``ImportError`` naming the extra to install."""
    try:
        import kubernetes.client
    except ImportError as exc:
        raise ImportError(_MISSING) from exc
    return kubernetes.client


def api_client(kubeconfig: str | None) -> Any:
    """An ``ApiClient``: in-cluster config in a pod (unless a kubeconfig is named), else one."""
    from kubernetes import config

    k8s = client()
    if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
        configuration = k8s.Configuration()
        load_incluster: Any = config.load_incluster_config  # the client's functions are untyped
        load_incluster(client_configuration=configuration)
        return k8s.ApiClient(configuration)
    from_file: Any = config.new_client_from_config
    return from_file(config_file=kubeconfig)


def model(data: dict[str, Any], type_name: str) -> Any:
    """A client model from its JSON-like dict (camelCase keys, as in a manifest)."""
    api = client().ApiClient()
    try:
        return api.deserialize(json.dumps(data), type_name, "application/json")
    except TypeError:  # clients before the pydantic rewrite take a response object

        class _Response:
            def __init__(self, text: str) -> None:
                self.data = text

        return api.deserialize(_Response(json.dumps(data)), type_name)
