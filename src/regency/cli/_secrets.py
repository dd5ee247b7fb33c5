"""The job secret a command proves or serves with: from a file (hex) or the environment."""

from __future__ import annotations

import os

from regency._transport.auth import SECRET_ENV


def read_secret(path: str | None) -> bytes:
    """The job secret, from ``path`` or the environment; ``ValueError`` if there is none."""
    from regency.actor._attach import secret_from_env

    if path is None:
        try:
            secret = secret_from_env()
        except ValueError as exc:
            raise ValueError(f"{exc} (and no --secret-file was given)") from None
        os.environ.pop(SECRET_ENV, None)  # procs and their commands must not inherit it
        return secret
    from regency._transport.auth import check_secret

    with open(path) as f:
        text = f.read().strip()
    try:
        secret = bytes.fromhex(text)
    except ValueError:
        raise ValueError(f"{path} must hold the job secret as a hex string") from None
    return check_secret(secret, f"--secret-file {path}")
