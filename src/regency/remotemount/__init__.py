"""Remote mounts: Monarch's ``monarch.remotemount`` (see `regency.remotemount.remotemount`)."""

from regency import _public
from regency.remotemount.remotemount import MountHandler, remotemount

__all__ = ["MountHandler", "remotemount"]

_public.publish(__name__, globals())
