"""What the two ends of an ibverbs connection tell each other, and how it travels.

Both messages ride on the owner's authenticated transfer service (:mod:`regency.rdma._protocol`):

* ``IBV_CONNECT``: the reader sends its queue pair's :class:`QpInfo`, the owner connects a queue
  pair of its own to it and answers with that queue pair's ``QpInfo``::

      version u8 | link_layer u8 | mtu u8 | depth u8 | lid u16 | qp_num u32 | psn u32
      | max_msg u32 | gid 16 bytes                                 (34 bytes, little-endian)

  ``depth`` is the number of RDMA READs in flight the sender asks for (reader) or accepts
  (owner); ``mtu`` is an ``enum ibv_mtu`` value; ``gid`` is the port GID in network order.
* ``IBV_KEY``: the reader names a buffer (id and token), the owner registers it with the NIC if
  it has not yet and answers with its :class:`RemoteKey`: ``rkey u32 | address u64 | length
  u64``.

Everything received is validated before it reaches a verbs call.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

VERSION = 1
_QP_INFO = struct.Struct("<BBBBHIII16s")
_KEY = struct.Struct("<IQQ")
QP_INFO_BYTES = _QP_INFO.size
KEY_BYTES = _KEY.size

LINK_LAYER_INFINIBAND = 1
LINK_LAYER_ETHERNET = 2
MTU_MIN = 1  # IBV_MTU_256
MTU_MAX = 5  # IBV_MTU_4096
_U24 = (1 << 24) - 1
_U32 = (1 << 32) - 1
_U64 = (1 << 64) - 1


class QpInfo(NamedTuple):
    """One end of a reliable connection: how to address its queue pair."""

    link_layer: int
    mtu: int
    depth: int
    lid: int
    qp_num: int
    psn: int
    max_msg: int
    gid: bytes

    def pack(self) -> bytes:
        """The wire form (validated first)."""
        check_qp_info(self)
        return _QP_INFO.pack(
            VERSION,
            self.link_layer,
            self.mtu,
            self.depth,
            self.lid,
            self.qp_num,
            self.psn,
            self.max_msg,
            self.gid,
        )

    @classmethod
    def unpack(cls, data: bytes) -> QpInfo:
        """Parse and validate the wire form (``ValueError`` if it is not a valid one)."""
        if len(data) != _QP_INFO.size:
            raise ValueError(f"queue pair info is {len(data)} bytes, expected {_QP_INFO.size}")
        version, *fields = _QP_INFO.unpack(data)
        if version != VERSION:
            raise ValueError(f"queue pair info version {version}, this side speaks {VERSION}")
        info = cls(*fields)
        check_qp_info(info)
        return info


def check_qp_info(info: QpInfo) -> None:
    """Raise ``ValueError`` unless every field is in range for a verbs call."""
    if info.link_layer not in (LINK_LAYER_INFINIBAND, LINK_LAYER_ETHERNET):
        raise ValueError(f"unknown link layer {info.link_layer}")
    if not MTU_MIN <= info.mtu <= MTU_MAX:
        raise ValueError(f"path MTU code {info.mtu} is not an ibv_mtu value")
    if not 1 <= info.depth <= 255:
        raise ValueError(f"RDMA READ depth {info.depth} is outside 1..255")
    if not 0 <= info.lid <= 0xFFFF:
        raise ValueError(f"LID {info.lid} is not a 16-bit value")
    if not 0 < info.qp_num <= _U24:
        raise ValueError(f"queue pair number {info.qp_num} is not a 24-bit value above 0")
    if not 0 <= info.psn <= _U24:
        raise ValueError(f"packet sequence number {info.psn} is not a 24-bit value")
    if not 0 < info.max_msg <= _U32:
        raise ValueError(f"maximum message size {info.max_msg} is outside 1..2**32-1")
    if len(info.gid) != 16:
        raise ValueError(f"a GID has 16 bytes, got {len(info.gid)}")
    if info.link_layer == LINK_LAYER_ETHERNET and not any(info.gid):
        raise ValueError("a RoCE port needs a GID, got ::")
    if info.link_layer == LINK_LAYER_INFINIBAND and info.lid == 0 and not any(info.gid):
        raise ValueError("an InfiniBand port needs a LID or a GID")


class RemoteKey(NamedTuple):
    """What a reader needs to reach a registered buffer: the NIC's key and the region."""

    rkey: int
    address: int
    length: int

    def pack(self) -> bytes:
        """The wire form."""
        if not (0 <= self.rkey <= _U32 and 0 <= self.address <= _U64 and self.length > 0):
            raise ValueError(f"invalid remote key {self}")
        return _KEY.pack(self.rkey, self.address, self.length)

    @classmethod
    def unpack(cls, data: bytes) -> RemoteKey:
        """Parse the wire form (``ValueError`` if it has the wrong size)."""
        if len(data) != _KEY.size:
            raise ValueError(f"remote key is {len(data)} bytes, expected {_KEY.size}")
        return cls(*_KEY.unpack(data))

    def check_covers(self, address: int, nbytes: int) -> None:
        """Raise ``ValueError`` unless the key's region is exactly ``[address, address+nbytes)``.

        The owner registers the region its handle describes; anything else means the answer
        is not about this buffer.
        """
        if (self.address, self.length) != (address, nbytes):
            raise ValueError(
                f"the owner registered {self.length} bytes at {self.address:#x}, but the buffer "
                f"is {nbytes} bytes at {address:#x}"
            )


def gid_text(gid: bytes) -> str:
    """A 16-byte GID in the ``xxxx:xxxx:...`` form (eight groups) that pyverbs' ``GID`` takes."""
    if len(gid) != 16:
        raise ValueError(f"a GID has 16 bytes, got {len(gid)}")
    hexa = gid.hex()
    return ":".join(hexa[i : i + 4] for i in range(0, 32, 4))


def gid_bytes(text: str) -> bytes:
    """The 16 bytes of a GID in the form pyverbs prints (``ValueError`` for anything else)."""
    groups = text.split(":")
    if len(groups) != 8 or any(len(g) != 4 for g in groups):
        raise ValueError(f"not a GID in eight groups of four hex digits: {text!r}")
    return bytes.fromhex("".join(groups))
